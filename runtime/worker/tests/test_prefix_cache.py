"""The prefix cache (generation/prefix.py) and its use by the static decode loop
(generation/rows.py): bounded in bytes and evicted least recently used, partitioned by the
caller's key, and invisible in the tokens: greedy outputs are the same with and without reuse,
and the same as transformers' own generate, with joins and leaves mid-decode."""

from __future__ import annotations

import pytest
import torch

from test_static_decode import hf_greedy, logprob_tokens
from tpu_worker.cancel import CancelToken
from tpu_worker.generation.loop import DecodeLoop
from tpu_worker.generation.prefix import PrefixCache

SYSTEM = "You are a careful assistant. Answer in one short sentence and cite nothing. " * 2


def block_reader(value: float, heads: int = 2, block: int = 4, dim: int = 3, layers: int = 2):
    """A read function for store(): every block's keys and values filled with `value`."""

    def read(i):
        t = torch.full((heads, block, dim), value + i)
        return [t] * layers, [t] * layers

    return read


BLOCK_BYTES = 2 * 2 * 2 * 4 * 3 * 4  # (keys + values) x layers x heads x block x dim x float32


def test_the_cache_keeps_at_most_max_bytes_and_evicts_the_least_recently_used():
    cache = PrefixCache(max_bytes=5 * BLOCK_BYTES, block=4)
    a, b, c = list(range(0, 9)), list(range(100, 109)), list(range(200, 209))  # 2 blocks each
    cache.store("p", a, block_reader(1.0))
    cache.store("p", b, block_reader(2.0))
    assert cache.bytes == 4 * BLOCK_BYTES
    assert len(cache.lookup("p", a)) == 2  # a is now more recent than b
    cache.store("p", c, block_reader(3.0))
    assert cache.bytes <= cache.max_bytes
    assert cache.stats.evicted_blocks == 1
    # b's tail went first (a chain is touched from its end, so its first block outlives it).
    assert len(cache.lookup("p", b)) == 1 and len(cache.lookup("p", a)) == 2 and len(cache.lookup("p", c)) == 2
    got = cache.lookup("p", a)
    assert float(got[1].keys[0][0, 0, 0]) == 2.0  # block 1 of a: value 1.0 + index 1


def test_a_block_larger_than_the_bound_is_not_kept():
    cache = PrefixCache(max_bytes=BLOCK_BYTES - 1, block=4)
    cache.store("p", list(range(9)), block_reader(1.0))
    assert cache.bytes == 0 and cache.lookup("p", list(range(9))) == []


def test_blocks_are_found_only_behind_the_same_tokens_and_never_for_the_last_token():
    cache = PrefixCache(max_bytes=10**6, block=4)
    cache.store("p", list(range(8)), block_reader(1.0))  # 8 tokens: only block 0 (the last token stays)
    assert len(cache.lookup("p", list(range(12)))) == 1
    assert cache.lookup("p", [99, *range(1, 12)]) == []  # a different first token: nothing
    assert len(cache.lookup("p", [*range(4), 7, 7, 7, 7, 7])) == 1


def test_a_hash_collision_cannot_return_another_prompts_block():
    cache = PrefixCache(max_bytes=10**6, block=4)
    cache._chain = lambda partition, tokens, blocks: [b"collides"] * blocks  # every key the same
    cache.store("p", list(range(9)), block_reader(1.0))
    assert cache.lookup("p", list(range(100, 109))) == []  # same key, other tokens: not found
    assert len(cache.lookup("p", list(range(9)))) == 1


def test_partitions_are_isolated():
    cache = PrefixCache(max_bytes=10**6, block=4)
    tokens = list(range(20))
    cache.store("alice", tokens, block_reader(1.0))
    assert len(cache.lookup("alice", tokens)) == 4
    assert cache.lookup("bob", tokens) == []
    assert cache.lookup("", tokens) == []


