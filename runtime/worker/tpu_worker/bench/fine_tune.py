"""The benchmark's work "fine_tune": a short fine-tune of a causal LM on a catalog text dataset
(text_data.py), every (dtype, mode) of the grid trained from the same weights on the same
batches in the same order, held-out loss every `eval_every` steps.

The configurations run in lockstep: step k of every configuration before step k + 1 of any, and
a stop (budget, approval cap, timeout, the caller's cancel) is taken between rounds. A stopped
run therefore has every configuration at the same step, so float32 and bfloat16 compare over the steps taken and
no precision is lost to the order of the grid. Each configuration reports its status
("completed", "stopped", "cancelled", "failed", "not_started"), its steps, its losses so far.

Per configuration: the train loss of every step, the held-out loss before the first step and
every `eval_every` steps (and after the last), step time percentiles (the first step apart: in a
compiled mode it compiles, reported as compile_s), tokens/s (every token of a packed block is
real), FLOPs per step (counted, forward + backward), MFU against the peak (a device's table
peak; on a CPU a host figure, labelled so), the memory split (weights, gradients, optimizer
state), and for bfloat16 the drift of both loss series from float32's of the same mode.

Held-out loss is evaluated on the eager module, no gradients, under the configuration's
autocast; its time is not a step's.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from .. import flops, logs
from ..adapters import CausalLM
from ..errors import WorkerError, invalid, is_oom
from ..platforms import platform_for
from .keep import keep_weights
from .measure import SEED, latency_summary, recompile_room
from .text_data import documents, pack_and_split, resolve, token_stream
from .train_step import MemorySplit, Trainer, loss_curve, loss_drift, optimizer_report

OPTIMIZER = "adamw"
STATUSES = ("completed", "stopped", "cancelled", "failed", "not_started")


@dataclass
class _Config:
    dtype: str
    mode: str
    trainer: Trainer | None = None
    status: str = "not_started"
    error: dict | None = None
    losses: list[float] = field(default_factory=list)
    heldout: list[dict] = field(default_factory=list)  # {step, loss}
    step_s: list[float] = field(default_factory=list)
    split: MemorySplit | None = None  # after the last step, while its gradients are held

    @property
    def live(self) -> bool:
        return self.trainer is not None and self.error is None


def batch_at(train: torch.Tensor, step: int, rows: int, device) -> dict:
    """The step's batch: `rows` blocks of an epoch's order (a permutation seeded by SEED and the
    epoch), the same for every configuration."""
    n = int(train.shape[0])
    per_epoch = n // rows
    epoch, k = divmod(step, per_epoch)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(SEED + epoch))
    ids = train[order[k * rows : (k + 1) * rows]].to(device)
    return {"input_ids": ids, "labels": ids}


def heldout_loss(trainer: Trainer, heldout: torch.Tensor, rows: int) -> float:
    """Mean next-token loss over the held-out blocks, in batches of `rows` (equal sizes: the mean
    of the batch means is the mean over every target)."""
    total = 0.0
    batches = int(heldout.shape[0]) // rows
    with torch.no_grad():
        for i in range(batches):
            ids = heldout[i * rows : (i + 1) * rows].to(trainer.device)
            total += float(trainer._loss({"input_ids": ids, "labels": ids}, trainer.module))
    return total / batches


def run_fine_tune(worker, entry, info, device, p, ctx, manifest: dict) -> tuple[list[dict], bool]:
    """Every configuration's report and whether the run was cut short (stopped or cancelled)."""
    ds = resolve(worker.catalog.path, p.dataset)
    b, s = p.batch_sizes[0], p.seq_lens[0]
    own = device == worker.device
    kind = str(worker.device_info.get("kind") if own else "cpu")
    name = worker.device_info.get("name") if own else "cpu"
    plat = platform_for(device)
    matmul = plat.matmul_precision(device)
    configs = [_Config(d, m) for d in p.dtypes for m in p.modes]
    if p.keep and not any(c.dtype == p.keep["dtype"] and c.mode == p.keep["mode"] for c in configs):
        raise invalid(f"args.keep: {p.keep['dtype']} {p.keep['mode']} is not a configuration of this run's grid")
    manifest["optimizer"] = {**optimizer_report(OPTIMIZER), "lr": p.learning_rate}
    manifest["dataset"] = ds.report()
    cut = False
    with worker.adapter_for(entry, info, device, "float32", "eager", ctx.token) as lease:
        source = lease.adapter
        if not isinstance(source, CausalLM):
            raise invalid(f"work 'fine_tune' trains causal LMs; {entry.id} is not one")
        rows = source.plan.batch(b) if source.plan else b
        length = source.plan.length(s) if source.plan else s
        split = pack_and_split(token_stream(documents(ds), source.tokenizer, source.eos_id), length, rows, ds.id)
        manifest["fine_tune"] = {
            "weights": "float32 (a deep copy of the model per configuration; the served weights are never written)",
            "precision": "bfloat16 = autocast over float32 weights",
            "model_mode": "eval (dropout off)",
            "loss": "causal LM cross-entropy, next token of the dataset's text",
            "data": split.report(length, rows),
            "shapes": f"blocks of the length bucket ({length}) in batches of the batch bucket ({rows}): no padding",
            "steps": p.steps,
            "eval_every": p.eval_every,
            "order": "lockstep: step k of every configuration before step k+1 of any",
            "heldout_eval": "eager module, no gradients, the configuration's autocast; not timed as a step",
        }
        with recompile_room(len(configs)):
            cut = _train(configs, source, split, rows, p, ctx, plat, device)
        for c in configs:  # before the FLOP count, which clears the gradients
            if c.trainer is not None and c.losses:
                c.split = c.trainer.memory_split()
        step_flops = _count_flops(configs, split, rows, device)
        if p.keep:
            manifest["kept"] = _keep(worker, configs, p.keep, info.model_dir)
        tokens = rows * length
        out = [_report(c, p, b, s, tokens, step_flops, kind, name, matmul, device, lease.load_s) for c in configs]
    _drifts(out, configs)
    return out, cut


