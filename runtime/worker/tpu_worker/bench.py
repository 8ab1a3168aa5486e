"""Benchmark engine: warmup + timed iterations over batch x seq_len x dtype x mode.

Result shape (the `benchmark` op):

    {
      "manifest": {model, weight_digest, device, device_name, backend, backend_version,
                   torch_version, python_version, worker_version, scenario, warmup,
                   iterations, duration_s, execution_mode, started_at, finished_at, cpu_count,
                   torch_threads},
      "configs": [
        {batch, seq_len, dtype, mode, scenario, device, iterations, warmup,
         latency_ms: {p50, p90, p99, mean, min, max}, throughput_items_per_s,
         tokens_per_s (generate only), first_call_s, compile_s, load_s, peak_memory_bytes,
         matmul_precision, max_abs_error_vs_fp32, mean_abs_error_vs_fp32, error}
      ],
      "cancelled": bool
    }

Scenarios: `forward` (one forward pass of a synthetic batch; prefill for causal LMs) and
`generate` (causal LMs: greedy decoding of max_new_tokens after the prompt).

Timing: every clock read is preceded by a device synchronize and the output of the iteration
is kept alive across it, so asynchronous backends (TPU, CUDA) are measured honestly. Warmup
iterations are not counted; the first one is reported as first_call_s, and as compile_s in
compile mode (it includes tracing and compilation for that shape).
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import time
from typing import Any

import torch

from . import __version__, accel, logs
from .adapters import Adapter
from .errors import WorkerError, invalid, is_oom

SCENARIOS = ("forward", "generate")
DEFAULT_ITERATIONS = 20
MAX_CONFIGS = 64
REFERENCE_MAX_ELEMENTS = 16_000_000


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile of an ascending list (q in 0..100)."""
    if not sorted_values:
        raise ValueError("no samples")
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def latency_summary(seconds: list[float]) -> dict:
    ms = sorted(s * 1000.0 for s in seconds)
    return {
        "p50": round(percentile(ms, 50), 4),
        "p90": round(percentile(ms, 90), 4),
        "p99": round(percentile(ms, 99), 4),
        "mean": round(sum(ms) / len(ms), 4),
        "min": round(ms[0], 4),
        "max": round(ms[-1], 4),
    }


def _int_list(args: dict, key: str, lo: int, hi: int, default: list) -> list:
    v = args.get(key)
    if v is None:
        return default
    if (
        not isinstance(v, list)
        or not v
        or len(v) > 16
        or not all(isinstance(x, int) and not isinstance(x, bool) and lo <= x <= hi for x in v)
    ):
        raise invalid(f"args.{key} must be a list of 1-16 integers in {lo}..{hi}")
    return list(dict.fromkeys(v))


def _str_list(args: dict, key: str, allowed: tuple, default: list, code: str = "invalid_argument") -> list:
    v = args.get(key)
    if v is None:
        return default
    if not isinstance(v, list) or not v or not all(isinstance(x, str) for x in v):
        raise invalid(f"args.{key} must be a non-empty list of strings")
    bad = [x for x in v if x not in allowed]
    if bad:
        raise WorkerError(code, f"args.{key}: {', '.join(map(repr, bad))} not allowed; use {', '.join(allowed)}")
    return list(dict.fromkeys(v))


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _as_float_cpu(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor) and out.is_floating_point():
        return out.detach().to("cpu", torch.float32)
    return None


