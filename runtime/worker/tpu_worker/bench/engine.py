"""The benchmark's grid: one adapter per (dtype, mode), each of its configurations measured, a
failed one reported in place, the manifest that says what ran where."""

from __future__ import annotations

import contextlib
import os
import platform
from dataclasses import dataclass
from typing import Any

import torch

from .. import __version__, flops, logs, precision
from ..errors import WorkerError, is_oom
from ..memory import activation_bytes
from ..platforms import platform_for
from ..protocol import now_iso
from .args import Plan, plan
from .decode import serving_loop
from .fine_tune import not_started, run_fine_tune
from .host import HostSource, ProcHost
from .measure import SEED, measure, recompile_room
from .reference import Reference
from .stability import Goal
from .train_bench import run_train


def run_benchmark(worker, args: dict, ctx) -> dict:
    entry = worker.catalog.get(args.get("model"))
    device = worker.target_device(args.get("device"))
    p = plan(entry, args)
    total = p.configs
    # Process-wide, like torch.set_float32_matmul_precision itself; reported as in force below.
    precision_requested = worker.matmul_precision_arg(p.matmul_precision)
    _, info = worker.entry_and_weights(entry.id)
    manifest = _manifest(worker, entry, info, device, p, precision_requested)
    if p.work in ("train_step", "fine_tune"):
        return _train_report(worker, entry, info, device, p, ctx, manifest)
    configs: list[dict] = []
    cancelled = False
    done = 0
    reference = Reference(worker, entry, info, ctx.token)
    host = ProcHost()
    ctx.progress(0, total, f"benchmarking {entry.id}: {total} configuration(s), {p.scenario}, {p.work}")
    try:
        for dtype, mode in [(d, m) for d in p.dtypes for m in p.modes]:
            with contextlib.ExitStack() as held:
                try:
                    lease = held.enter_context(worker.adapter_for(entry, info, device, dtype, mode, ctx.token))
                except WorkerError as exc:
                    if exc.code == "cancelled":
                        cancelled = True
                        break
                    for b, s in _points(p.scenario, p.batch_sizes, p.seq_lens):
                        configs.append(_failed(b, s, dtype, mode, p.scenario, p.work, device, exc))
                        done += 1
                    ctx.progress(done, total, f"{dtype}/{mode}: {exc.code}")
                    continue
                if mode == "compile":
                    held.enter_context(recompile_room(len(p.batch_sizes) * len(p.seq_lens)))
                loop = held.enter_context(serving_loop(worker, entry, lease)) if p.work == "generate" else None
                run = _Run(
                    worker=worker,
                    entry=entry,
                    info=info,
                    lease=lease,
                    device=device,
                    dtype=dtype,
                    mode=mode,
                    plan=p,
                    reference=reference,
                    ctx=ctx,
                    host=host,
                    loop=loop,
                )
                for c in run.series():
                    if c is None:
                        cancelled = True
                        break
                    configs.append(c)
                    done += 1
                    ctx.progress(done, total, _progress_line(c))
                    if ctx.token.stopped:  # the server stopped it: the grid ends here
                        cancelled = True
                        break
            if cancelled:
                break
    finally:
        reference.close()
    manifest["peak_memory_kind"] = next((c["peak_memory_kind"] for c in configs if c.get("peak_memory_kind")), None)
    if reference.unavailable:
        manifest["precision_reference"] = f"{precision.REFERENCE}: {reference.unavailable}"
    manifest["finished_at"] = now_iso()
    # Stopped by the server (budget, timeout) rather than cancelled: the partial report says so.
    stopped = ctx.token.stopped if cancelled else None
    return {
        "manifest": manifest,
        "configs": configs,
        "cancelled": cancelled and stopped is None,
        **({"stopped": stopped} if stopped else {}),
    }


def _train_report(worker, entry, info, device, p, ctx, manifest) -> dict:
    """Works "train_step" (train_bench.py) and "fine_tune" (fine_tune.py): their grids train
    copies; no float32 output reference."""
    ctx.progress(0, p.configs, f"training {entry.id}: {p.configs} configuration(s), optimizer {p.optimizer}")
    try:
        if p.work == "fine_tune":
            configs, cut = run_fine_tune(worker, entry, info, device, p, ctx, manifest)
        else:
            configs, cut = run_train(worker, entry, info, device, p, ctx, manifest, _failed)
    except WorkerError as exc:
        if exc.code != "cancelled":
            raise
        configs, cut = [], True
    if p.work == "fine_tune" and not configs:  # stopped before training began: each one says so
        configs = not_started(p, device, "stopped" if ctx.token.stopped else "cancelled")
    manifest["precision_reference"] = "loss_drift_vs_fp32: the float32 loss series of the same shape and mode"
    manifest["peak_memory_kind"] = next((c["peak_memory_kind"] for c in configs if c.get("peak_memory_kind")), None)
    manifest["finished_at"] = now_iso()
    stopped = ctx.token.stopped if cut else None
    return {
        "manifest": manifest,
        "configs": configs,
        "cancelled": cut and stopped is None,
        **({"stopped": stopped} if stopped else {}),
    }


