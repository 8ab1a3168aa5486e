"""The benchmark engine's figures are internally consistent, and precision, work, memory and
compile accounting say what they measured. Small grids on mnist-cnn keep this fast."""

from __future__ import annotations

import pytest
import torch

from conftest import bench_args
from tpu_worker import flops, precision
from tpu_worker.bench import engine, measure
from tpu_worker.ops import OpContext


def run(worker, **args):
    return worker.handle("benchmark", bench_args(**args), [], OpContext("b"))[0]


def test_single_stream_reports_precision_against_the_fp32_cpu_reference(shared_worker):
    r = run(shared_worker, batch_sizes=[1, 4], dtypes=["float32", "bfloat16"])
    assert r["manifest"]["scenario"] == "single-stream" and r["manifest"]["work"] == "forward"
    assert r["manifest"]["precision_reference"] == "cpu float32 eager"
    assert r["manifest"]["seed"] == 0 and r["manifest"]["device_kind"] == "cpu"
    assert len(r["configs"]) == 4
    for c in r["configs"]:
        lat = c["latency_ms"]
        assert lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
        assert c["throughput_items_per_s"] == pytest.approx(c["batch"] / (lat["mean"] / 1000), rel=1e-3)
        assert c["flops_per_item"] > 1_000_000  # two convolutions and a linear layer
        assert c["achieved_flops_per_s"] > 0
        assert (c["fraction_of_peak"] or 0) > 0 or "exceeds the peak" in c["fraction_of_peak_fault"]
        assert c["peak_flops_source"].startswith("measured")
        assert c["peak_memory_kind"] in ("cpu_peak_rss", "cpu_sampled_rss")
        assert c["peak_memory_bytes"] > 0 and c["peak_memory_increase_bytes"] >= 0
        assert c["matmul_precision"] == torch.get_float32_matmul_precision()
    fp32 = [c for c in r["configs"] if c["dtype"] == "float32"]
    bf16 = [c for c in r["configs"] if c["dtype"] == "bfloat16"]
    assert all(c["max_abs_error_vs_fp32"] <= 1e-6 for c in fp32)
    assert all(c["max_abs_error_vs_fp32"] > 0 and c["cosine_similarity_vs_fp32"] > 0.99 for c in bf16)
    assert all(0 < c["max_rel_error_vs_fp32"] < 0.1 for c in bf16)


def test_offline_runs_the_largest_batch_and_measures_window_throughput(shared_worker):
    r = run(shared_worker, batch_sizes=[2, 8, 4], scenario="offline")
    (c,) = r["configs"]
    assert c["batch"] == 8 and c["scenario"] == "offline" and c["offline_skipped_batches"] == []
    assert c["throughput_basis"].startswith("items / wall time")
    mean_s = c["latency_ms"]["mean"] / 1000
    assert c["throughput_items_per_s"] == pytest.approx(c["batch"] / mean_s, rel=0.1)


def test_offline_falls_back_to_a_smaller_batch_after_out_of_memory(shared_worker, monkeypatch):
    real = engine.measure

    def measure(adapter, *, batch, **rest):
        if batch > 2:
            raise RuntimeError("CPU out of memory (simulated)")
        return real(adapter, batch=batch, **rest)

    monkeypatch.setattr(engine, "measure", measure)
    r = run(shared_worker, batch_sizes=[1, 2, 8], scenario="offline")
    (c,) = r["configs"]
    assert c["error"] is None and c["batch"] == 2
    assert c["offline_skipped_batches"] == [{"batch": 8, "reason": "out_of_memory"}]


def test_compile_mode_reports_compile_time_apart_and_no_recompilation(worker, monkeypatch):
    monkeypatch.setenv("TPU_WORKER_COMPILE_BACKEND", "eager")  # dynamo without inductor: fast
    r = run(worker, batch_sizes=[1, 2], modes=["compile"], warmup=0)
    assert r["manifest"]["compile_backend"] == "eager"
    for c in r["configs"]:
        assert c["error"] is None and c["mode"] == "compile"
        assert c["graphs_compiled"] >= 1 and c["compile_s"] > 0
        assert c["recompiles_in_window"] == 0 and c["recompiled"] is False
        assert c["max_abs_error_vs_fp32"] <= 1e-6


def test_a_recompilation_inside_the_window_is_flagged(worker, monkeypatch):
    monkeypatch.setenv("TPU_WORKER_COMPILE_BACKEND", "eager")
    monkeypatch.setattr(measure, "compile_counters", _counters_that_grow())
    r = run(worker, batch_sizes=[1], modes=["compile"])
    (c,) = r["configs"]
    assert c["recompiles_in_window"] == 1 and c["recompiled"] is True


def _counters_that_grow():
    calls = {"n": 0}

    def counters():
        calls["n"] += 1
        return {"graphs": calls["n"], "graph_breaks": 0}

    return counters