def not_started(p, device, why: str) -> list[dict]:
    """Every configuration of a run stopped before its model was lent: none trained."""
    return [
        {
            "batch": p.batch_sizes[0],
            "seq_len": p.seq_lens[0],
            "dtype": d,
            "mode": m,
            "scenario": p.scenario,
            "work": p.work,
            "device": str(device),
            "status": "not_started",
            "stopped_by": why,
            "steps_requested": p.steps,
            "train_steps": 0,
            "latency_ms": None,
            "error": None,
        }
        for d in p.dtypes
        for m in p.modes
    ]


def _keep(worker, configs, keep: dict, source_dir: str) -> dict:
    """The kept configuration's weights written (keep.py), or why not: only a completed run's are
    kept, since a stopped one's are the model part-way."""
    c = next(c for c in configs if c.dtype == keep["dtype"] and c.mode == keep["mode"])
    if c.status != "completed" or c.trainer is None:
        return {"id": keep["id"], "written": False, "reason": f"the {c.dtype} {c.mode} configuration {c.status}"}
    out = keep_weights(worker, c.trainer.model, source_dir, keep["id"])
    return {**out, "written": True, "dtype": c.dtype, "mode": c.mode, "steps": len(c.losses)}


def _stop_status(ctx) -> str:
    return "stopped" if ctx.token.stopped else "cancelled"


def trainer_for(source, dtype: str, mode: str, lr: float) -> Trainer:
    """A configuration's trainer: a float32 copy of `source`, AdamW at `lr`; a compiled mode
    compiles with the backend the device's platform object chooses (`tpu` on TorchTPU)."""
    return Trainer(source, dtype, mode, OPTIMIZER, lr=lr)


def _train(configs, source, split, rows, p, ctx, plat, device) -> bool:
    """Trains every configuration in lockstep; True when stopped or cancelled before the end."""
    for c in configs:
        if ctx.token.cancelled:
            break
        try:
            c.trainer = trainer_for(source, c.dtype, c.mode, p.learning_rate)
            c.heldout.append({"step": 0, "loss": _r(heldout_loss(c.trainer, split.heldout, rows))})
            c.status = "running"
        except Exception as exc:  # noqa: BLE001 - one bad configuration must not end the run
            _fail(c, exc, device)
    total = p.steps * len(configs)
    for step in range(p.steps):
        # Checked once a round: a stop lets the round finish, so every configuration has the
        # same steps (a round is one step of each: the stop waits for at most that).
        if ctx.token.cancelled:
            return _cut(configs, ctx)
        batch = batch_at(split.train, step, rows, device)
        for c in configs:
            if not c.live:
                continue
            try:
                plat.synchronize(device)
                t0 = time.perf_counter()
                loss = c.trainer.step(batch)
                plat.materialize(loss, device)
                plat.synchronize(device)
                c.step_s.append(time.perf_counter() - t0)
                c.losses.append(float(loss))  # read after the clock: no host transfer inside a step
                done = step + 1
                if done % p.eval_every == 0 or done == p.steps:
                    c.heldout.append({"step": done, "loss": _r(heldout_loss(c.trainer, split.heldout, rows))})
            except WorkerError as exc:
                c.error, c.status = exc.to_wire(), "failed"
            except Exception as exc:  # noqa: BLE001
                _fail(c, exc, device)
        ctx.progress((step + 1) * len(configs), total, _line(step + 1, p.steps, configs))
    if ctx.token.cancelled:
        return _cut(configs, ctx)
    for c in configs:
        if c.status == "running":
            c.status = "completed"
    return False


def _cut(configs, ctx) -> bool:
    why = _stop_status(ctx)
    for c in configs:
        if c.status in ("running", "not_started"):
            c.status = why if c.status == "running" else "not_started"
    return True


def _fail(c: _Config, exc: Exception, device) -> None:
    logs.error("fine_tune config failed", dtype=c.dtype, mode=c.mode, error=f"{type(exc).__name__}: {exc}")
    platform_for(device).release_memory(device)
    code, msg = (
        ("out_of_memory", f"{c.dtype} {c.mode} ran out of memory fine-tuning on {device}")
        if is_oom(exc)
        else ("internal", f"configuration failed ({type(exc).__name__}); see the worker log")
    )
    c.error = WorkerError(code, msg).to_wire()
    c.status = "failed"


