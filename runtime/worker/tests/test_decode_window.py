"""A static decode step attends over the smallest of the plan's decode lengths that holds its
longest running row (generation/slots.py), not the whole slot: once a long row leaves, the
rows left move back to column 0 and the steps run at a small window, tokens unchanged."""

from __future__ import annotations

import pytest
import torch

from test_static_decode import hf_greedy, logprob_tokens
from tpu_worker.cancel import CancelToken
from tpu_worker.generation.loop import DecodeLoop
from tpu_worker.generation.slots import SlotCache

LONG = {"texts": ["word " * 100], "max_new_tokens": 4, "stream": True, "logprobs": 1}
SHORT = {"texts": ["hi"], "max_new_tokens": 40, "logprobs": 1}


@pytest.fixture
def loop_of(shared_worker):
    adapter = shared_worker.served["tiny-gpt2"].adapter
    loop = DecodeLoop("window-tiny-gpt2", adapter, max_batch=16)
    yield loop, adapter
    loop.close("test over")


def test_after_a_long_row_leaves_the_steps_attend_over_the_short_rows_window(loop_of):
    loop, adapter = loop_of
    plan = adapter.plan
    long_len = len(adapter.prepare(LONG, []).payload.prompts[0])
    assert plan.decode_length(long_len + 1) == 128  # the long row's steps need 128 columns
    futures = []

    def join_on_first_token(p, total=None, message=None, delta=None):
        if not futures:
            futures.append(loop.submit(adapter.prepare(SHORT, []), CancelToken()))

    adapter.shapes.seen.clear()
    head = loop.submit(adapter.prepare(LONG, []), CancelToken(), progress=join_on_first_token)
    results = [head.result(timeout=120).result, futures[0].result(timeout=120).result]
    for args, got in zip([LONG, SHORT], results, strict=True):
        prompt = adapter.prepare(args, []).payload.prompts[0]
        want = hf_greedy(adapter, prompt, args["max_new_tokens"])
        assert logprob_tokens(got)[0] == [adapter.token_text(t) for t in want]
    decode = {(b, n): k for (kind, b, n), k in adapter.shapes.seen.items() if kind == "decode"}
    assert any(b >= 2 for b, _ in decode), decode  # the two rows did decode together
    # At most the long row's 3 decode steps attend over 128 columns; the short row's 40 tokens fit
    # 64, so every step after the long row left runs at a window of at most 64 columns.
    wide = sum(k for (_, n), k in decode.items() if n >= 128)
    assert wide <= LONG["max_new_tokens"] - 1, decode
    assert sum(k for (_, n), k in decode.items() if n <= 64) >= SHORT["max_new_tokens"] - LONG["max_new_tokens"]
    assert {n for _, n in decode} <= set(plan.decode_lengths)


def test_a_step_views_the_cache_at_the_smallest_window_holding_the_longest_row(shared_worker):
    adapter = shared_worker.served["tiny-gpt2"].adapter
    s = SlotCache(
        adapter.eager_model, slots=2, length=24, buckets=(1, 2), dtype=torch.float32, device="cpu", windows=(8, 16)
    )
    heads = s.keys[0].shape[1]
    dim = s.keys[0].shape[-1]

    def prompt(n: int, fill: float):
        k = [torch.full((1, heads, n, dim), fill) for _ in s.keys]
        return k, [t.clone() for t in k], torch.ones(n, dtype=torch.long), torch.tensor([n - 1])

    s.make_room(10, 0)
    k, v, m, p = prompt(10, 1.0)
    s.write(0, k, v, 0, m, p, 10)
    s.make_room(3, 1)
    k, v, m, p = prompt(3, 2.0)
    s.write(1, k, v, 0, m, p, 3)
    cache, mask, _, column = s.step(2, 2)
    assert mask.shape == (2, 1, 1, 16) and int(column) == 10  # the 10-token row and its new column: 11 > 8
    assert cache.layers[0].keys.shape[2] == 16 and cache.layers[0].max_cache_len == 16
    s.move(1, 0)  # the long row leaves: the short one takes slot 0
    cache, mask, _, column = s.step(1, 1)
    # The short row (3 prompt columns and 1 written) moved to column 0: 5 columns, window 8.
    assert mask.shape == (1, 1, 1, 8) and int(column) == 4
    assert int(s.mask[0].sum()) == 5 and int((mask[0, 0, 0] == 0).sum()) == 5
    assert bool((s.keys[0][0, :, :3] == 2.0).all())