@pytest.fixture
def loops(shared_worker):
    made = []

    def make(model, *, reuse: bool):
        adapter = shared_worker.served[model].adapter
        loop = DecodeLoop(f"prefix-{model}-{reuse}", adapter, max_batch=16)
        if not reuse:
            loop._batch.prefix = None
        made.append(loop)
        return loop, adapter

    yield make
    for loop in made:
        loop.close("test over")


def run(loop, adapter, args: dict) -> dict:
    return loop.submit(adapter.prepare(args, []), CancelToken()).result(timeout=120).result


def scramble(loop) -> None:
    """What a slot held before is arbitrary: random keys and values in every slot (a prompt behind
    a cached prefix must get the cached ones from the cache, not from its slot's last occupant)."""
    slots = loop._batch.slots
    for t in [*slots.keys, *slots.values]:
        t.normal_()


def logprob_values(result: dict) -> list[float]:
    return [t["logprob"] for g in result["generations"] for t in g["logprobs"]]


QUESTIONS = ["what is two and two?", "name a colour", "say hello to a friend of mine", "x"]


@pytest.mark.parametrize("model", ["tiny-gpt2", "tiny-chat"])
def test_greedy_outputs_are_identical_with_and_without_reuse_and_the_second_call_hits(loops, model):
    reuse, adapter = loops(model, reuse=True)
    plain, _ = loops(model, reuse=False)
    for i, q in enumerate(QUESTIONS):
        args = {"texts": [SYSTEM + q], "max_new_tokens": 24, "logprobs": 1, "prefix_key": "alice"}
        scramble(reuse)
        a, b = run(reuse, adapter, args), run(plain, adapter, args)
        assert a["texts"] == b["texts"] and logprob_tokens(a) == logprob_tokens(b), q
        # The same numbers too, up to float32 rounding of a different order of work.
        assert logprob_values(a) == pytest.approx(logprob_values(b), abs=1e-4), q
        prompt = adapter.prepare(args, []).payload.prompts[0]
        assert logprob_tokens(a)[0] == [adapter.token_text(t) for t in hf_greedy(adapter, prompt, 24)]
        assert b["prefix_cached_tokens"] == 0
        if i == 0:
            assert a["prefix_cached_tokens"] == 0  # the first call fills the cache
        else:
            cached = a["prefix_cached_tokens"]
            assert cached > 0 and cached % 16 == 0 and cached < len(prompt)
            assert a["generations"][0]["prefix_cached_tokens"] == cached
    report = reuse.prefix_report()
    assert report["hits"] == len(QUESTIONS) - 1 and 0 < report["bytes"] <= report["max_bytes"]
    assert report["hit_rate"] == pytest.approx((len(QUESTIONS) - 1) / len(QUESTIONS), abs=1e-3)


def test_another_partition_gets_nothing_from_the_cache(loops):
    loop, adapter = loops("tiny-gpt2", reuse=True)
    args = {"texts": [SYSTEM + "first"], "max_new_tokens": 4}
    run(loop, adapter, {**args, "prefix_key": "alice"})
    assert run(loop, adapter, {**args, "prefix_key": "alice"})["prefix_cached_tokens"] > 0
    assert run(loop, adapter, {**args, "prefix_key": "bob"})["prefix_cached_tokens"] == 0
    assert run(loop, adapter, args)["prefix_cached_tokens"] == 0  # no key: a partition of its own