def run_benchmark(worker, args: dict, ctx) -> dict:
    entry = worker.catalog.get(args.get("model"))
    device = worker.target_device(args.get("device"))
    lim = entry.limits
    scenario = args.get("scenario") or "forward"
    if scenario not in SCENARIOS:
        raise invalid(f"args.scenario must be one of {', '.join(SCENARIOS)}")
    if scenario == "generate" and entry.task != "text-generation":
        raise invalid("scenario 'generate' needs a text-generation model")
    batch_sizes = _int_list(args, "batch_sizes", 1, lim.max_batch, [1])
    text = entry.task in ("embedding", "text-generation")
    seq_lens: list = _int_list(args, "seq_lens", 2, lim.max_seq_len, [min(64, lim.max_seq_len)]) if text else [None]
    dtypes = _str_list(args, "dtypes", entry.dtypes, [entry.default_dtype], "unsupported_dtype")
    # fp32 first, so the other dtypes can be compared against its outputs.
    dtypes.sort(key=lambda d: d != "float32")
    modes = _str_list(args, "modes", ("eager", "compile"), ["eager"])
    warmup = args.get("warmup", 3)
    if not isinstance(warmup, int) or isinstance(warmup, bool) or not 0 <= warmup <= 1000:
        raise invalid("args.warmup must be an integer in 0..1000")
    iterations = args.get("iterations")
    if iterations is not None and (
        not isinstance(iterations, int) or isinstance(iterations, bool) or not 1 <= iterations <= 100_000
    ):
        raise invalid("args.iterations must be an integer in 1..100000")
    duration = args.get("duration_s")
    if duration is not None and (
        not isinstance(duration, (int, float)) or isinstance(duration, bool) or not 0 < duration <= 3600
    ):
        raise invalid("args.duration_s must be a number of seconds in (0, 3600]")
    if iterations is None and duration is None:
        iterations = DEFAULT_ITERATIONS
    max_new = args.get("max_new_tokens", min(16, lim.max_new_tokens or 1))
    if scenario == "generate" and (not isinstance(max_new, int) or not 1 <= max_new <= lim.max_new_tokens):
        raise invalid(f"args.max_new_tokens must be an integer in 1..{lim.max_new_tokens}")
    total = len(batch_sizes) * len(seq_lens) * len(dtypes) * len(modes)
    if total > MAX_CONFIGS:
        raise invalid(f"{total} configurations exceed the limit of {MAX_CONFIGS}; narrow the grid")

    _, info = worker.entry_and_weights(entry.id)
    manifest = {
        "model": entry.id,
        "weight_digest": worker.digests.digest(info.files),
        "device": str(device),
        "device_name": worker.device_info["name"] if device == worker.device else "cpu",
        "backend": worker.device_info["backend"] if device == worker.device else "cpu",
        "backend_version": worker.device_info.get("backend_version") if device == worker.device else torch.__version__,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "worker_version": __version__,
        "scenario": scenario,
        "warmup": warmup,
        "iterations": iterations,
        "duration_s": duration,
        "max_new_tokens": max_new if scenario == "generate" else None,
        "execution_mode": accel.execution_mode(device),
        "started_at": _now(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        # What peak_memory_bytes measures: device allocations, or the whole process on the CPU.
        "peak_memory_kind": "process_peak_rss" if device.type == "cpu" else "device_peak_allocated",
    }
    configs: list[dict] = []
    references: dict[tuple, torch.Tensor] = {}
    cancelled = False
    done = 0
    ctx.progress(0, total, f"benchmarking {entry.id}: {total} configuration(s)")
    for dtype in dtypes:
        for mode in modes:
            if cancelled:
                break
            group = [(b, s) for b in batch_sizes for s in seq_lens]
            try:
                adapter, load_s, temporary = _adapter_for(worker, entry, info, device, dtype, mode, ctx)
            except WorkerError as exc:
                if exc.code == "cancelled":
                    cancelled = True
                    break
                for b, s in group:
                    configs.append(_failed(b, s, dtype, mode, scenario, device, exc))
                    done += 1
                ctx.progress(done, total, f"{dtype}/{mode}: {exc.code}")
                continue
            try:
                for b, s in group:
                    base = {
                        "batch": b,
                        "seq_len": s,
                        "dtype": dtype,
                        "mode": mode,
                        "scenario": scenario,
                        "device": str(device),
                        "warmup": warmup,
                    }
                    try:
                        res = _run_config(adapter, scenario, b, s, warmup, iterations, duration, max_new, ctx.token)
                    except WorkerError as exc:
                        configs.append(_failed(b, s, dtype, mode, scenario, device, exc))
                        done += 1
                        continue
                    except Exception as exc:  # noqa: BLE001 - one bad config must not end the run
                        code = "out_of_memory" if is_oom(exc) else "internal"
                        logs.error(
                            "benchmark config failed",
                            model=entry.id,
                            batch=b,
                            seq_len=s,
                            dtype=dtype,
                            mode=mode,
                            error=f"{type(exc).__name__}: {exc}",
                        )
                        configs.append(
                            _failed(
                                b,
                                s,
                                dtype,
                                mode,
                                scenario,
                                device,
                                WorkerError(code, f"configuration failed ({type(exc).__name__}); see the worker log"),
                            )
                        )
                        done += 1
                        continue
                    if res is None:
                        cancelled = True
                        break
                    out = res.pop("_output")
                    ref_key = (b, s)
                    err = {"max_abs_error_vs_fp32": None, "mean_abs_error_vs_fp32": None}
                    if out is not None and scenario == "forward":
                        if dtype == "float32" and out.numel() <= REFERENCE_MAX_ELEMENTS:
                            references.setdefault(ref_key, out)
                        elif ref_key in references and references[ref_key].shape == out.shape:
                            diff = (out - references[ref_key]).abs()
                            err = {
                                "max_abs_error_vs_fp32": float(diff.max()),
                                "mean_abs_error_vs_fp32": float(diff.mean()),
                            }
                    compile_s = res["first_call_s"] if mode == "compile" else 0.0
                    configs.append(
                        {
                            **base,
                            **res,
                            **err,
                            "compile_s": compile_s,
                            "load_s": load_s,
                            "matmul_precision": accel.matmul_precision(device),
                            "error": None,
                        }
                    )
                    done += 1
                    lat = res["latency_ms"]
                    ctx.progress(
                        done,
                        total,
                        f"batch={b} seq_len={s} {dtype} {mode}: p50 {lat['p50']:.3f} ms, "
                        f"{res['throughput_items_per_s']:.1f} items/s",
                    )
            finally:
                if temporary:
                    adapter = None
                    from .ops import release_memory

                    release_memory(device)
        if cancelled:
            break
    manifest["finished_at"] = _now()
    return {"manifest": manifest, "configs": configs, "cancelled": cancelled}


def _failed(b, s, dtype, mode, scenario, device, exc: WorkerError) -> dict:
    return {
        "batch": b,
        "seq_len": s,
        "dtype": dtype,
        "mode": mode,
        "scenario": scenario,
        "device": str(device),
        "latency_ms": None,
        "throughput_items_per_s": None,
        "error": exc.to_wire(),
    }


def _adapter_for(worker, entry, info, device, dtype, mode, ctx) -> tuple[Adapter, float | None, bool]:
    """Reuses the loaded model when it matches; otherwise builds a private one for this run."""
    m = worker.loaded.get(entry.id)
    if m is not None and m.adapter.device == device and m.dtype == dtype and m.mode == mode:
        return m.adapter, m.load_report.get("load_s"), False
    worker.check_memory(entry, info, dtype, device)
    adapter, report = worker.build(entry, info, device, dtype, "eager", [], ctx.token)
    if mode == "compile":
        adapter.compile()
    return adapter, report["load_s"], True


def _run_config(
    adapter: Adapter,
    scenario: str,
    batch: int,
    seq_len: int | None,
    warmup: int,
    iterations: int | None,
    duration: float | None,
    max_new: int,
    token,
) -> dict | None:
    """Runs one configuration; returns None when cancelled."""
    device = adapter.device
    inputs = adapter.example(batch, seq_len, seed=0)
    if scenario == "generate":
        prompts = inputs.to("cpu").tolist()

        def step():
            return adapter.generate(prompts, max_new, lambda: token.cancelled)[0]
    else:

        def step():
            return adapter.forward_example(inputs)

    accel.reset_peak_memory(device)
    first_call_s = None
    out = None
    with torch.no_grad():
        for i in range(warmup):
            if token.cancelled:
                return None
            accel.synchronize(device)
            t0 = time.perf_counter()
            out = step()
            accel.synchronize(device)
            if i == 0:
                first_call_s = time.perf_counter() - t0
        samples: list[float] = []
        start = time.perf_counter()
        while True:
            if iterations is not None and len(samples) >= iterations:
                break
            if duration is not None and samples and time.perf_counter() - start >= duration:
                break
            if token.cancelled:
                return None
            accel.synchronize(device)
            t0 = time.perf_counter()
            out = step()  # kept alive until after the synchronize below
            accel.synchronize(device)
            samples.append(time.perf_counter() - t0)
            if first_call_s is None:
                first_call_s = samples[-1]
    lat = latency_summary(samples)
    mean_s = sum(samples) / len(samples)
    res = {
        "iterations": len(samples),
        "latency_ms": lat,
        "throughput_items_per_s": round(batch / mean_s, 4) if mean_s > 0 else None,
        "first_call_s": round(first_call_s, 6),
        "peak_memory_bytes": accel.peak_memory_bytes(device),
        "_output": _as_float_cpu(out) if scenario == "forward" else None,
    }
    if scenario == "generate":
        tokens = sum(len(r) for r in out) if out else 0
        res["tokens_per_s"] = round(tokens / mean_s, 4) if mean_s > 0 else None
    return res
