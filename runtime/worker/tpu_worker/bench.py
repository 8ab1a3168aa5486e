"""Benchmark engine: warmup + timed iterations over batch x seq_len x dtype x mode, after MLPerf
LoadGen's scenarios, with compile time, recompilations, peak memory, precision against a float32
CPU reference and achieved FLOP/s reported for every configuration.

Arguments (the `benchmark` op): model, device?, batch_sizes, seq_lens?, dtypes, modes,
scenario ("single-stream" | "offline"), work ("forward" | "generate"), iterations?, duration_s?,
warmup, max_new_tokens?. The old spelling scenario="forward"/"generate" still means that work in
the single-stream scenario.

Scenarios:
  * single-stream: one query at a time, each configuration of the grid measured; latency
    percentiles are the figures of merit, throughput is batch / mean latency.
  * offline: for every (seq_len, dtype, mode) the largest requested batch that fits (larger ones
    that run out of memory, or that the memory estimate says cannot fit, are skipped and named);
    throughput is items / wall time of the whole measured window.
Work: `forward` (one forward of a synthetic batch; prefill for causal LMs) or `generate` (greedy
decoding of max_new_tokens after the prompt; text-generation models only).

Result: {manifest, configs: [...], cancelled}. Each configuration:
  batch, seq_len, dtype, mode, scenario, work, device, warmup, iterations, measured_s,
  latency_ms {p50, p90, p99, mean, min, max}, throughput_items_per_s, throughput_basis,
  tokens_per_s (generate), first_call_s, compile_s, graphs_compiled, recompiles_in_window,
  recompiled, graph_breaks, load_s, peak_memory_bytes, peak_memory_increase_bytes,
  peak_memory_kind, matmul_precision, precision_reference, max_abs_error_vs_fp32,
  mean_abs_error_vs_fp32, max_rel_error_vs_fp32, cosine_similarity_vs_fp32, nonfinite_outputs,
  flops_per_item, achieved_flops_per_s, peak_flops_per_s, peak_flops_source, fraction_of_peak,
  offline_skipped_batches (offline), error ({code, message, recoverable} or null).

Timing: every clock read is preceded by a device synchronize and the iteration's output is kept
alive across it, so asynchronous backends (TPU, CUDA) are measured honestly. Warmup is never
counted; in compile mode one extra uncounted call compiles the shape even with warmup 0.
compile_s is that first call's excess over the steady mean; any graph compiled inside the
measured window is counted (dynamo's counters) and flags the configuration `recompiled`. On
TorchTPU, `xla_compiles_in_window` counts its own compile-cache misses in the window (eager mode
compiles per op and shape; private API, null where absent) and flags `recompiled` as well.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import platform
import time
from dataclasses import dataclass
from typing import Any

import torch

from . import __version__, accel, flops, logs, precision
from .adapters import Adapter
from .errors import WorkerError, invalid, is_oom
from .memory import MemoryProbe, activation_bytes

SCENARIOS = ("single-stream", "offline")
WORKS = ("forward", "generate")
DEFAULT_ITERATIONS = 20
DEFAULT_SEQ_LEN = 128
MIN_SEQ_LEN = 2


@dataclass(frozen=True)
class Bounds:
    """The server's benchmark bounds (config `benchmark`), sent with every request in `limits`.

    The defaults only serve callers that send none (the worker's own tests): the server is the
    one source of truth, so an operator who raises a limit never meets a stricter worker."""

    max_configs: int = 64
    max_iterations: int = 10_000
    max_duration_s: float = 600.0
    max_warmup: int = 100

    @classmethod
    def from_args(cls, args: dict) -> Bounds:
        given = args.get("limits")
        if given is None:
            return cls()
        if not isinstance(given, dict):
            raise invalid("args.limits must be an object of benchmark bounds")
        out = {}
        for name, default in cls().__dict__.items():
            v = given.get(name, default)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
                raise invalid(f"args.limits.{name} must be a non-negative number")
            out[name] = v
        return cls(**out)


REFERENCE_MAX_ELEMENTS = 16_000_000
REFERENCE_CACHE_ELEMENTS = 64_000_000
SEED = 0


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


def _scenario_and_work(args: dict, entry) -> tuple[str, str]:
    scenario = args.get("scenario") or "single-stream"
    work = args.get("work")
    if scenario in WORKS:  # protocol v1 spelling: the scenario named the work
        if work is not None and work != scenario:
            raise invalid(f"args.scenario {scenario!r} contradicts args.work {work!r}")
        work, scenario = scenario, "single-stream"
    work = work or "forward"
    if scenario not in SCENARIOS:
        raise invalid(f"args.scenario must be one of {', '.join(SCENARIOS)}")
    if work not in WORKS:
        raise invalid(f"args.work must be one of {', '.join(WORKS)}")
    if work == "generate" and entry.task != "text-generation":
        raise invalid("work 'generate' needs a text-generation model")
    return scenario, work


# ---------------------------------------------------------------------------------------------
# Compile accounting


def compile_counters() -> dict[str, int]:
    """Graphs dynamo has compiled and graph breaks it has taken, process-wide so far."""
    try:
        from torch._dynamo.utils import counters
    except Exception:  # noqa: BLE001
        return {"graphs": 0, "graph_breaks": 0}
    return {
        "graphs": int(counters["stats"].get("unique_graphs", 0)),
        "graph_breaks": int(sum(counters["graph_break"].values())),
    }


def _delta(a: dict, b: dict, key: str) -> int:
    return int(b.get(key, 0) - a.get(key, 0))


@contextlib.contextmanager
def _recompile_room(n_shapes: int):
    """Lets one compiled model hold a graph per shape of the grid: past dynamo's recompile limit
    (8 by default) it would silently fall back to eager and the figures would lie."""
    try:
        import torch._dynamo.config as dcfg

        name = "recompile_limit" if hasattr(dcfg, "recompile_limit") else "cache_size_limit"
        old = getattr(dcfg, name)
        setattr(dcfg, name, max(old, n_shapes + 8))
    except Exception:  # noqa: BLE001
        yield
        return
    try:
        yield
    finally:
        setattr(dcfg, name, old)


# ---------------------------------------------------------------------------------------------
# The float32 CPU reference (outputs for the precision error; FLOPs per item)


class Reference:
    def __init__(self, worker, entry, info, token) -> None:
        self.worker, self.entry, self.info, self.token = worker, entry, info, token
        self.adapter: Adapter | None = None
        self.temporary = False
        self.unavailable: str | None = None
        self.cache: dict[tuple, tuple[torch.Tensor | None, int | None]] = {}
        self.cached_elements = 0

    def _ensure(self) -> Adapter | None:
        if self.adapter is not None or self.unavailable is not None:
            return self.adapter
        cpu = torch.device("cpu")
        m = self.worker.loaded.get(self.entry.id)
        if m is not None and m.adapter.device.type == "cpu" and m.dtype == "float32" and m.mode == "eager":
            self.adapter = m.adapter
            return self.adapter
        try:
            self.worker.check_memory(self.entry, self.info, "float32", cpu)
            self.adapter, _ = self.worker.build(self.entry, self.info, cpu, "float32", "eager", [], self.token)
            self.temporary = True
        except WorkerError as exc:
            if exc.code == "cancelled":
                raise
            self.unavailable = f"unavailable ({exc.code})"
            logs.warn("no float32 CPU reference for the benchmark", model=self.entry.id, error=exc.message)
        return self.adapter

    def get(self, batch: int, seq_len: int | None) -> tuple[torch.Tensor | None, int | None]:
        """(reference output, FLOPs of one forward) for the inputs of (batch, seq_len)."""
        key = (batch, seq_len)
        if key in self.cache:
            return self.cache[key]
        adapter = self._ensure()
        if adapter is None:
            return None, None
        inputs = adapter.example(batch, seq_len, seed=SEED)
        with torch.no_grad():
            out, n = flops.count_flops(lambda: adapter.forward_example(inputs))
        ref = _as_float_cpu(out)
        if ref is not None and ref.numel() > REFERENCE_MAX_ELEMENTS:
            ref = None
        if ref is None or self.cached_elements + ref.numel() <= REFERENCE_CACHE_ELEMENTS:
            self.cache[key] = (ref, n)
            self.cached_elements += ref.numel() if ref is not None else 0
        return ref, n

    def close(self) -> None:
        self.cache.clear()
        if self.temporary:
            self.adapter = None


# ---------------------------------------------------------------------------------------------


def run_benchmark(worker, args: dict, ctx) -> dict:
    entry = worker.catalog.get(args.get("model"))
    device = worker.target_device(args.get("device"))
    lim = entry.limits
    scenario, work = _scenario_and_work(args, entry)
    batch_sizes = _int_list(args, "batch_sizes", 1, lim.max_batch, [1])
    text = entry.task in ("embedding", "text-generation")
    bounds = Bounds.from_args(args)
    seq_lens: list = (
        _int_list(args, "seq_lens", MIN_SEQ_LEN, lim.max_seq_len, [min(DEFAULT_SEQ_LEN, lim.max_seq_len)])
        if text
        else [None]
    )
    dtypes = _str_list(args, "dtypes", entry.dtypes, [entry.default_dtype], "unsupported_dtype")
    dtypes.sort(key=lambda d: d != "float32")
    modes = _str_list(args, "modes", ("eager", "compile"), ["eager"])
    warmup = args.get("warmup", 3)
    if not isinstance(warmup, int) or isinstance(warmup, bool) or not 0 <= warmup <= bounds.max_warmup:
        raise invalid(f"args.warmup must be an integer in 0..{bounds.max_warmup}")
    iterations = args.get("iterations")
    if iterations is not None and (
        not isinstance(iterations, int) or isinstance(iterations, bool) or not 1 <= iterations <= bounds.max_iterations
    ):
        raise invalid(f"args.iterations must be an integer in 1..{bounds.max_iterations}")
    duration = args.get("duration_s")
    if duration is not None and (
        not isinstance(duration, (int, float))
        or isinstance(duration, bool)
        or not 0 < duration <= bounds.max_duration_s
    ):
        raise invalid(f"args.duration_s must be a number of seconds in (0, {bounds.max_duration_s}]")
    if iterations is None and duration is None:
        iterations = DEFAULT_ITERATIONS
    max_new = args.get("max_new_tokens", min(16, lim.max_new_tokens or 1))
    if work == "generate" and (not isinstance(max_new, int) or not 1 <= max_new <= lim.max_new_tokens):
        raise invalid(f"args.max_new_tokens must be an integer in 1..{lim.max_new_tokens}")
    grid = len(batch_sizes) * len(seq_lens) * len(dtypes) * len(modes)
    if grid > bounds.max_configs:
        raise invalid(f"{grid} configurations exceed the limit of {bounds.max_configs}; narrow the grid")
    total = grid if scenario == "single-stream" else len(seq_lens) * len(dtypes) * len(modes)
    # Process-wide, like torch.set_float32_matmul_precision itself; reported as in force below.
    precision_requested = worker.matmul_precision_arg(args.get("matmul_precision"))

    _, info = worker.entry_and_weights(entry.id)
    on_worker_device = device == worker.device
    dev_info = worker.device_info if on_worker_device else {"kind": "cpu", "name": "cpu", "count": 1}
    try:
        import transformers

        transformers_version = transformers.__version__
    except Exception:  # noqa: BLE001
        transformers_version = None
    manifest = {
        "model": entry.id,
        "catalog_id": entry.id,
        "weight_digest": worker.digests.digest(info.files),
        "device": worker.label(device),
        "device_kind": str(dev_info.get("kind") or device.type),
        "device_name": dev_info.get("name") or str(device),
        "device_count": dev_info.get("count"),
        "backend": worker.device_info["backend"] if on_worker_device else "cpu",
        "backend_version": worker.device_info.get("backend_version") if on_worker_device else torch.__version__,
        "torch_version": torch.__version__,
        "transformers_version": transformers_version,
        "python_version": platform.python_version(),
        "worker_version": __version__,
        "scenario": scenario,
        "work": work,
        "warmup": warmup,
        "iterations": iterations,
        "duration_s": duration,
        "max_new_tokens": max_new if work == "generate" else None,
        "execution_mode": accel.execution_mode(device),
        "eager_mode": accel.eager_mode_report(device),
        "compile_backend": accel.compile_backend(device) if "compile" in modes else None,
        "compile_dynamic": False if "compile" in modes else None,
        "matmul_precision": accel.matmul_precision(device),
        "matmul_precision_requested": precision_requested,
        "seed": SEED,
        "precision_reference": precision.REFERENCE,
        "started_at": _now(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "peak_memory_kind": None,
    }
    configs: list[dict] = []
    cancelled = False
    done = 0
    reference = Reference(worker, entry, info, ctx.token)
    ctx.progress(0, total, f"benchmarking {entry.id}: {total} configuration(s), {scenario}, {work}")
    try:
        for dtype in dtypes:
            for mode in modes:
                if cancelled:
                    break
                n_shapes = len(batch_sizes) * len(seq_lens)
                try:
                    adapter, load_s, temporary = _adapter_for(worker, entry, info, device, dtype, mode, ctx)
                except WorkerError as exc:
                    if exc.code == "cancelled":
                        cancelled = True
                        break
                    for b, s in _points(scenario, batch_sizes, seq_lens):
                        configs.append(_failed(b, s, dtype, mode, scenario, work, device, exc))
                        done += 1
                    ctx.progress(done, total, f"{dtype}/{mode}: {exc.code}")
                    continue
                run = _Run(
                    worker,
                    entry,
                    info,
                    adapter,
                    device,
                    dtype,
                    mode,
                    scenario,
                    work,
                    warmup,
                    iterations,
                    duration,
                    max_new,
                    load_s,
                    reference,
                    ctx,
                )
                try:
                    with _recompile_room(n_shapes) if mode == "compile" else contextlib.nullcontext():
                        for s in seq_lens:
                            if scenario == "single-stream":
                                for b in batch_sizes:
                                    c = run.one(b, s)
                                    if c is None:
                                        cancelled = True
                                        break
                                    configs.append(c)
                                    done += 1
                                    ctx.progress(done, total, _progress_line(c))
                            else:
                                c = run.offline(sorted(batch_sizes, reverse=True), s)
                                if c is None:
                                    cancelled = True
                                else:
                                    configs.append(c)
                                    done += 1
                                    ctx.progress(done, total, _progress_line(c))
                            if cancelled:
                                break
                finally:
                    if temporary:
                        run.adapter = adapter = None
                        accel.release_memory(device)
            if cancelled:
                break
    finally:
        reference.close()
    manifest["peak_memory_kind"] = next((c["peak_memory_kind"] for c in configs if c.get("peak_memory_kind")), None)
    if reference.unavailable:
        manifest["precision_reference"] = f"{precision.REFERENCE}: {reference.unavailable}"
    manifest["finished_at"] = _now()
    return {"manifest": manifest, "configs": configs, "cancelled": cancelled}


def _points(scenario, batch_sizes, seq_lens):
    if scenario == "offline":
        return [(max(batch_sizes), s) for s in seq_lens]
    return [(b, s) for s in seq_lens for b in batch_sizes]


def _progress_line(c: dict) -> str:
    seq = f" seq_len={c['seq_len']}" if c.get("seq_len") else ""
    head = f"batch={c['batch']}{seq} {c['dtype']} {c['mode']}"
    if c.get("error"):
        return f"{head}: {c['error']['code']}"
    lat = c["latency_ms"]
    return f"{head}: p50 {lat['p50']:.3f} ms, {c['throughput_items_per_s']:.1f} items/s"


def _failed(b, s, dtype, mode, scenario, work, device, exc: WorkerError) -> dict:
    return {
        "batch": b,
        "seq_len": s,
        "dtype": dtype,
        "mode": mode,
        "scenario": scenario,
        "work": work,
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


@dataclass
class _Run:
    """One (dtype, mode) of the grid on one adapter."""

    worker: Any
    entry: Any
    info: Any
    adapter: Any
    device: Any
    dtype: str
    mode: str
    scenario: str
    work: str
    warmup: int
    iterations: int | None
    duration: float | None
    max_new: int
    load_s: float
    reference: Any
    ctx: Any

    def __post_init__(self) -> None:
        own = self.device == self.worker.device
        self.kind = str(self.worker.device_info.get("kind") if own else "cpu")
        self.name = self.worker.device_info.get("name") if own else "cpu"
        self.matmul_precision = accel.matmul_precision(self.device)
        self.execution_mode = accel.execution_mode(self.device)

    def base(self, b, s) -> dict:
        return {
            "batch": b,
            "seq_len": s,
            "dtype": self.dtype,
            "mode": self.mode,
            "scenario": self.scenario,
            "work": self.work,
            "device": str(self.device),
            "warmup": self.warmup,
        }

    def _fail(self, b, s, code: str, message: str) -> dict:
        return _failed(b, s, self.dtype, self.mode, self.scenario, self.work, self.device, WorkerError(code, message))

    def one(self, b: int, s: int | None) -> dict | None:
        """Measures one configuration; None when cancelled; a config with `error` when it failed."""
        try:
            res = _measure(
                self.adapter,
                self.scenario,
                self.work,
                b,
                s,
                self.warmup,
                self.iterations,
                self.duration,
                self.max_new,
                self.ctx.token,
            )
        except WorkerError as exc:
            if exc.code == "cancelled":
                return None
            return _failed(b, s, self.dtype, self.mode, self.scenario, self.work, self.device, exc)
        except Exception as exc:  # noqa: BLE001 - one bad config must not end the run
            oom = is_oom(exc)
            logs.error(
                "benchmark config failed",
                model=self.entry.id,
                batch=b,
                seq_len=s,
                dtype=self.dtype,
                mode=self.mode,
                error=f"{type(exc).__name__}: {exc}",
            )
            accel.release_memory(self.device)
            if oom:
                return self._fail(b, s, "out_of_memory", f"batch {b} ran out of memory on {self.device}")
            return self._fail(b, s, "internal", f"configuration failed ({type(exc).__name__}); see the worker log")
        if res is None:
            return None
        return self._finish(b, s, res)

    def offline(self, batches_desc: list[int], s: int | None) -> dict | None:
        """The largest batch that fits, trying the requested ones from the largest down."""
        skipped: list[dict] = []
        last = None
        for b in batches_desc:
            why = self._would_not_fit(b, s)
            if why:
                skipped.append({"batch": b, "reason": why})
                continue
            c = self.one(b, s)
            if c is None:
                return None
            err = c.get("error")
            if err and err["code"] in ("out_of_memory", "insufficient_memory"):
                skipped.append({"batch": b, "reason": err["code"]})
                last = c
                continue
            c["offline_skipped_batches"] = skipped
            return c
        c = last or self._fail(batches_desc[-1], s, "insufficient_memory", "no requested batch fits in memory")
        c["offline_skipped_batches"] = skipped
        return c

    def _would_not_fit(self, b: int, s: int | None) -> str | None:
        """Activations of the memory estimate scaled to this batch, against free memory."""
        free = self.worker.free_memory(self.device)
        if free is None:
            return None
        lim = self.entry.limits
        scale = b / max(1, lim.max_batch)
        if s and lim.max_seq_len:
            scale *= s / max(1, lim.max_seq_len + lim.max_new_tokens)
        need = activation_bytes(self.entry, self.worker.config_for(self.entry, self.info), self.dtype) * scale
        return f"estimated {int(need)} bytes of activations, {free} free" if need > free else None

    def _finish(self, b: int, s: int | None, res: dict) -> dict:
        out = res.pop("_output")
        ref, n_flops = self.reference.get(b, s)
        err = precision.compare(out, ref)
        mean_s = res["latency_ms"]["mean"] / 1000.0
        per_item = n_flops / b if n_flops and self.work == "forward" else None
        achieved = n_flops / mean_s if per_item and mean_s > 0 else None
        peak, source = (
            (None, "not counted for generate work")
            if self.work != "forward"
            else (flops.peak_flops(self.kind, self.name, self.dtype, self.matmul_precision))
        )
        compile_s = max(0.0, res["first_call_s"] - mean_s) if self.mode == "compile" else 0.0
        return {
            **self.base(b, s),
            **res,
            "compile_s": round(compile_s, 6),
            "load_s": self.load_s,
            "matmul_precision": self.matmul_precision,
            "execution_mode": self.execution_mode,
            "precision_reference": precision.REFERENCE if ref is not None else None,
            **err,
            "flops_per_item": int(per_item) if per_item else None,
            "achieved_flops_per_s": round(achieved, 1) if achieved else None,
            "peak_flops_per_s": peak,
            "peak_flops_source": source,
            "fraction_of_peak": round(achieved / peak, 6) if achieved and peak else None,
            "error": None,
        }


def _measure(
    adapter: Adapter,
    scenario: str,
    work: str,
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
    inputs = adapter.example(batch, seq_len, seed=SEED)
    if work == "generate":
        prompts = inputs.to("cpu").tolist()

        def step():
            return adapter.generate(prompts, max_new, lambda: token.cancelled)[0]
    else:

        def step():
            return adapter.forward_example(inputs)

    mem = MemoryProbe(device)
    first_call_s = None
    c0 = compile_counters()
    with torch.no_grad():
        # In compile mode the first call compiles this shape: never counted, even with warmup 0.
        compiling = adapter.mode == "compile"
        calls = max(warmup, 1) if compiling else warmup
        # Peak memory covers warmup and the window; in compile mode it starts after the compile
        # call, so the compiler's own memory is not charged to the model.
        if not compiling:
            mem.start()
        for i in range(calls):
            if token.cancelled:
                return None
            accel.synchronize(device)
            t0 = time.perf_counter()
            out = step()
            accel.materialize(out, device)
            accel.synchronize(device)
            if i == 0:
                first_call_s = time.perf_counter() - t0
            del out
            if i == 0 and compiling:
                mem.start()
            else:
                mem.sample()
        c1 = compile_counters()
        x1 = accel.tpu_cache_misses()
        samples: list[float] = []
        accel.synchronize(device)
        start = end = time.perf_counter()
        out = None
        while True:
            if iterations is not None and len(samples) >= iterations:
                break
            if duration is not None and samples and end - start >= duration:
                break
            if token.cancelled:
                return None
            out = None  # the previous output is freed before the next call, as a server would
            accel.synchronize(device)
            t0 = time.perf_counter()
            out = step()  # kept alive until after the synchronize below
            accel.materialize(out, device)  # fused eager mode: run the deferred graph now
            accel.synchronize(device)
            end = time.perf_counter()
            samples.append(end - t0)
            mem.sample()
            if first_call_s is None:
                first_call_s = samples[-1]
        c2 = compile_counters()
        x2 = accel.tpu_cache_misses()
        peak, increase, kind = mem.result()
    lat = latency_summary(samples)
    mean_s = sum(samples) / len(samples)
    window = end - start
    if scenario == "offline":
        throughput = batch * len(samples) / window if window > 0 else None
        basis = "items / wall time of the measured window"
    else:
        throughput = batch / mean_s if mean_s > 0 else None
        basis = "batch / mean latency"
    recompiles = _delta(c1, c2, "graphs")
    # TorchTPU compiles per op and shape in eager mode too, in a cache dynamo never sees.
    xla_compiles = x2 - x1 if x1 is not None and x2 is not None else None
    res = {
        "iterations": len(samples),
        "measured_s": round(window, 6),
        "latency_ms": lat,
        "throughput_items_per_s": round(throughput, 4) if throughput else None,
        "throughput_basis": basis,
        "first_call_s": round(first_call_s, 6),
        "graphs_compiled": _delta(c0, c1, "graphs"),
        "recompiles_in_window": recompiles,
        "xla_compiles_in_window": xla_compiles,
        "recompiled": recompiles > 0 or bool(xla_compiles),
        "graph_breaks": _delta(c0, c2, "graph_breaks"),
        "peak_memory_bytes": peak,
        "peak_memory_increase_bytes": increase,
        "peak_memory_kind": kind,
    }
    if work == "generate":
        tokens = sum(len(r) for r in out) if out else 0
        res["tokens_per_s"] = round(tokens / mean_s, 4) if mean_s > 0 else None
        with torch.no_grad():  # outputs to compare with the reference: the prompt's forward
            res["_output"] = _as_float_cpu(adapter.forward_example(inputs))
    else:
        res["_output"] = _as_float_cpu(out)
    return res
