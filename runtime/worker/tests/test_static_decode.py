"""The static-cache decode loop (generation/rows.py StaticRows, generation/slots.py): greedy
tokens equal transformers' own `generate` for every request, whatever joins or leaves the
running batch mid-decode, and the model only ever sees the shapes of its shape plan."""

from __future__ import annotations

import contextlib
import threading

import pytest
import torch

from tpu_worker.cancel import CancelToken
from tpu_worker.generation import rows
from tpu_worker.generation.loop import DecodeLoop

# Prompt lengths across several length buckets; max_new_tokens so that some leave early.
FIRST = {"texts": ["the first request decodes for a long while"], "max_new_tokens": 40, "stream": True}
JOINERS = [
    {"texts": ["a"], "max_new_tokens": 3},
    {"texts": ["a prompt that is longer than the first one, by quite a few tokens " * 2], "max_new_tokens": 9},
    {"texts": ["two prompts", "in one request that joins"], "max_new_tokens": 25},
    {"texts": ["short lived"], "max_new_tokens": 1},
    {"texts": ["the last joiner " * 6], "max_new_tokens": 16},
]
LATE = [{"texts": ["joins once the first joiners have left"], "max_new_tokens": 12}]


def hf_greedy(adapter, prompt: list[int], max_new: int) -> list[int]:
    """transformers' own greedy decode of one unpadded prompt: the reference."""
    ids = torch.tensor([prompt], dtype=torch.long)
    with torch.no_grad():
        out = adapter.eager_model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new,
            do_sample=False,
            pad_token_id=adapter.pad_id,
            eos_token_id=adapter.eos_id,
        )
    return out[0, len(prompt) :].tolist()


def logprob_tokens(result: dict) -> list[list[str]]:
    return [[t["token"] for t in g["logprobs"]] for g in result["generations"]]


@pytest.fixture
def static_loop(shared_worker):
    loops = []

    def make(model):
        adapter = shared_worker.served[model].adapter
        loop = DecodeLoop(f"static-{model}", adapter, max_batch=16)
        loops.append(loop)
        return loop, adapter

    yield make
    for loop in loops:
        loop.close("test over")


@pytest.mark.parametrize("model", ["tiny-gpt2", "tiny-chat"])
def test_greedy_tokens_equal_hf_generate_with_joins_and_leaves(static_loop, model):
    loop, adapter = static_loop(model)
    assert loop.describe()["cache"] == "static"
    calls, futures = [], []

    def join_mid_decode(p, total=None, message=None, delta=None):
        calls.append(p)
        if len(calls) == 3:  # the first request is decoding: these join at the next boundary
            futures.extend(loop.submit(adapter.prepare({**a, "logprobs": 1}, []), CancelToken()) for a in JOINERS)
        if len(calls) == 20:  # the short joiners have left: this one takes a freed slot
            futures.extend(loop.submit(adapter.prepare({**a, "logprobs": 1}, []), CancelToken()) for a in LATE)

    steps, joins = loop.stats.steps, loop.stats.joins
    head = loop.submit(adapter.prepare({**FIRST, "logprobs": 1}, []), CancelToken(), progress=join_mid_decode)
    results = [head.result(timeout=120).result] + [f.result(timeout=120).result for f in futures]
    assert len(results) == 1 + len(JOINERS) + len(LATE)
    assert loop.stats.joins - joins == len(JOINERS) + len(LATE)
    for args, got in zip([FIRST, *JOINERS, *LATE], results, strict=True):
        prompts = adapter.prepare(args, []).payload.prompts
        for prompt, g, toks in zip(prompts, got["generations"], logprob_tokens(got), strict=True):
            want = hf_greedy(adapter, prompt, args["max_new_tokens"])
            assert toks == [adapter.token_text(t) for t in want], args
            assert g["usage"]["completion_tokens"] == len(want)
            assert g["text"] == adapter.decode(want)
    # The batch decoded together: far fewer steps than the requests one by one.
    assert loop.stats.steps - steps < sum(a["max_new_tokens"] * len(a["texts"]) for a in [FIRST, *JOINERS, *LATE])
    assert loop.stats.running == 0


