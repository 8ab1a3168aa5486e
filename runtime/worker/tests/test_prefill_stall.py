"""While rows decode, the prefill forwards run between two decode steps add up to at most the
padded tokens one prefill forward may take (generation/loop.py `_prefill_pending`, rows.py
`stall_tokens`): a burst of long prompts joining a running batch is prefilled over several token
boundaries, the running rows stepping between them, and every token is still transformers' own."""

from __future__ import annotations

from test_static_decode import hf_greedy, logprob_tokens
from tpu_worker.cancel import CancelToken
from tpu_worker.generation.loop import DecodeLoop


def test_a_burst_of_long_joiners_is_prefilled_between_the_running_rows_steps(shared_worker):
    adapter = shared_worker.served["tiny-gpt2"].adapter
    loop = DecodeLoop("stall-tiny-gpt2", adapter, max_batch=16)
    try:
        rows = loop._batch
        assert rows.stall_tokens == 4 * 128  # tiny-gpt2's largest prefill forward (rows.py prefill_tokens)
        events: list[tuple[str, int]] = []  # ("prefill", its padded tokens) or ("step", 0), in order
        prefill, step = rows.prefill, rows.step

        def counted_prefill(fwd, prompts, room):
            events.append(("prefill", rows.padded_tokens(fwd)))
            return prefill(fwd, prompts, room)

        def counted_step(tokens):
            events.append(("step", 0))
            return step(tokens)

        rows.prefill, rows.step = counted_prefill, counted_step
        # Forwards: 4 × 8 (two short prompts), 1 × 32, then six long prompts as 4 × 128 twice.
        texts = ["a", "b c", "word " * 20] + [f"caller {i} " + "word " * 100 for i in range(6)]
        joiners = [{"texts": [t], "max_new_tokens": 2, "logprobs": 1} for t in texts]
        futures: list = []

        def burst(p, total=None, message=None, delta=None):
            if p == 2:  # the head is decoding: all of them are queued before the next boundary
                futures.extend(loop.submit(adapter.prepare(a, []), CancelToken()) for a in joiners)

        head = {"texts": ["the head request decodes a while"], "max_new_tokens": 24, "stream": True}
        loop.submit(adapter.prepare(head, []), CancelToken(), progress=burst).result(timeout=120)
        results = [f.result(timeout=120).result for f in futures]

        # The prefill forwards between two steps (the first group: the head's own prefill).
        groups: list[list[int]] = [[]]
        for kind, tokens in events:
            if kind == "step":
                groups.append([])
            else:
                groups[-1].append(tokens)
        ran = [g for g in groups[1:] if g]
        assert ran == [[32, 32], [512], [512]], events
        for g in ran:
            assert sum(g) <= rows.stall_tokens, g
        for a, got in zip(joiners, results, strict=True):
            prompt = adapter.prepare(a, []).payload.prompts[0]
            assert logprob_tokens(got)[0] == [adapter.token_text(t) for t in hf_greedy(adapter, prompt, 2)]
    finally:
        loop.close("test over")