def test_joiners_behind_a_cached_prefix_join_and_leave_mid_decode_with_the_same_tokens(loops):
    """A long request decodes; requests sharing its prefix join at token boundaries (prefilled
    behind the cached prefix, into free slots) and leave early: every token equals HF's."""
    loop, adapter = loops("tiny-gpt2", reuse=True)
    first = {"texts": [SYSTEM + "the first caller decodes for long"], "max_new_tokens": 40, "stream": True}
    joiners = [{"texts": [SYSTEM + q], "max_new_tokens": 2 + 5 * i} for i, q in enumerate(QUESTIONS)]
    futures, calls = [], []

    def join_mid_decode(p, total=None, message=None, delta=None):
        calls.append(p)
        if len(calls) == 3:
            futures.extend(loop.submit(adapter.prepare({**a, "logprobs": 1}, []), CancelToken()) for a in joiners)

    joins = loop.stats.joins
    head = loop.submit(adapter.prepare({**first, "logprobs": 1}, []), CancelToken(), progress=join_mid_decode)
    results = [head.result(timeout=120).result] + [f.result(timeout=120).result for f in futures]
    assert loop.stats.joins - joins == len(joiners)
    assert all(r["prefix_cached_tokens"] > 0 for r in results[1:])
    for args, got in zip([first, *joiners], results, strict=True):
        prompt = adapter.prepare(args, []).payload.prompts[0]
        want = hf_greedy(adapter, prompt, args["max_new_tokens"])
        assert logprob_tokens(got)[0] == [adapter.token_text(t) for t in want], args
    assert loop.stats.running == 0


def test_joiners_behind_cached_prefixes_are_prefilled_together_per_length_bucket(loops):
    """Joiners of one token boundary whose prefixes are cached run in one forward per length
    bucket of their uncached rests (at a prefill batch bucket of the plan, not one forward
    each), with the same tokens as a loop without the cache and as HF generate."""
    loop, adapter = loops("tiny-gpt2", reuse=True)
    plain, _ = loops("tiny-gpt2", reuse=False)
    run(loop, adapter, {"texts": [SYSTEM + "fills the cache"], "max_new_tokens": 1, "prefix_key": "k"})
    joiners = [
        {"texts": [SYSTEM + q], "max_new_tokens": 3 + 2 * i, "logprobs": 1, "prefix_key": "k"}
        for i, q in enumerate(QUESTIONS)
    ]
    plan = adapter.plan
    payloads = [adapter.prepare(a, []).payload for a in joiners]
    prompts = [g.prompts[0] for g in payloads]
    # What the cache holds now decides the forwards: those behind cached prefixes, per bucket.
    expected = [f for f in loop._batch.forwards(prompts, [g.prefix_key for g in payloads]) if f.behind]
    futures: list = []

    def join_at_once(p, total=None, message=None, delta=None):
        if p == 2:  # the head is decoding: all of them join at the next boundary
            futures.extend(loop.submit(adapter.prepare(a, []), CancelToken()) for a in joiners)

    before = dict(adapter.shapes.seen)
    head = {"texts": ["the head request decodes a while"], "max_new_tokens": 12, "stream": True}
    loop.submit(adapter.prepare(head, []), CancelToken(), progress=join_at_once).result(timeout=120)
    results = [f.result(timeout=120).result for f in futures]
    ran = {k: n - before.get(k, 0) for k, n in adapter.shapes.seen.items() if n > before.get(k, 0)}
    behind = {k: n for k, n in ran.items() if k[0] == "prefill_cached"}
    # One forward per length bucket of the rests, at the prefill batch bucket that holds them.
    assert sum(behind.values()) == len(expected) < len(joiners), (behind, expected)
    assert set(behind) <= set(plan.forward_shapes()), behind
    assert any(b > 1 for _, b, _ in behind), behind
    assert all(r["prefix_cached_tokens"] > 0 for r in results)
    for a, got, prompt in zip(joiners, results, prompts, strict=True):
        want = run(plain, adapter, a)
        assert got["texts"] == want["texts"] and logprob_tokens(got) == logprob_tokens(want), a
        assert logprob_values(got) == pytest.approx(logprob_values(want), abs=1e-4), a
        want_ids = hf_greedy(adapter, prompt, a["max_new_tokens"])
        assert logprob_tokens(got)[0] == [adapter.token_text(t) for t in want_ids]


