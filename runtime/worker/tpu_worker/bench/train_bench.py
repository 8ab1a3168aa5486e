"""The benchmark's work "train_step": every (dtype, mode, seq_len, batch) of the grid trains a
fresh float32 copy of the model for warmup + the measured window, timed step by step as the
forward work is (a device synchronize before every clock read), with the loss of every step kept.

Per configuration: step time percentiles, samples/s and tokens/s, compile time apart, peak memory
split into weights / gradients / optimizer state / activations, the loss series and, for
bfloat16, its drift from the float32 series of the same shape and mode (the same initial weights,
batch and steps), FLOPs per step (forward + backward, counted) and the fraction of peak; a
fraction above 1 is a measurement fault, flagged and never reported as a figure.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from .. import flops, logs
from ..errors import WorkerError, is_oom
from ..memory import MemoryProbe
from ..platforms import platform_for
from ..shapes import ShapeCounter
from .host import HostSource, ProcHost
from .measure import SEED, compile_counters, latency_summary, recompile_room, settle_series, shape_report
from .stability import Goal
from .stability import report as stability_report
from .train_step import Trainer, loss_curve, loss_drift, loss_name, optimizer_report, planned_batch


def run_train(worker, entry, info, device, p, ctx, manifest: dict, failed) -> tuple[list[dict], bool]:
    """The grid's configurations and whether it was cut short (cancelled or stopped)."""
    total = p.configs
    configs: list[dict] = []
    done = 0
    fp32_losses: dict[tuple, list[float]] = {}
    flop_cache: dict[tuple, tuple[int, int]] = {}
    host = ProcHost()
    own = device == worker.device
    kind = str(worker.device_info.get("kind") if own else "cpu")
    name = worker.device_info.get("name") if own else "cpu"
    plat = platform_for(device)
    matmul = plat.matmul_precision(device)
    manifest["optimizer"] = optimizer_report(p.optimizer)
    manifest["train"] = {
        "weights": "float32 (a deep copy of the model; the served weights are never written)",
        "precision": "bfloat16 = autocast over float32 weights",
        "model_mode": "eval (dropout off: the loss is a function of weights and batch)",
        "batch": "one synthetic batch (seed 0), the same every step",
        "shapes": (
            "the batch padded to the model's shape plan (batch and length buckets), the padding masked out of "
            "the loss (ignored targets, zero row weights): the loss is the unpadded batch's"
        ),
    }
    # The loaded model (or a temporary copy) as float32 eager: the weights every copy starts from.
    with worker.adapter_for(entry, info, device, "float32", "eager", ctx.token) as lease:
        source = lease.adapter
        manifest["train"]["loss"] = loss_name(source)
        with recompile_room(len(p.batch_sizes) * len(p.seq_lens) * len(p.dtypes)):
            for dtype in p.dtypes:
                for mode in p.modes:
                    for s in p.seq_lens:
                        for b in p.batch_sizes:
                            c = _one(source, b, s, dtype, mode, p, ctx, host, kind, name, matmul, flop_cache, failed)
                            if c is None:
                                return configs, True
                            if c.get("error") is None:
                                losses = c.pop("_losses")
                                if dtype == "float32":
                                    fp32_losses[(b, s, mode)] = losses
                                else:
                                    ref = fp32_losses.get((b, s, mode))
                                    c["loss_drift_vs_fp32"] = loss_drift(losses, ref)
                                    if ref is None:
                                        c["loss_drift_note"] = "no float32 configuration of this shape and mode ran"
                            c["load_s"] = lease.load_s
                            configs.append(c)
                            done += 1
                            ctx.progress(done, total, _line(c))
                            if ctx.token.stopped:
                                return configs, True
    return configs, False


def _one(source, b, s, dtype, mode, p, ctx, host, kind, name, matmul, flop_cache, failed) -> dict | None:
    device = source.device
    try:
        trainer = Trainer(source, dtype, mode, p.optimizer)
        planned = planned_batch(source, b, s, SEED)
        batch = planned.batch
        key = (b, s)
        if key not in flop_cache:
            flop_cache[key] = trainer.count_flops(batch)
        res = measure_train(
            trainer,
            batch,
            warmup=p.warmup,
            goal=Goal(p.iterations, p.duration, p.extend_factor, p.max_iterations, p.max_duration_s),
            host=host,
            token=ctx.token,
        )
    except WorkerError as exc:
        if exc.code == "cancelled":
            return None
        return failed(b, s, dtype, mode, p.scenario, p.work, device, exc)
    except Exception as exc:  # noqa: BLE001 - one bad config must not end the run
        logs.error(
            "train_step config failed", model=source.entry.id, batch=b, seq_len=s, dtype=dtype, mode=mode,
            error=f"{type(exc).__name__}: {exc}",
        )  # fmt: skip
        platform_for(device).release_memory(device)
        code, msg = (
            ("out_of_memory", f"batch {b} ran out of memory training on {device}")
            if is_oom(exc)
            else ("internal", f"configuration failed ({type(exc).__name__}); see the worker log")
        )
        return failed(b, s, dtype, mode, p.scenario, p.work, device, WorkerError(code, msg))
    if res is None:
        return None
    mean_s = res["latency_ms"]["mean"] / 1000.0
    step_flops, forward_flops = flop_cache[(b, s)]
    achieved = step_flops / mean_s if step_flops and mean_s > 0 else None
    peak, source_of_peak = flops.peak_flops(kind, name, dtype, matmul)
    fraction = achieved / peak if achieved and peak else None
    fault = None
    if fraction is not None and fraction > 1:
        fault = (
            f"measured {achieved:.3g} FLOP/s exceeds the peak of {peak:.3g} ({source_of_peak}): a timing or "
            "FLOP-count fault, so no fraction is reported"
        )
        fraction = None
    # Real tokens (the padding is work the device did, but no sample's): per second, and what a
    # TPU would compile, as a forward configuration reports it.
    shapes = ShapeCounter()
    for _ in range(res["train_steps"]):
        shapes.record("train_step", planned.bucket, planned.length, planned.real)
    tokens = planned.real if planned.length else None
    compile_s = max(0.0, res["first_call_s"] - mean_s) if mode != "eager" else 0.0
    return {
        "batch": b,
        "seq_len": s,
        "dtype": dtype,
        "mode": mode,
        "scenario": p.scenario,
        "work": p.work,
        "device": str(device),
        "warmup": p.warmup,
        **res,
        "throughput_items_per_s": round(b / mean_s, 4) if mean_s > 0 else None,
        "throughput_basis": "samples / mean step time",
        "tokens_per_s": round(tokens / mean_s, 4) if tokens and mean_s > 0 else None,
        "compile_s": round(compile_s, 6),
        "compile_backend": trainer.compile_backend,
        "compile_scope": trainer.compile_scope,
        "optimizer_capturable": trainer.capturable,
        "shape_report": shape_report(shapes, res["graphs_compiled"]),
        "matmul_precision": matmul,
        "optimizer": p.optimizer,
        "flops_per_step": step_flops or None,
        "forward_flops_per_step": forward_flops or None,
        "flops_per_item": int(step_flops / b) if step_flops else None,
        "achieved_flops_per_s": round(achieved, 1) if achieved else None,
        "peak_flops_per_s": peak,
        "peak_flops_source": source_of_peak,
        "fraction_of_peak": round(fraction, 6) if fraction is not None else None,
        "fraction_of_peak_fault": fault,
        "error": None,
    }


