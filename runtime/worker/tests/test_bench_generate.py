"""Work "generate" times the decode loop that serves callers (bench/decode.py): the loaded
model's own loop when the benchmark runs on its adapter, else one built as loading builds it;
each prompt is a request of its own, admitted and stepped as a caller's is."""

from __future__ import annotations

import threading

from conftest import bench_args
from tpu_worker.ops import OpContext

GRID = {"model": "tiny-gpt2", "work": "generate", "seq_lens": [8], "max_new_tokens": 6, "iterations": 2}


def run(worker, **args):
    return worker.handle("benchmark", bench_args(**args), [], OpContext("b"))[0]


def calls(c: dict) -> int:
    return c["warmup"] + c["iterations"]


def test_a_loaded_models_generate_benchmark_runs_on_its_serving_loop(shared_worker):
    loop = shared_worker.served["tiny-gpt2"].batcher
    before = dict(vars(loop.stats))
    (c,) = run(shared_worker, **GRID, batch_sizes=[3])["configs"]
    after = vars(loop.stats)
    assert c["error"] is None and c["batch"] == 3
    # Every prompt of every call was a request of the serving loop: admitted, prefilled, stepped.
    assert after["requests"] - before["requests"] == 3 * calls(c)
    assert after["steps"] - before["steps"] > 0 and after["prefills"] - before["prefills"] > 0
    assert after["tokens"] - before["tokens"] == 3 * 6 * calls(c)  # no EOS in 6 tokens of these prompts
    moved = {k: after[k] - before[k] for k in c["decode_loop"]}
    assert c["decode_loop"] == moved  # the report says what that loop did
    kinds = {s[0] for s in c["shape_report"]["shapes"]}
    assert "decode" in kinds and "prefill" in kinds  # the loop's forwards, at the plan's shapes


def test_an_unloaded_models_generate_benchmark_runs_on_a_serving_loop_of_its_own(worker):
    assert "tiny-gpt2" not in worker.served
    (c,) = run(worker, **GRID, batch_sizes=[2])["configs"]
    assert c["error"] is None and c["tokens_per_s"] > 0
    dl = c["decode_loop"]
    assert dl["requests"] == 2 * calls(c) and dl["steps"] > 0 and dl["tokens"] == 2 * 6 * calls(c)
    # The run's loop is closed with it: no decode thread of it is left behind.
    assert not [t for t in threading.enumerate() if t.name.endswith(":benchmark") and t.is_alive()]