def test_legacy_scenario_names_mean_the_work(shared_worker):
    r = run(
        shared_worker,
        model="tiny-gpt2",
        seq_lens=[8],
        scenario="generate",
        max_new_tokens=2,
        iterations=1,
        warmup=0,
    )
    (c,) = r["configs"]
    assert c["scenario"] == "single-stream" and c["work"] == "generate" and c["tokens_per_s"] > 0
    assert c["max_abs_error_vs_fp32"] == 0  # the prompt's logits against the reference
    assert c["flops_per_item"] is None


def test_generate_work_samples_with_the_requests_temperature_and_seed(shared_worker, monkeypatch):
    """run_benchmark's temperature and seed reach the decode: every timed call samples the same
    tokens (the seed repeats them), other than greedy's, and the report says how it decoded."""
    from tpu_worker.errors import WorkerError
    from tpu_worker.generation.loop import DecodeLoop

    submitted = []
    real = DecodeLoop.submit

    def spy(self, prepared, token, trace=None, progress=None):
        future = real(self, prepared, token, trace, progress)
        submitted.append((prepared.payload.params, future))
        return future

    def outcomes():  # (the sampling parameters, the generated text) of every submitted request
        return [(p, f.result().result["texts"][0]) for p, f in submitted]

    monkeypatch.setattr(DecodeLoop, "submit", spy)
    grid = {"model": "tiny-gpt2", "work": "generate", "seq_lens": [8], "max_new_tokens": 8, "iterations": 2}
    sampled = run(shared_worker, **grid, temperature=1.5, seed=7)
    assert sampled["manifest"]["sampling"] == {"temperature": 1.5, "seed": 7}
    calls = outcomes()
    assert len(calls) == 3 and all((s.temperature, s.seed) == (1.5, 7) for s, _ in calls)
    tokens = calls[0][1]
    assert all(out == tokens for _, out in calls)  # warmup and window alike: the seed repeats
    submitted.clear()
    greedy = run(shared_worker, **grid)
    assert greedy["manifest"]["sampling"] == {"temperature": 0.0, "seed": None}
    calls = outcomes()
    assert calls[0][0].greedy and calls[0][1] != tokens
    submitted.clear()
    other = run(shared_worker, **grid, temperature=1.5, seed=8)
    assert outcomes()[0][1] != tokens
    assert other["configs"][0]["tokens_per_s"] > 0
    picked = run(shared_worker, **grid, temperature=0.5)["manifest"]["sampling"]
    assert picked["temperature"] == 0.5 and isinstance(picked["seed"], int)  # drawn, reported
    assert run(shared_worker, batch_sizes=[1])["manifest"]["sampling"] is None  # forward: no decode
    with pytest.raises(WorkerError, match="only work 'generate' samples"):
        run(shared_worker, temperature=1.0)
    with pytest.raises(WorkerError, match=r"args.temperature must be in 0\.\.2"):
        run(shared_worker, **grid, temperature=3)


def test_peak_table_knows_tpus_and_gpus():
    assert flops.peak_flops("tpu", "TPU v5 lite", "bfloat16", "default")[0] == 197e12
    assert flops.peak_flops("tpu", "TPU v6e", "float32", "default (one-pass bf16)")[0] == 918e12
    assert flops.peak_flops("tpu", "TPU v5p", "float32", "highest")[0] == pytest.approx(459e12 / 6)
    assert flops.peak_flops("cuda", "NVIDIA H100 80GB HBM3", "float32", "tf32 (...)")[0] == 494.7e12
    assert flops.peak_flops("cuda", "NVIDIA A100-SXM4-80GB", "float32", "highest")[0] == 19.5e12
    assert flops.peak_flops("cuda", "NVIDIA L4", "bfloat16", "highest")[0] == 121e12
    assert flops.peak_flops("cuda", "NVIDIA GeForce GTX 1080", "float32", "highest")[0] is None


def test_precision_compare_figures():
    ref = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    same = precision.compare(ref.clone(), ref)
    assert same["max_abs_error_vs_fp32"] == 0 and same["cosine_similarity_vs_fp32"] == pytest.approx(1.0)
    off = precision.compare(ref + torch.tensor([[0.0, 0.1], [0.0, 0.0]]), ref)
    assert off["max_abs_error_vs_fp32"] == pytest.approx(0.1) and off["max_rel_error_vs_fp32"] == pytest.approx(0.05)
    assert off["cosine_similarity_vs_fp32"] < 1
    bad = precision.compare(torch.tensor([[float("inf"), 0.0], [0.0, 2.0]]), ref)
    assert bad["nonfinite_outputs"] == 1 and bad["max_abs_error_vs_fp32"] is None
    assert precision.compare(torch.zeros(3), ref)["max_abs_error_vs_fp32"] is None