def test_the_joiners_of_a_boundary_are_prefilled_one_forward_per_length_bucket_shortest_first(static_loop):
    """Five requests joining at one token boundary, over three length buckets: three prefill
    forwards (batch bucket × length bucket), shortest bucket first, each answered in a reply pass
    of its own (its first tokens leave before the next forward runs), and every token HF
    generate's; each answer says where its time to first token went."""
    loop, adapter = static_loop("tiny-gpt2")
    passes: list[str] = []  # one entry per reply pass the loop opened

    @contextlib.contextmanager
    def reply_pass():
        passes.append("open")
        yield

    loop.reply_scope = reply_pass
    texts = ["a", "word " * 100, "b c", "word " * 20, "word " * 110]  # buckets 8, 128, 8, 32, 128
    joiners = [{"texts": [t], "max_new_tokens": 1, "logprobs": 1} for t in texts]
    answered: dict[int, int] = {}  # joiner -> the reply pass its answer was set in
    futures: list = []
    before = dict(adapter.shapes.seen)

    def join_at_once(p, total=None, message=None, delta=None):
        if p == 2:  # the head is decoding: all five are queued before the next boundary
            for i, a in enumerate(joiners):
                f = loop.submit(adapter.prepare(a, []), CancelToken())
                f.add_done_callback(lambda _, i=i: answered.setdefault(i, len(passes)))
                futures.append(f)

    head = {"texts": ["the head request decodes a while"], "max_new_tokens": 12, "stream": True}
    loop.submit(adapter.prepare(head, []), CancelToken(), progress=join_at_once).result(timeout=120)
    results = [f.result(timeout=120).result for f in futures]
    ran = {k: n - before.get(k, 0) for k, n in adapter.shapes.seen.items() if n > before.get(k, 0)}
    prefills = {k: n for k, n in ran.items() if k[0] == "prefill" and k != ("prefill", 1, 8)}
    # The head's own prefill is (1, 8); the joiners': (4, 8), (4, 128), (1, 32), once each (two
    # prompts run at the prefill batch bucket 4).
    assert prefills == {("prefill", 4, 8): 1, ("prefill", 4, 128): 1, ("prefill", 1, 32): 1}, ran
    # Shortest length bucket first (8, 32, 128), one reply pass per forward.
    assert answered[0] == answered[2] < answered[3] < answered[1] == answered[4], answered
    parts = [r["ttft_parts"] for r in results]
    assert [p["forwards_ahead"] for p in parts] == [0, 2, 0, 1, 2]
    assert [p["prefill_shape"] for p in parts] == [
        "prefill 4x8",
        "prefill 4x128",
        "prefill 4x8",
        "prefill 1x32",
        "prefill 4x128",
    ]
    for p, r in zip(parts, results, strict=True):
        assert p["queue_ms"] + p["behind_ms"] + p["prefill_ms"] == pytest.approx(r["ttft_ms"], abs=0.01)
        assert p["steps_waited"] in (0, 1)  # taken at the boundary after the step it arrived in
    assert parts[1]["behind_ms"] > parts[3]["behind_ms"] > parts[0]["behind_ms"]
    for a, got in zip(joiners, results, strict=True):
        prompt = adapter.prepare(a, []).payload.prompts[0]
        assert logprob_tokens(got)[0] == [adapter.token_text(t) for t in hf_greedy(adapter, prompt, 1)]


