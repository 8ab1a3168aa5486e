"""One benchmark configuration timed: warmup, then the measured window, with a device synchronize
before every clock read, peak memory and the graphs compiled on the way."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch

from ..adapters import Adapter
from ..generation.params import GenParams
from ..memory import MemoryProbe
from ..platforms import platform_for
from ..shapes import ShapeCounter
from .decode import LoopDecode, loop_counts, shapes_since, snapshot
from .host import HostSource, HostWindow
from .stability import Goal, settle
from .stability import report as stability_report

SEED = 0


def settle_series(timed, goal: Goal, host: HostSource, token):
    """One configuration's timed series, settled (stability.settle) over `host`'s window. A
    caller's cancel drops the series; the server's stop (budget, timeout) keeps what was
    measured, which is then reported and charged."""
    return settle(
        timed,
        goal,
        HostWindow(host),
        seed=SEED,
        stop=lambda: token.cancelled,
        keep=lambda: token.stopped is not None,
    )


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


def as_float_cpu(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor) and out.is_floating_point():
        return out.detach().to("cpu", torch.float32)
    return None


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
def recompile_room(n_shapes: int):
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


def measure(
    adapter: Adapter,
    *,
    scenario: str,
    work: str,
    batch: int,
    seq_len: int | None,
    warmup: int,
    goal: Goal,
    host: HostSource,
    max_new: int,
    token,
    sampling: GenParams | None = None,
    loop=None,
) -> dict | None:
    """Runs one configuration; returns None when cancelled. The window ends at `goal`, extended
    while the series is unstable (stability.py). Work "generate" runs on `loop`, the decode loop
    that serves callers (bench/decode.py)."""
    device = adapter.device
    plat = platform_for(device)
    inputs = adapter.example(batch, seq_len, seed=SEED)
    # This configuration's forwards, at the plan's buckets as a request's would be: the shape report.
    shapes = ShapeCounter()
    if work == "generate":
        # The loop records its forwards on the adapter's counter: this configuration's are the
        # difference (with a loaded model's loop, its callers' forwards in the meantime too).
        shapes_before, counts_before = snapshot(adapter.shapes), loop_counts(loop)
        step = LoopDecode(loop, inputs.to("cpu").tolist(), max_new, sampling, token)
    else:

        def step():
            return adapter.forward_planned(inputs, shapes)

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
            plat.synchronize(device)
            t0 = time.perf_counter()
            out = step()
            plat.materialize(out, device)
            plat.synchronize(device)
            if i == 0:
                first_call_s = time.perf_counter() - t0
            del out
            if i == 0 and compiling:
                mem.start()
            else:
                mem.sample()
        c1 = compile_counters()
        x1 = plat.compile_cache_misses()
        plat.synchronize(device)
        last: dict[str, Any] = {"out": None}

        def timed() -> float | None:
            kept, last["out"] = last["out"], None  # the previous output is freed first, as a server would
            plat.synchronize(device)
            t0 = time.perf_counter()
            out = step()  # kept alive until after the synchronize below
            plat.materialize(out, device)  # fused eager mode: run the deferred graph now
            plat.synchronize(device)
            took = time.perf_counter() - t0
            if work == "generate" and token.cancelled:
                # A generation cut short by a stop is no sample; the last whole one is kept.
                last["out"] = kept
                return None
            last["out"] = out
            mem.sample()
            return took

        settled = settle_series(timed, goal, host, token)
        if settled is None:
            return None
        samples = settled.samples_s
        out = last["out"]
        if first_call_s is None:
            first_call_s = samples[0]
        c2 = compile_counters()
        x2 = plat.compile_cache_misses()
        peak, increase, kind = mem.result()
    if work == "generate":
        shapes = shapes_since(adapter.shapes, shapes_before)
    lat = latency_summary(samples)
    mean_s = sum(samples) / len(samples)
    window = settled.window_s
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
        "stability": stability_report(settled),
        "shape_report": shape_report(shapes, _delta(c0, c2, "graphs")),
    }
    if work == "generate":
        tokens = sum(out) if out else 0
        res["tokens_per_s"] = round(tokens / mean_s, 4) if mean_s > 0 else None
        # The serving loop's counters over warmup and window: what it did for this configuration.
        after = loop_counts(loop)
        res["decode_loop"] = {k: after[k] - counts_before[k] for k in after}
        with torch.no_grad():  # outputs to compare with the reference: the prompt's forward
            res["_output"] = as_float_cpu(adapter.forward_planned(inputs, ShapeCounter()))
    else:
        res["_output"] = as_float_cpu(out)
    return res


def shape_report(shapes: ShapeCounter, compiles: int) -> dict:
    """What a TPU would compile for this configuration: the distinct shapes its forwards ran at
    (the plan's buckets), the graphs compiled, and how much of the padded work was real."""
    r = shapes.report()
    return {
        "distinct_shapes": r["distinct_shapes"],
        "shapes": [[s["kind"], s["batch"], s["length"]] for s in r["shapes"]],
        "compiles": compiles,
        "real_to_padded": r["real_to_padded"],
        "padding_waste": r["padding_waste"],
    }