def test_check_lists_matmul_layer_norm_and_softmax_on_the_math_attention_path(shared_worker):
    r = shared_worker.handle(
        "check", {"model": "all-minilm-l6-v2", "batch": 1, "seq_len": 8, "attention": "math"}, [], OpContext("c")
    )[0]
    ops = {o["op"]: o for o in r["ops"]}
    assert ops["aten::addmm"]["category"] == "matmul" and ops["aten::bmm"]["count"] == 12
    assert ops["aten::native_layer_norm"]["count"] == 13
    assert any(o["category"] == "softmax" and o["count"] == 6 for o in r["ops"])
    assert r["categories"]["matmul"] >= 37 and r["attention"] == "math"
    assert r["measured_memory_kind"].startswith("cpu") and r["measured_peak_memory_bytes"] > 0
    fused = shared_worker.handle("check", {"model": "all-minilm-l6-v2", "batch": 1, "seq_len": 8}, [], OpContext("d"))[
        0
    ]
    assert fused["categories"].get("attention") == 6  # the fused kernel the CPU really runs


def test_bounds_come_from_the_request_not_from_worker_constants(shared_worker):
    """The server's config is the one source of the bounds: raising one there is honoured here."""
    from tpu_worker.errors import WorkerError

    with pytest.raises(WorkerError, match=r"0\.\.100"):
        run(shared_worker, warmup=150)
    r = run(shared_worker, warmup=150, iterations=1, limits={"max_warmup": 200})
    assert r["manifest"]["warmup"] == 150
    with pytest.raises(WorkerError, match="exceed the limit of 1"):
        run(shared_worker, batch_sizes=[1, 2], limits={"max_configs": 1})
    with pytest.raises(WorkerError, match=r"1\.\.3\b"):
        run(shared_worker, iterations=4, limits={"max_iterations": 3})
    with pytest.raises(WorkerError, match="limits must be an object"):
        run(shared_worker, limits=[1])


@pytest.mark.parametrize(
    ("missing", "named"),
    [
        ({"batch_sizes": None}, "args.batch_sizes is required"),
        ({"dtypes": None}, "args.dtypes is required"),
        ({"modes": None}, "args.modes is required"),
        ({"scenario": None}, "args.scenario is required"),
        ({"work": None}, "args.work is required"),
        ({"warmup": None}, "args.warmup is required"),
        ({"extend_factor": None}, "args.extend_factor is required"),
        ({"iterations": None}, "args.iterations or args.duration_s is required"),
        ({"limits": None}, "args.limits is required"),
        ({"limits": {"max_warmup": None}}, "args.limits.max_warmup is required"),
        ({"limits": {"min_seq_len": None}}, "args.limits.min_seq_len is required"),
        ({"model": "all-minilm-l6-v2"}, "args.seq_lens is required"),
        ({"model": "tiny-gpt2", "seq_lens": [8], "work": "generate"}, "args.max_new_tokens is required"),
        ({"seq_lens": [8]}, "args.seq_lens: model 'mnist-cnn' takes tensors"),
        ({"model": "all-minilm-l6-v2", "seq_lens": [1]}, r"args.seq_lens must be a list of 1-16 integers in 2\.\.256"),
        ({"warmup": -1}, r"args.warmup must be an integer in 0\.\.100"),
    ],
)
def test_the_worker_has_no_defaults_and_names_what_is_missing(shared_worker, missing, named):
    """The server resolves every default and bound (tools/run_benchmark.ts); the worker refuses a
    request that lacks one instead of filling in its own."""
    from tpu_worker.errors import WorkerError

    with pytest.raises(WorkerError, match=named) as info:
        run(shared_worker, **missing)
    assert info.value.code == "invalid_argument"


def test_the_shortest_sequence_comes_from_the_request(shared_worker):
    r = run(shared_worker, model="all-minilm-l6-v2", seq_lens=[3], iterations=1, limits={"min_seq_len": 3})
    assert [c["seq_len"] for c in r["configs"]] == [3]
    from tpu_worker.errors import WorkerError

    with pytest.raises(WorkerError, match=r"in 4\.\.256"):
        run(shared_worker, model="all-minilm-l6-v2", seq_lens=[3], limits={"min_seq_len": 4})


def test_a_fraction_of_peak_above_one_is_a_fault_not_a_figure():
    from tpu_worker.bench.engine import fraction_of_peak

    assert fraction_of_peak(4e9, 1e10, "table") == (0.4, None)
    assert fraction_of_peak(None, 1e10, "table") == (None, None)
    fraction, fault = fraction_of_peak(3.75e10, 1e10, "measured: best float32 matmul on this CPU in this worker")
    assert fraction is None
    assert "exceeds the peak" in fault and "fault" in fault