def test_a_request_that_arrives_during_a_boundarys_prefills_joins_before_the_next_decode_step(static_loop):
    """A request submitted while the joiners of a boundary are being prefilled is taken and
    prefilled at the same boundary, not after the next decode step; its tokens stay HF's."""
    loop, adapter = static_loop("tiny-gpt2")
    first = {"texts": ["a joiner " * 20], "max_new_tokens": 4, "logprobs": 1}
    late = {"texts": ["arrives during the joiner's prefill"], "max_new_tokens": 6, "logprobs": 1}
    futures: list = []
    armed: list[bool] = []
    prefill = loop._batch.prefill

    def prefill_then_submit(fwd, prompts, room):
        out = prefill(fwd, prompts, room)
        if armed and len(futures) == 1:  # the joiner's forward ran: the late one arrives now
            futures.append(loop.submit(adapter.prepare(late, []), CancelToken()))
        return out

    loop._batch.prefill = prefill_then_submit

    def join(p, total=None, message=None, delta=None):
        if p == 2:
            futures.append(loop.submit(adapter.prepare(first, []), CancelToken()))
            armed.append(True)

    head = {"texts": ["the head request decodes a while"], "max_new_tokens": 12, "stream": True}
    loop.submit(adapter.prepare(head, []), CancelToken(), progress=join).result(timeout=120)
    results = [f.result(timeout=120).result for f in futures]
    assert len(results) == 2
    assert results[1]["ttft_parts"]["steps_waited"] == 0, results[1]["ttft_parts"]
    for a, got in zip([first, late], results, strict=True):
        prompt = adapter.prepare(a, []).payload.prompts[0]
        want = hf_greedy(adapter, prompt, a["max_new_tokens"])
        assert logprob_tokens(got)[0] == [adapter.token_text(t) for t in want]


def test_a_burst_of_short_joiners_is_one_forward_at_the_batch_bucket(static_loop):
    loop, adapter = static_loop("tiny-gpt2")
    futures: list = []
    before = dict(adapter.shapes.seen)
    joiners = [{"texts": [f"caller {i}"], "max_new_tokens": 3, "logprobs": 1} for i in range(11)]

    def burst(p, total=None, message=None, delta=None):
        if p == 2:
            futures.extend(loop.submit(adapter.prepare(a, []), CancelToken()) for a in joiners)

    head = {"texts": ["the head request decodes a while"], "max_new_tokens": 12, "stream": True}
    loop.submit(adapter.prepare(head, []), CancelToken(), progress=burst).result(timeout=120)
    results = [f.result(timeout=120).result for f in futures]
    ran = {k: n - before.get(k, 0) for k, n in adapter.shapes.seen.items() if n > before.get(k, 0)}
    # Eleven prompts of one length bucket: one forward at the batch bucket that holds them (16).
    assert {k: n for k, n in ran.items() if k[0] == "prefill" and k[1] > 1} == {("prefill", 16, 8): 1}, ran
    for a, got in zip(joiners, results, strict=True):
        prompt = adapter.prepare(a, []).payload.prompts[0]
        assert logprob_tokens(got)[0] == [adapter.token_text(t) for t in hf_greedy(adapter, prompt, 3)]


def test_a_burst_of_long_joiners_is_several_forwards_within_the_prefill_token_budget(static_loop):
    """Six prompts of the longest bucket (128) joining at once: not one forward at batch 16 (whose
    every row waits for all 16 rows), but forwards of at most 4 × 128 padded tokens, in the order
    they came, the first four's first tokens out before the last two's forward runs."""
    loop, adapter = static_loop("tiny-gpt2")
    assert loop._batch.prefill_tokens == 4 * 128
    passes: list[str] = []

    @contextlib.contextmanager
    def reply_pass():
        passes.append("open")
        yield

    loop.reply_scope = reply_pass
    joiners = [{"texts": [f"caller {i} " + "word " * 100], "max_new_tokens": 1, "logprobs": 1} for i in range(6)]
    futures: list = []
    answered: dict[int, int] = {}
    before = dict(adapter.shapes.seen)

    def burst(p, total=None, message=None, delta=None):
        if p == 2:
            for i, a in enumerate(joiners):
                f = loop.submit(adapter.prepare(a, []), CancelToken())
                f.add_done_callback(lambda _, i=i: answered.setdefault(i, len(passes)))
                futures.append(f)

    head = {"texts": ["the head request decodes a while"], "max_new_tokens": 12, "stream": True}
    loop.submit(adapter.prepare(head, []), CancelToken(), progress=burst).result(timeout=120)
    results = [f.result(timeout=120).result for f in futures]
    ran = {k: n - before.get(k, 0) for k, n in adapter.shapes.seen.items() if n > before.get(k, 0)}
    assert {k: n for k, n in ran.items() if k[0] == "prefill" and k[2] == 128} == {("prefill", 4, 128): 2}, ran
    assert [r["ttft_parts"]["forwards_ahead"] for r in results] == [0, 0, 0, 0, 1, 1]
    assert max(answered[i] for i in range(4)) < min(answered[i] for i in (4, 5)), answered
    for a, got in zip(joiners, results, strict=True):
        prompt = adapter.prepare(a, []).payload.prompts[0]
        assert logprob_tokens(got)[0] == [adapter.token_text(t) for t in hf_greedy(adapter, prompt, 1)]