def _manifest(worker, entry, info, device, p, precision_requested) -> dict:
    """What ran where: versions, device, threads, seed, the request as resolved."""
    on_worker_device = device == worker.device
    dev_info = worker.device_info if on_worker_device else {"kind": "cpu", "name": "cpu", "count": 1}
    compiles = any(m != "eager" for m in p.modes)  # "compile", or a training step's whole-step mode
    try:
        import transformers

        transformers_version = transformers.__version__
    except Exception:  # noqa: BLE001
        transformers_version = None
    return {
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
        "scenario": p.scenario,
        "work": p.work,
        "warmup": p.warmup,
        "iterations": p.iterations,
        "duration_s": p.duration,
        "extend_factor": p.extend_factor,
        "max_new_tokens": p.max_new if p.work == "generate" else None,
        # The decode of work "generate": {temperature, seed} (seed null when greedy); "seed" below
        # is that of the synthetic inputs and the bootstrap.
        "sampling": p.sampling_report,
        "execution_mode": platform_for(device).execution_mode(device),
        "eager_mode": platform_for(device).eager_mode_report(device),
        "compile_backend": platform_for(device).compile_backend(device) if compiles else None,
        "compile_dynamic": False if compiles else None,
        "matmul_precision": platform_for(device).matmul_precision(device),
        "matmul_precision_requested": precision_requested,
        "seed": SEED,
        "precision_reference": precision.REFERENCE,
        "started_at": now_iso(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "peak_memory_kind": None,
    }


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
    st = c.get("stability") or {}
    unstable = f", unstable: {st['reason']}" if st.get("stable") is False else ""
    return f"{head}: p50 {lat['p50']:.3f} ms, {c['throughput_items_per_s']:.1f} items/s{unstable}"


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


@dataclass
class _Run:
    """One (dtype, mode) of the grid on one adapter."""

    worker: Any
    entry: Any
    info: Any
    lease: Any  # ops.Lease: the adapter, lent for this (dtype, mode) only
    device: torch.device
    dtype: str
    mode: str
    plan: Plan
    reference: Reference
    ctx: Any
    host: HostSource
    loop: Any = None  # work "generate": the decode loop that serves callers (decode.py)

    @property
    def adapter(self):
        return self.lease.adapter

    @property
    def scenario(self) -> str:
        return self.plan.scenario

    @property
    def work(self) -> str:
        return self.plan.work

    def __post_init__(self) -> None:
        own = self.device == self.worker.device
        self.kind = str(self.worker.device_info.get("kind") if own else "cpu")
        self.name = self.worker.device_info.get("name") if own else "cpu"
        self.matmul_precision = platform_for(self.device).matmul_precision(self.device)
        self.execution_mode = platform_for(self.device).execution_mode(self.device)

    def base(self, b, s) -> dict:
        return {
            "batch": b,
            "seq_len": s,
            "dtype": self.dtype,
            "mode": self.mode,
            "scenario": self.scenario,
            "work": self.work,
            "device": str(self.device),
            "warmup": self.plan.warmup,
        }

    def _fail(self, b, s, code: str, message: str) -> dict:
        return _failed(b, s, self.dtype, self.mode, self.scenario, self.work, self.device, WorkerError(code, message))

    def series(self):
        """This (dtype, mode)'s configurations in order; a None ends them (cancelled)."""
        for s in self.plan.seq_lens:
            if self.scenario == "single-stream":
                for b in self.plan.batch_sizes:
                    yield self.one(b, s)
            else:
                yield self.offline(sorted(self.plan.batch_sizes, reverse=True), s)

    def goal(self) -> Goal:
        """The measured window of one configuration: the request's, extended while unstable."""
        p = self.plan
        return Goal(p.iterations, p.duration, p.extend_factor, p.max_iterations, p.max_duration_s)

    def one(self, b: int, s: int | None) -> dict | None:
        """Measures one configuration; None when cancelled; a config with `error` when it failed."""
        try:
            res = measure(
                self.adapter,
                scenario=self.scenario,
                work=self.work,
                batch=b,
                seq_len=s,
                warmup=self.plan.warmup,
                goal=self.goal(),
                host=self.host,
                max_new=self.plan.max_new,
                token=self.ctx.token,
                sampling=self.plan.sampling,
                loop=self.loop,
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
            platform_for(self.device).release_memory(self.device)
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
        # The FLOPs are the padded forward's (what ran): per item of the batch bucket.
        plan = self.adapter.plan
        per_item = n_flops / (plan.batch(b) if plan else b) if n_flops and self.work == "forward" else None
        achieved = n_flops / mean_s if per_item and mean_s > 0 else None
        peak, source = (
            (None, "not counted for generate work")
            if self.work != "forward"
            else (flops.peak_flops(self.kind, self.name, self.dtype, self.matmul_precision))
        )
        compile_s = max(0.0, res["first_call_s"] - mean_s) if self.mode == "compile" else 0.0
        fraction, fault = fraction_of_peak(achieved, peak, source)
        return {
            **self.base(b, s),
            **res,
            "compile_s": round(compile_s, 6),
            "load_s": self.lease.load_s,
            "matmul_precision": self.matmul_precision,
            "execution_mode": self.execution_mode,
            "precision_reference": precision.REFERENCE if ref is not None else None,
            **err,
            "flops_per_item": int(per_item) if per_item else None,
            "achieved_flops_per_s": round(achieved, 1) if achieved else None,
            "peak_flops_per_s": peak,
            "peak_flops_source": source,
            "fraction_of_peak": round(fraction, 6) if fraction is not None else None,
            "fraction_of_peak_fault": fault,
            "error": None,
        }


def fraction_of_peak(achieved: float | None, peak: float | None, source: str) -> tuple[float | None, str | None]:
    """(the fraction of peak, the fault when it cannot be true). No run beats its device's peak:
    above 1 the figure is a measurement fault (on a CPU, a peak measured while other work ran),
    flagged and never reported as a fraction, as train_bench.py does for training steps."""
    fraction = achieved / peak if achieved and peak else None
    if fraction is None or fraction <= 1:
        return fraction, None
    return None, (
        f"measured {achieved:.3g} FLOP/s exceeds the peak of {peak:.3g} ({source}): a measurement fault "
        "(on a CPU, a peak measured while other work ran), so no fraction is reported"
    )
