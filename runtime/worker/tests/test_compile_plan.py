"""Compile once, at load, and keep it: a load in mode "compile" warms every shape of the model's
plan, after which no request compiles (the counts are the CPU's proxy for TPU compiles), and a
second worker on the same compile cache loads warm.

The plan is kept small (a catalog entry with max_batch 2 and max_seq_len 16: 12 graphs, two of
them prefills behind cached prefixes, six decode steps over windows of 8, 16 and 24 columns,
with prefix blocks of 4 tokens so that such prompts fit), since each inductor compile costs
seconds on the CPU."""

from __future__ import annotations

import json
import os
import random
import threading

import pytest
import torch

from conftest import BUILTIN_CATALOG
from tpu_worker import compiles
from tpu_worker.cancel import CancelToken
from tpu_worker.catalog import parse_catalog
from tpu_worker.ops import OpContext, Worker


@pytest.fixture(scope="module")
def small_catalog():
    with open(BUILTIN_CATALOG, encoding="utf-8") as fh:
        data = json.load(fh)
    for m in data["models"]:
        if m["id"] == "tiny-gpt2":
            m["limits"].update(max_batch=2, max_seq_len=16, max_new_tokens=8)
            m["batching"]["max_batch"] = 2
            m["prefix_cache"] = {"block_tokens": 4}
    return parse_catalog(data, BUILTIN_CATALOG)


@pytest.fixture(scope="module")
def compiled(small_catalog, cpu_probe, tmp_path_factory):
    # A cache folder of its own, or the one the environment names (a rerun then loads warm).
    cache = os.environ.get(compiles.CACHE_ENV) or str(tmp_path_factory.mktemp("compile-cache"))
    mp = pytest.MonkeyPatch()
    mp.setenv(compiles.CACHE_ENV, cache)
    w = Worker(small_catalog, cpu_probe)
    seen: list[str] = []
    report, _ = w.handle(
        "load", {"model": "tiny-gpt2", "mode": "compile"}, [], OpContext("l", progress=lambda *a, **k: seen.append(a))
    )
    yield w, report, seen, cache
    w.close()
    mp.undo()


def test_a_compiled_load_warms_every_shape_of_the_plan(compiled):
    _, report, seen, cache = compiled
    plan = report["shape_plan"]
    assert plan == {
        "batch_buckets": [1, 2],
        "length_buckets": [8, 16],
        "prefill_batch_buckets": [1, 2],
        "prefill_cached_length_buckets": [8],
        "decode_length_buckets": [8, 16, 24],
        "size": 12,
    }
    assert report["shapes_warmed"] == 12
    # One graph per shape at least (a graph break would add more; none in tiny-gpt2's forward).
    assert report["graphs_compiled"] >= 12
    assert report["compile_cache"]["dir"] == cache
    assert report["compile_cache"]["state"] == ("warm" if report["compile_cache"]["warm"] else "cold")
    assert sum(1 for a in seen if len(a) > 2 and str(a[2]).startswith("compiling")) == 12


def test_after_the_warm_up_no_request_compiles(compiled):
    w, report, _, _ = compiled
    m = w.served["tiny-gpt2"]
    rng = random.Random(3)

    def call() -> None:
        args = {"texts": [" ".join(["word"] * rng.randint(1, 30))], "max_new_tokens": rng.randint(1, 8)}
        m.batcher.submit(m.adapter.prepare(args, []), CancelToken()).result(timeout=600)

    threads = [threading.Thread(target=call) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Prompts behind a cached prefix (8 of 12 tokens) take the warmed prefill_cached shape.
    shared = {"texts": ["one two three four five six seven eight nine ten"], "max_new_tokens": 2}
    cached = [m.batcher.submit(m.adapter.prepare(shared, []), CancelToken()).result(600).result for _ in range(2)]
    assert cached[1]["prefix_cached_tokens"] > 0 and cached[1]["texts"] == cached[0]["texts"]
    # Two of them joining at one boundary run together, at the warmed prefill_cached batch 2.
    loop = m.batcher
    prefill = loop._batch.prefill
    both: list = []

    def then_two(fwd, prompts, room):
        out = prefill(fwd, prompts, room)
        if not both:  # the first call's forward ran: two arrive before the next boundary
            both.extend(loop.submit(m.adapter.prepare(shared, []), CancelToken()) for _ in range(2))
        return out

    loop._batch.prefill = then_two
    try:
        loop.submit(m.adapter.prepare({"texts": ["first"], "max_new_tokens": 1}, []), CancelToken()).result(600)
        together = [f.result(600).result for f in both]
    finally:
        del loop._batch.prefill
    assert [r["texts"] for r in together] == [cached[0]["texts"]] * 2
    assert [r["ttft_parts"]["prefill_shape"] for r in together] == ["prefill_cached 2x8"] * 2
    status, _ = w.handle("status", {}, [], OpContext("s"))
    (row,) = status["loaded"]
    assert row["compiles"] == {
        "graphs_compiled": report["graphs_compiled"],
        "recompiles_since_load": 0,
        "recompiled": False,
        "op_shapes_since_load": 0,  # no op around the step's forward at a shape the load did not warm
    }
    assert row["shapes"]["distinct_shapes"] <= row["shape_plan"]["size"]


def test_a_forward_outside_the_plan_recompiles_and_is_flagged(compiled):
    w, _, _, _ = compiled
    m = w.served["tiny-gpt2"]
    before = m.compiles.recompiles_since_load
    with torch.no_grad():  # length 12 is no bucket of the plan: dynamo compiles a new graph
        m.adapter.prefill_static([[m.adapter.pad_id] * 5], 1, 12)
    assert m.compiles.recompiles_since_load > before
    assert m.status_row()["compiles"]["recompiled"] is True


def test_a_load_after_an_unload_finds_its_graphs_in_the_compile_cache(compiled):
    w, report, _, cache = compiled
    w.handle("unload", {"model": "tiny-gpt2"}, [], OpContext("u"))
    again, _ = w.handle("load", {"model": "tiny-gpt2", "mode": "compile"}, [], OpContext("l2"))
    assert again["compile_cache"]["dir"] == cache
    assert again["compile_cache"]["warm"] is True and again["compile_cache"]["hits"] >= 1
    assert again["compile_cache"]["state"] == "warm"
    assert again["shapes_warmed"] == report["shapes_warmed"]