def _count_flops(configs, split, rows, device) -> int | None:
    """FLOPs of one step (forward + backward, float32, counted once on a configuration's copy)."""
    c = next((c for c in configs if c.trainer is not None), None)
    if c is None:
        return None
    try:
        total, _ = c.trainer.count_flops(batch_at(split.train, 0, rows, device))
        return total or None
    except Exception as exc:  # noqa: BLE001 - a report without FLOPs is still a report
        logs.error("fine_tune flop count failed", error=f"{type(exc).__name__}: {exc}")
        return None


def _report(c: _Config, p, b, s, tokens, step_flops, kind, name, matmul, device, load_s) -> dict:
    t = c.trainer
    timed = c.step_s[1:] if len(c.step_s) > 1 else c.step_s  # the first step apart: it compiles
    lat = latency_summary(timed) if timed else None
    mean_s = lat["mean"] / 1000.0 if lat else None
    achieved = step_flops / mean_s if step_flops and mean_s else None
    peak, source = flops.peak_flops(kind, name, c.dtype, matmul)
    mfu = achieved / peak if achieved and peak else None
    fault = None
    if mfu is not None and mfu > 1:
        fault = f"measured {achieved:.3g} FLOP/s exceeds the peak of {peak:.3g} ({source}): a measurement fault"
        mfu = None
    split = c.split
    first = c.step_s[0] if c.step_s else None
    h = c.heldout
    return {
        "batch": b,
        "seq_len": s,
        "dtype": c.dtype,
        "mode": c.mode,
        "scenario": p.scenario,
        "work": p.work,
        "device": str(device),
        "status": c.status,
        "steps_requested": p.steps,
        "train_steps": len(c.losses),
        "iterations": len(timed),
        "latency_ms": lat,
        "first_call_s": round(first, 6) if first is not None else None,
        "compile_s": round(max(0.0, first - mean_s), 6) if c.mode != "eager" and first and mean_s else 0.0,
        "compile_backend": t.compile_backend if t else None,
        "compile_scope": t.compile_scope if t else None,
        "tokens_per_s": round(tokens / mean_s, 4) if mean_s else None,
        "throughput_items_per_s": round(tokens / (s or 1) / mean_s, 4) if mean_s else None,
        "throughput_basis": "packed blocks (every token real) / mean step time",
        "load_s": load_s,
        "matmul_precision": matmul,
        "flops_per_step": step_flops,
        "achieved_flops_per_s": round(achieved, 1) if achieved else None,
        "peak_flops_per_s": peak,
        "peak_flops_source": source,
        "fraction_of_peak": round(mfu, 6) if mfu is not None else None,
        "fraction_of_peak_fault": fault,
        # On a CPU the peak is a matmul measured on this host (flops.peak_flops), not a table's.
        "mfu_basis": (
            "host figure: a matmul peak measured on this CPU" if kind == "cpu" else f"device table peak ({source})"
        ),
        "memory_split": (
            {
                "weights_bytes": split.weights_bytes,
                "gradients_bytes": split.gradients_bytes,
                "optimizer_state_bytes": split.optimizer_state_bytes,
            }
            if split
            else None
        ),
        "loss_first": c.losses[0] if c.losses else None,
        "loss_final": c.losses[-1] if c.losses else None,
        "loss_curve": loss_curve(c.losses),
        "heldout_loss": h,
        "heldout_first": h[0]["loss"] if h else None,
        "heldout_final": h[-1]["loss"] if h else None,
        "heldout_improved": (h[-1]["loss"] < h[0]["loss"]) if len(h) > 1 else None,
        "error": c.error,
    }


def _drifts(out: list[dict], configs: list[_Config]) -> None:
    """bfloat16's train and held-out losses against float32's of the same mode, step for step."""
    fp32 = {c.mode: c for c in configs if c.dtype == "float32"}
    for r, c in zip(out, configs, strict=True):
        if c.dtype == "float32":
            continue
        ref = fp32.get(c.mode)
        r["loss_drift_vs_fp32"] = loss_drift(c.losses, ref.losses if ref else None)
        r["heldout_drift_vs_fp32"] = loss_drift(
            [x["loss"] for x in c.heldout], [x["loss"] for x in ref.heldout] if ref else None
        )
        if ref is None:
            r["loss_drift_note"] = "no float32 configuration of this mode ran"


def _r(x: float) -> float | None:
    return float(f"{x:.6g}") if math.isfinite(x) else None


def _line(step: int, steps: int, configs) -> str:
    parts = [
        f"{c.dtype}/{c.mode} {c.losses[-1]:.4f}" if c.losses else f"{c.dtype}/{c.mode} {c.status}" for c in configs
    ]
    return f"fine_tune step {step}/{steps}: " + ", ".join(parts)


__all__ = ["STATUSES", "not_started", "run_fine_tune"]