def join_behind_a_running_batch(loop, adapter, running: int, joiners: list[dict]) -> tuple[list[dict], dict]:
    """`running` sequences decode (one request); `joiners` (behind the cached prefix) join at
    one token boundary. Returns their results and the forwards that ran, by shape."""
    futures: list = []

    def join_at_once(p, total=None, message=None, delta=None):
        if not futures:
            futures.extend(loop.submit(adapter.prepare(a, []), CancelToken()) for a in joiners)

    before = dict(adapter.shapes.seen)
    head = {"texts": [f"running sequence {i}" for i in range(running)], "max_new_tokens": 12, "stream": True}
    loop.submit(adapter.prepare(head, []), CancelToken(), progress=join_at_once).result(timeout=120)
    results = [f.result(timeout=120).result for f in futures]
    ran = {k: n - before.get(k, 0) for k, n in adapter.shapes.seen.items() if n > before.get(k, 0)}
    return results, {k: n for k, n in ran.items() if k[0] == "prefill_cached"}


def check_tokens(plain, adapter, joiners: list[dict], results: list[dict]) -> None:
    for a, got in zip(joiners, results, strict=True):
        assert got["prefix_cached_tokens"] > 0, a
        want = run(plain, adapter, a)
        assert got["texts"] == want["texts"] and logprob_tokens(got) == logprob_tokens(want), a
        prompt = adapter.prepare(a, []).payload.prompts[0]
        want_ids = hf_greedy(adapter, prompt, a["max_new_tokens"])
        assert logprob_tokens(got)[0] == [adapter.token_text(t) for t in want_ids], a


def test_joiners_behind_cached_prefixes_into_a_nearly_full_batch_are_one_forward_in_the_spare_slots(loops):
    """13 sequences decode and 3 joiners behind cached prefixes fill the batch: their forward at
    prefill batch 4 has a padding row, which takes one of the cache's spare slots (past the 16
    the decode steps use), so it is one forward, not one per joiner."""
    loop, adapter = loops("tiny-gpt2", reuse=True)
    plain, _ = loops("tiny-gpt2", reuse=False)
    assert loop._batch.slots.slots == 16 + 3 == adapter.plan.cache_slots
    run(loop, adapter, {"texts": [SYSTEM + "fills the cache"], "max_new_tokens": 1, "prefix_key": "k"})
    joiners = [
        {"texts": [SYSTEM + q], "max_new_tokens": 2 + i, "logprobs": 1, "prefix_key": "k"}
        for i, q in enumerate(QUESTIONS[:3])
    ]
    results, behind = join_behind_a_running_batch(loop, adapter, 13, joiners)
    assert [(b, n) for (_, b, _), n in behind.items()] == [(4, 1)], behind
    assert [r["ttft_parts"]["forwards_ahead"] for r in results] == [0, 0, 0]
    check_tokens(plain, adapter, joiners, results)


def test_joiners_behind_cached_prefixes_that_do_not_fit_one_forward_run_as_forwards_that_fit(loops):
    """9 sequences decode and 7 joiners behind cached prefixes join: batch 16 would need 16 free
    slots (10 are), so they run as forwards of 4 and 3 at batch 4, the first four's first tokens
    out before the next forward, with the same tokens as without the cache."""
    loop, adapter = loops("tiny-gpt2", reuse=True)
    plain, _ = loops("tiny-gpt2", reuse=False)
    run(loop, adapter, {"texts": [SYSTEM + "fills the cache"], "max_new_tokens": 1, "prefix_key": "k"})
    joiners = [
        {"texts": [SYSTEM + f"question {i}"], "max_new_tokens": 2 + i % 3, "logprobs": 1, "prefix_key": "k"}
        for i in range(7)
    ]
    results, behind = join_behind_a_running_batch(loop, adapter, 9, joiners)
    assert [(b, n) for (_, b, _), n in behind.items()] == [(4, 2)], behind
    assert [r["ttft_parts"]["forwards_ahead"] for r in results] == [0, 0, 0, 0, 1, 1, 1]
    check_tokens(plain, adapter, joiners, results)