def measure_train(trainer: Trainer, batch: dict, *, warmup: int, goal: Goal, host: HostSource, token) -> dict | None:
    """Trains `trainer` one step at a time: warmup (and in compile mode one uncounted step that
    compiles), then the measured window; None when cancelled. A stop for budget or time keeps
    the steps measured so far (they trained and are charged)."""
    device = trainer.device
    plat = trainer.platform
    losses: list[float] = []
    mem = MemoryProbe(device)

    def one_step() -> tuple[float, torch.Tensor]:
        plat.synchronize(device)
        t0 = time.perf_counter()
        loss = trainer.step(batch)
        plat.materialize(loss, device)  # fused eager mode: run the deferred graph now
        plat.synchronize(device)
        return time.perf_counter() - t0, loss

    c0 = compile_counters()
    # In compile mode the first step compiles: never counted, even with warmup 0.
    calls = max(warmup, 1) if trainer.mode != "eager" else warmup
    first_call_s = None
    for i in range(calls):
        if token.cancelled:
            return None
        took, loss = one_step()
        losses.append(float(loss))  # read after the clock: no host transfer inside a step
        if i == 0:
            first_call_s = took
    # After a step, weights, gradients and optimizer state are resident: the peak's increase over
    # the window's start is then what a step's activations take.
    resident = calls > 0
    mem.start()
    c1 = compile_counters()
    x1 = plat.compile_cache_misses()

    def timed() -> float | None:
        took, loss = one_step()
        losses.append(float(loss))
        mem.sample()
        return took

    settled = settle_series(timed, goal, host, token)
    if settled is None:
        return None
    samples = settled.samples_s
    c2 = compile_counters()
    x2 = plat.compile_cache_misses()
    peak, increase, kind = mem.result()
    if first_call_s is None:
        first_call_s = samples[0]
    split = trainer.memory_split()  # after the last step: its gradients are still held
    activations = increase
    if increase is not None and not resident:  # the window's first step allocated them too
        activations = max(0, increase - (split.gradients_bytes or 0) - (split.optimizer_state_bytes or 0))
    recompiles = int(c2["graphs"] - c1["graphs"])
    xla = x2 - x1 if x1 is not None and x2 is not None else None
    res: dict[str, Any] = {
        "iterations": len(samples),
        "measured_s": round(settled.window_s, 6),
        "latency_ms": latency_summary(samples),
        "first_call_s": round(first_call_s, 6),
        "graphs_compiled": int(c1["graphs"] - c0["graphs"]),
        "recompiles_in_window": recompiles,
        "xla_compiles_in_window": xla,
        "recompiled": recompiles > 0 or bool(xla),
        "graph_breaks": int(c2["graph_breaks"] - c0["graph_breaks"]),
        "peak_memory_bytes": peak,
        "peak_memory_increase_bytes": increase,
        "peak_memory_kind": kind,
        "memory_split": {
            "weights_bytes": split.weights_bytes,
            "gradients_bytes": split.gradients_bytes,
            "optimizer_state_bytes": split.optimizer_state_bytes,
            # The window's peak over its start (weights, gradients and state already resident).
            "activations_bytes": activations,
            "activations_basis": (
                "peak allocated over the window's start (device counters)"
                if kind == plat.peak_counter_kind
                else f"{kind}: the peak's increase over the window's start, a lower bound"
            ),
        },
        "train_steps": len(losses),
        "loss_first": losses[0] if losses else None,
        "loss_final": losses[-1] if losses else None,
        "loss_curve": loss_curve(losses),
        "stability": stability_report(settled),
        "_losses": losses,
    }
    return res


def _line(c: dict) -> str:
    seq = f" seq_len={c['seq_len']}" if c.get("seq_len") else ""
    head = f"train_step batch={c['batch']}{seq} {c['dtype']} {c['mode']}"
    if c.get("error"):
        return f"{head}: {c['error']['code']}"
    lat = c["latency_ms"]
    return f"{head}: p50 {lat['p50']:.3f} ms/step, {c['throughput_items_per_s']:.1f} samples/s"
