"""The decode step's work around the forward is shape-closed (census.py, issue 42 item 3): after
the load's warm-up, a mixed trace of requests (prompt lengths across the plan's buckets, greedy
and seeded sampling with top-k / top-p, logprobs, structured output, joins and leaves at every
batch size) runs no ATen op at an (op, input shapes) signature the warm-up did not run, on
tiny-gpt2 and on the built-in SmolLM2. `shapes.strict` refuses a new signature with
recompile_after_load; without it the signature is counted in status."""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from conftest import BUILTIN_CATALOG
from tpu_worker.compiles import CompileCounter
from tpu_worker.errors import WorkerError
from tpu_worker.generation.loop import _worker_error
from tpu_worker.ops import OpContext

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "seven",
    "small",
    "birds",
    "sing",
]
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def trace(n: int, seed: int, longest: int, max_new: int, chat: bool) -> list[dict]:
    """`n` requests of varied prompt length, max_new_tokens and sampling arguments."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        text = " ".join(rnd.choice(WORDS) for _ in range(rnd.choice([1, 3, 9, 20, longest])))
        args: dict = {"max_new_tokens": rnd.randint(1, max_new)}
        if i % 10 == 4:  # a shared long prefix: prefilled behind its cached blocks
            args["texts"] = [" ".join(WORDS * 3) + f" then {i}"]
        elif chat and i % 23 == 5:
            args.update(messages=[{"role": "user", "content": "a number as JSON"}])
            args["response_format"] = {"type": "json_schema", "json_schema": {"schema": SCHEMA}}
        else:
            args["texts"] = [text] if i % 9 else [text, text[: len(text) // 2] or "a"]
        kind = i % 4
        if kind == 1:
            args.update(temperature=0.9, seed=i)
        elif kind == 2:
            args.update(temperature=1.2, seed=i, top_k=rnd.choice([1, 5, 40]), top_p=rnd.choice([0.5, 0.95]))
        if i % 3 == 0:
            args["logprobs"] = rnd.randint(0, 3)
        out.append(args)
    return out


def run(w, model: str, calls: list[dict], width: int) -> list[dict]:
    """The calls from `width` concurrent callers: they join and leave one running batch."""

    def call(args):
        return w.handle("infer", {"model": model, **args}, [], OpContext("c"))[0]

    with ThreadPoolExecutor(width) as ex:
        return list(ex.map(call, calls))


def served_loop(w, model: str):
    return w.served[model].batcher


@pytest.fixture(scope="module")
def census_worker(catalog, cpu_probe):
    from tpu_worker.ops import Worker

    w = Worker(catalog, cpu_probe)
    yield w
    w.close()


@pytest.mark.parametrize(
    ("model", "requests", "longest", "max_new", "width"),
    [("tiny-gpt2", 300, 60, 6, 12), ("smollm2-135m-instruct", 300, 120, 3, 8)],
)
def test_a_mixed_trace_adds_no_op_shape_after_the_warm_up(census_worker, model, requests, longest, max_new, width):
    w = census_worker
    w.handle("load", {"model": model}, [], OpContext("load"))
    try:
        loop = served_loop(w, model)
        census = loop.census
        assert census.sealed and len(census.seen) > 50
        results = run(w, model, trace(requests, 7, longest, max_new, chat=model != "tiny-gpt2"), width)
        assert len(results) == requests
        st = loop.stats
        assert st.joins > 20 and st.largest >= 4 and st.steps > 30  # rows joined and left mid-decode
        assert sum(r["prefix_cached_tokens"] for r in results) > 0  # prompts ran behind cached prefixes
        assert census.new == [], f"{len(census.new)} new op shapes after warm-up, first: {census.new[:5]}"
        assert loop.describe()["op_shapes"]["new_since_load"] == 0
    finally:
        w.handle("unload", {"model": model}, [], OpContext("unload"))


@pytest.fixture
def strict_worker(tmp_path, models_dir, cpu_probe):
    """A worker whose tiny-gpt2 entry sets shapes.strict."""
    from tpu_worker.catalog import load_catalog
    from tpu_worker.ops import Worker

    with open(BUILTIN_CATALOG, encoding="utf-8") as fh:
        data = json.load(fh)
    data["model_roots"] = [models_dir]
    for m in data["models"]:
        if m["id"] == "tiny-gpt2":
            m["shapes"] = {"strict": True}
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps(data))
    w = Worker(load_catalog(str(path)), cpu_probe)
    yield w
    w.close()


def forget_a_decode_shape(loop) -> tuple:
    """Makes the census forget one signature the decode step runs, as if the warm-up had missed
    that shape: the next request runs it as a new one."""
    census = loop.census
    step = [s for s in census.seen if str(s[0]).startswith("aten.index_fill_")]
    assert step, "the decode step's mask write was not warmed"
    census.seen.discard(step[0])
    return step[0]


def test_strict_shapes_refuse_a_new_op_shape_with_recompile_after_load(strict_worker):
    w = strict_worker
    w.handle("load", {"model": "tiny-gpt2"}, [], OpContext("load"))
    loop = served_loop(w, "tiny-gpt2")
    assert loop.census.strict
    assert run(w, "tiny-gpt2", [{"texts": ["warm"], "max_new_tokens": 3}], 1)[0]["new_tokens"] == [3]
    forget_a_decode_shape(loop)
    with pytest.raises(WorkerError) as err:
        run(w, "tiny-gpt2", [{"texts": ["the next one"], "max_new_tokens": 3}], 1)
    assert err.value.code == "recompile_after_load" and not err.value.recoverable
    assert "shapes.strict" in err.value.message and "index_fill_" in err.value.message
    assert loop.describe()["op_shapes"]["new_since_load"] == 1
    # Refused again, not learned: the shape is still not served.
    with pytest.raises(WorkerError):
        run(w, "tiny-gpt2", [{"texts": ["once more"], "max_new_tokens": 3}], 1)


def test_without_strict_a_new_op_shape_is_served_and_counted(census_worker):
    w = census_worker
    w.handle("load", {"model": "tiny-gpt2"}, [], OpContext("load"))
    try:
        loop = served_loop(w, "tiny-gpt2")
        assert not loop.census.strict
        sig = forget_a_decode_shape(loop)
        r = run(w, "tiny-gpt2", [{"texts": ["served"], "max_new_tokens": 3}], 1)[0]
        assert r["new_tokens"] == [3]
        assert loop.census.new == [sig]
        assert w.served["tiny-gpt2"].status_row()["batching"]["op_shapes"]["new_since_load"] == 1
    finally:
        w.handle("unload", {"model": "tiny-gpt2"}, [], OpContext("unload"))


def test_recompiles_since_load_counts_new_op_shapes_and_strict_refuses_a_graph():
    from tpu_worker.census import ShapeCensus

    census = ShapeCensus("m")
    census.seal()
    counter = CompileCounter("m", census=census)
    counter.count()
    counter.loaded()
    assert counter.recompiles_since_load == 0
    census.saw((torch.ops.aten.add.Tensor, (((3,), torch.float32),)))
    counter.count()  # a graph after the warm-up
    assert counter.report() == {
        "graphs_compiled": 1,
        "recompiles_since_load": 2,
        "recompiled": True,
        "op_shapes_since_load": 1,
    }
    strict = CompileCounter("m", strict=True)
    strict.loaded()
    with pytest.raises(WorkerError) as err:
        strict.count()
    assert err.value.code == "recompile_after_load"
    # dynamo wraps a backend's exception: the loop answers with the refusal inside.
    wrapped = RuntimeError("backend failed")
    wrapped.__cause__ = err.value
    assert _worker_error(wrapped) is err.value