def test_a_long_run_moves_the_cache_columns_and_keeps_the_tokens(static_loop):
    """The shared column reaches the cache's end: every slot moves left, tokens unchanged."""
    loop, adapter = static_loop("tiny-gpt2")
    long = {"texts": ["word " * 100], "max_new_tokens": 64, "stream": True, "logprobs": 1}
    late = {"texts": ["a late joiner"], "max_new_tokens": 40, "logprobs": 1}
    calls, futures = [], []

    def join_late(p, total=None, message=None, delta=None):
        calls.append(p)
        if len(calls) == 50:
            futures.append(loop.submit(adapter.prepare(late, []), CancelToken()))

    head = loop.submit(adapter.prepare(long, []), CancelToken(), progress=join_late)
    results = [head.result(timeout=120).result, futures[0].result(timeout=120).result]
    assert loop._batch.slots.shifts >= 1
    for args, got in zip([long, late], results, strict=True):
        prompt = adapter.prepare(args, []).payload.prompts[0]
        want = hf_greedy(adapter, prompt, args["max_new_tokens"])
        assert logprob_tokens(got)[0] == [adapter.token_text(t) for t in want]


def test_a_small_cache_keeps_moving_under_many_joins_and_the_tokens_stay_the_same(catalog, cpu_probe):
    """A cache of 24 columns (max_seq_len 16 + max_new_tokens 8), 2 slots: the shared column
    reaches the end while requests join, so every join moves the running slots."""
    import json

    from conftest import BUILTIN_CATALOG
    from tpu_worker.catalog import parse_catalog
    from tpu_worker.ops import OpContext, Worker

    with open(BUILTIN_CATALOG, encoding="utf-8") as fh:
        data = json.load(fh)
    for m in data["models"]:
        if m["id"] == "tiny-gpt2":
            m["limits"].update(max_batch=2, max_seq_len=16, max_new_tokens=8)
            m["batching"]["max_batch"] = 2
    w = Worker(parse_catalog(data, BUILTIN_CATALOG), cpu_probe)
    try:
        w.handle("load", {"model": "tiny-gpt2"}, [], OpContext("l"))
        m = w.served["tiny-gpt2"]
        rng = __import__("random").Random(5)
        requests = [
            {"texts": [" ".join(["word"] * rng.randint(1, 30))], "max_new_tokens": rng.randint(1, 8), "logprobs": 1}
            for _ in range(16)
        ]
        futures = [m.batcher.submit(m.adapter.prepare(a, []), CancelToken()) for a in requests]
        for args, f in zip(requests, futures, strict=True):
            got = f.result(timeout=120).result
            prompt = m.adapter.prepare(args, []).payload.prompts[0]
            want = hf_greedy(m.adapter, prompt, args["max_new_tokens"])
            assert logprob_tokens(got)[0] == [m.adapter.token_text(t) for t in want]
        assert m.batcher._batch.slots.shifts >= 2 and m.batcher.stats.joins >= 1
    finally:
        w.close()