def test_a_prefill_behind_a_cached_prefix_runs_a_shape_of_the_plan(loops):
    loop, adapter = loops("tiny-gpt2", reuse=True)
    adapter.shapes.seen.clear()
    for q in QUESTIONS:
        run(loop, adapter, {"texts": [SYSTEM + q], "max_new_tokens": 2})
    seen = set(adapter.shapes.seen)
    assert any(kind == "prefill_cached" for kind, _, _ in seen)
    assert seen <= set(adapter.plan.forward_shapes()), seen - set(adapter.plan.forward_shapes())


def test_the_pool_the_load_allocates_is_what_the_memory_preflight_counts(catalog, shared_worker, models_dir):
    """The prefix cache's pool is allocated with the static cache at load, whole blocks within
    the catalog's bound, and the pre-flight's prefix term is those bytes (0 with the cache off)."""
    import dataclasses
    import json
    import os

    from tpu_worker.catalog import PrefixCacheSpec
    from tpu_worker.memory import estimate_parts, prefix_cache_bytes

    entry = catalog.get("tiny-gpt2")
    with open(os.path.join(models_dir, "tiny-gpt2", "config.json"), encoding="utf-8") as fh:
        config = json.load(fh)
    pool = shared_worker.served["tiny-gpt2"].batcher._batch.prefix._pool
    held = pool.numel() * pool.element_size()
    assert held > 0 and 0 <= entry.prefix_cache.max_bytes - held < pool[0].numel() * pool.element_size()
    assert prefix_cache_bytes(entry, config, "float32") == held
    off = dataclasses.replace(entry, prefix_cache=PrefixCacheSpec(max_bytes=0))
    assert estimate_parts(10**6, entry, config, "float32")["prefix_cache"] == held
    assert estimate_parts(10**6, off, config, "float32")["prefix_cache"] == 0


def test_a_block_evicted_while_its_lookup_is_being_copied_keeps_its_pool_place_until_settled():
    """A lookup's blocks are copied after the same admission's earlier prefills store theirs:
    a block evicted in between keeps its keys and values until the next admission (settle)."""
    cache = PrefixCache(max_bytes=2 * BLOCK_BYTES, block=4)
    a, b = list(range(0, 5)), list(range(100, 109))  # 1 block, 2 blocks
    cache.store("p", a, block_reader(1.0))
    got = cache.lookup("p", a)
    cache.store("p", b, block_reader(5.0))  # evicts a's block: its place is not reused yet
    assert cache.lookup("p", a) == [] and float(got[0].keys[0][0, 0, 0]) == 1.0
    assert len(cache.lookup("p", b)) == 1  # b's second block found no free place
    cache.settle()
    cache.store("p", b, block_reader(5.0))
    assert len(cache.lookup("p", b)) == 2 and float(got[0].keys[0][0, 0, 0]) == 6.0


def test_the_spare_cache_slots_are_counted_in_the_memory_preflight(catalog, shared_worker, models_dir):
    """The static cache's spare slots (past the largest batch) are in the pre-flight's KV-cache
    term: it is the loaded model's SlotCache, spare slots included."""
    import json
    import os

    from tpu_worker import memory

    entry = catalog.get("tiny-gpt2")
    slots = shared_worker.served["tiny-gpt2"].batcher._batch.slots
    spare = slots.slots - entry.limits.max_batch
    assert spare == 3
    with open(os.path.join(models_dir, "tiny-gpt2", "config.json"), encoding="utf-8") as fh:
        config = json.load(fh)
    assert memory.kv_cache_bytes(entry, config, "float32") == slots.nbytes()


def test_a_bad_prefix_key_is_refused(shared_worker):
    from tpu_worker.errors import WorkerError

    adapter = shared_worker.served["tiny-gpt2"].adapter
    with pytest.raises(WorkerError, match="prefix_key"):
        adapter.prepare({"texts": ["hi"], "prefix_key": 7}, [])