def test_a_join_when_the_shared_column_is_at_the_end_moves_left_then_right(shared_worker):
    """The shared column at the cache's end and a joiner longer than what is left before it
    after the move left: the running slot moves left, then right, and keeps its columns."""
    from tpu_worker.generation.slots import SlotCache

    adapter = shared_worker.served["tiny-gpt2"].adapter
    s = SlotCache(adapter.eager_model, slots=2, length=24, buckets=(1, 2), dtype=torch.float32, device="cpu")
    s.column = 24
    s.mask[0, 14:24] = 1  # a running slot using the last 10 columns
    s.first[0] = 14  # and the host's record of its first column (make_room reads nothing from the device)
    s.keys[0][0, :, 14:24] = 7.0
    s.make_room(16, 1)
    assert s.column >= 16
    assert int(s.mask[0].sum()) == 10 and bool(s.mask[0, s.column - 10 : s.column].all())
    assert bool((s.keys[0][0, :, s.column - 10 : s.column] == 7.0).all())


def test_every_forward_is_a_shape_of_the_plan(static_loop):
    loop, adapter = static_loop("tiny-gpt2")
    adapter.shapes.seen.clear()
    plan = set(adapter.plan.forward_shapes())
    requests = [
        {"texts": [f"caller {i} " + "word " * (i * 7 % 40)], "max_new_tokens": 1 + (i * 5) % 20} for i in range(12)
    ]
    threads = [
        threading.Thread(target=lambda a=a: loop.submit(adapter.prepare(a, []), CancelToken()).result(timeout=120))
        for a in requests
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seen = set(adapter.shapes.seen)
    assert seen and seen <= plan, seen - plan
    decode_batches = {b for kind, b, _ in seen if kind == "decode"}
    assert decode_batches <= set(adapter.plan.batches)
    report = adapter.shapes.report()
    assert 0 < report["real_to_padded"] <= 1 and report["distinct_shapes"] == len(seen)
    assert report["padding_waste"] == pytest.approx(1 - report["real_to_padded"], abs=1e-3)


def test_a_model_whose_cache_cannot_be_static_keeps_the_dynamic_loop_and_says_why(shared_worker, monkeypatch):
    monkeypatch.setattr(rows, "static_cache_problem", lambda model: "its attention layers use sliding windows")
    adapter = shared_worker.served["tiny-gpt2"].adapter
    loop = DecodeLoop("dynamic-tiny-gpt2", adapter, max_batch=16)
    try:
        d = loop.describe()
        assert d["cache"] == "dynamic" and d["cache_reason"] == "its attention layers use sliding windows"
        r = loop.submit(adapter.prepare({"texts": ["hi"], "max_new_tokens": 5}, []), CancelToken()).result(60).result
        prompt = adapter.prepare({"texts": ["hi"]}, []).payload.prompts[0]
        assert r["generations"][0]["text"] == adapter.decode(hf_greedy(adapter, prompt, 5))
    finally:
        loop.close("test over")


def test_the_loaded_model_reports_its_plan_and_cache(shared_worker):
    from tpu_worker.ops import OpContext

    status, _ = shared_worker.handle("status", {}, [], OpContext("st"))
    (m,) = [m for m in status["loaded"] if m["model"] == "tiny-gpt2"]
    assert m["batching"]["cache"] == "static"
    assert m["shape_plan"]["batch_buckets"] == [1, 2, 4, 8, 16]
    assert m["shape_plan"]["length_buckets"] == [8, 16, 32, 64, 128]
    assert "distinct_shapes" in m["shapes"]
    described, _ = shared_worker.handle("describe", {}, [], OpContext("d"))
    (d,) = [m for m in described["models"] if m["id"] == "tiny-gpt2"]
    # 3 prefill batches × 5 lengths, 3 × 4 behind a cached prefix, 5 decode batches × 6 windows
    # (the 5 lengths and the whole cache, 128 + 64 columns).
    assert d["serving"]["cache"] == "static" and d["shape_plan"]["size"] == 57
    assert d["shape_plan"]["decode_length_buckets"] == [8, 16, 32, 64, 128, 192]
