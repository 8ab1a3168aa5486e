"""A model served by this worker's own PyTorch: an adapter behind its batcher (served.Served).

Generation models get the continuous-batching decode loop (generation/loop.py), every other
model the dynamic batcher (batching.py); both take the transport's reply grouping when they are
built and are the only thread a model's forward runs on for `infer`.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any

import torch

from .adapters import Adapter, CausalLM
from .batching import Batcher
from .bench import run_benchmark
from .catalog import Entry
from .compiles import CompileCounter, cache_hits, compile_cache_report, use_cache_dir
from .errors import invalid
from .generation.loop import DecodeLoop
from .loaders import WeightsInfo
from .platforms import PRECISIONS, platform_for
from .protocol import now_iso, now_us
from .served import Lease, LoadContext, ReplyScope, Served
from .spans import span

MODES = ("eager", "compile")


def _int_arg(args: dict, key: str, lo: int, hi: int) -> int | None:
    v = args.get(key)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise invalid(f"args.{key} must be an integer in {lo}..{hi}")
    return v


def warmup_shapes_arg(entry: Entry, raw: Any) -> list[dict]:
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > 16:
        raise invalid("args.warmup_shapes must be a list of at most 16 {batch, seq_len?} objects")
    shapes = []
    for i, s in enumerate(raw):
        if not isinstance(s, dict):
            raise invalid(f"args.warmup_shapes[{i}] must be an object")
        b = _int_arg(s, "batch", 1, entry.limits.max_batch)
        if b is None:
            raise invalid(f"args.warmup_shapes[{i}].batch is required")
        seq = None
        if entry.limits.max_seq_len:
            seq = _int_arg(s, "seq_len", 2, entry.limits.max_seq_len)
        shapes.append({"batch": b, "seq_len": seq})
    return shapes


def make_batcher(entry: Entry, adapter: Adapter, batching: bool, reply_scope: ReplyScope) -> Batcher | DecodeLoop:
    """Generation gets continuous batching (sequences join and leave at token boundaries);
    every other model the dynamic batcher (whole requests coalesced into one forward)."""
    if isinstance(adapter, CausalLM):
        return DecodeLoop(
            entry.id, adapter, max_batch=entry.batching.max_batch, enabled=batching, reply_scope=reply_scope
        )
    return Batcher(
        entry.id,
        adapter.run_batch,
        max_batch=entry.batching.max_batch,
        max_wait_ms=entry.batching.max_wait_ms,
        enabled=batching,
        reply_scope=reply_scope,
        warm=adapter.warm,
    )


@dataclass(eq=False)
class TorchModel(Served):
    entry: Entry
    adapter: Adapter
    batcher: Batcher | DecodeLoop
    device: str
    dtype: str
    mode: str
    estimated_bytes: int
    loaded_at: str
    info: WeightsInfo
    report: dict
    compiles: CompileCounter | None = None  # mode "compile": graphs at load, recompiles since

    @classmethod
    def load(cls, lc: LoadContext) -> TorchModel:
        w, entry, args, ctx = lc.worker, lc.entry, lc.args, lc.ctx
        device = w.target_device(args.get("device"))
        shapes = warmup_shapes_arg(entry, args.get("warmup_shapes"))
        batching = args.get("batching", True)
        if not isinstance(batching, bool):
            raise invalid("args.batching must be true or false")
        precision_arg = args.get("matmul_precision")
        if precision_arg is not None and precision_arg not in PRECISIONS:
            w.matmul_precision_arg(precision_arg)  # raises the clear error
        estimated = w.check_memory(entry, lc.info, lc.dtype, device)
        w.matmul_precision_arg(precision_arg)
        ctx.progress(0, 3, f"loading {entry.id} ({lc.dtype}, {lc.mode}) on {device}")
        compiled = lc.mode == "compile"
        counter = CompileCounter(entry.id, strict=entry.shapes.strict) if compiled else None
        cache_dir = use_cache_dir() if compiled else None
        hits = cache_hits()
        backend0 = platform_for(device).compile_cache_stats() if compiled else None
        adapter, timings = w.build(entry, lc.info, device, lc.dtype, lc.mode, shapes, ctx.token, counter)
        batcher = make_batcher(entry, adapter, batching, lc.reply_scope)
        plat = platform_for(device)
        warmed = 0
        if counter is not None:
            # Compile once, at load: every shape of the plan now, none in a caller's request.
            t0 = time.perf_counter()
            try:
                c0 = now_us()
                warmed = batcher.warm(ctx.progress, ctx.token)
                s0 = now_us()
                span(ctx.trace, "compile", c0, s0, model=entry.id, shapes=warmed)
                plat.synchronize(device)
                span(ctx.trace, "device.synchronize", s0, now_us())
            except BaseException:
                batcher.close(f"loading {entry.id!r} failed")
                raise
            timings["compile_s"] = round(timings["compile_s"] + time.perf_counter() - t0, 6)
            counter.loaded()
        seal = getattr(batcher, "seal", None)
        if seal is not None:
            # The decode step's work around the forward, warmed at every bucket (eager mode too: an
            # eager TPU backend compiles per op and shape); from now on a new op shape is counted.
            seal()
            if counter is not None:
                counter.census = batcher.census
        report = {
            "parameters": adapter.parameters(),
            "bytes_on_device": adapter.bytes_on_device(),
            "estimated_bytes": estimated,
            **timings,
            "matmul_precision": plat.matmul_precision(device),
            "matmul_precision_requested": precision_arg,
            "compile_backend": plat.compile_backend(device) if compiled else None,
            "compile_dynamic": getattr(adapter, "compile_dynamic", None) if compiled else None,
            "execution_mode": plat.execution_mode(device),
            "eager_mode": plat.eager_mode_report(device),
            "batching": batcher.describe(),
            "shape_plan": adapter.plan.report() if adapter.plan else None,
        }
        if counter is not None:
            report["graphs_compiled"] = counter.at_load
            report["shapes_warmed"] = warmed
            report["compile_cache"] = compile_cache_report(cache_dir, cache_hits() - hits, plat, backend0)
        return cls(
            entry, adapter, batcher, w.label(device), lc.dtype, lc.mode, estimated, now_iso(), lc.info, report, counter
        )

    @property
    def answers_cancel(self) -> bool:  # type: ignore[override]
        # A generation answers a cancel with its partial text at the next token.
        return isinstance(self.batcher, DecodeLoop)

    def submit(self, args, tensors, token, trace, progress):
        return self.batcher.submit(self.adapter.prepare(args, tensors), token, trace, progress)

    def benchmark(self, worker, args: dict, ctx) -> dict:
        return run_benchmark(worker, args, ctx)  # lends this model's adapter where it matches

    @classmethod
    def benchmark_unloaded(cls, worker, entry: Entry, args: dict, ctx) -> dict:
        return run_benchmark(worker, args, ctx)  # on a temporary copy

    def unload(self, reason: str) -> int:
        freed = self.adapter.bytes_on_device()
        self.batcher.close(reason)
        device = self.adapter.device
        self.adapter = None  # type: ignore[assignment]  # the last reference, before the cache is emptied
        platform_for(device).release_memory(device)
        return freed

    def load_report(self) -> dict:
        return self.report

    def status_row(self) -> dict:
        return {
            "model": self.entry.id,
            "device": self.device,
            "dtype": self.dtype,
            "mode": self.mode,
            "parameters": self.adapter.parameters(),
            "bytes_on_device": self.adapter.bytes_on_device(),
            "queue_depth": self.batcher.queue_depth,
            "batching": {**self.batcher.describe(), **vars(self.batcher.stats)},
            "shape_plan": self.adapter.plan.report() if self.adapter.plan else None,
            "shapes": self.adapter.shapes.report(),
            **({"compiles": self.compiles.report()} if self.compiles is not None else {}),
            **({"prefix_cache": self.batcher.prefix_report()} if hasattr(self.batcher, "prefix_report") else {}),
            "loaded_at": self.loaded_at,
        }

    def weights_checksum(self) -> str | None:
        return state_checksum(self.adapter.eager_model)

    def describe(self) -> dict:
        # How it is served now: for generation, whether the decode loop's KV cache is static
        # (and why not, where it cannot be).
        plan = self.adapter.plan
        return {"serving": self.batcher.describe(), "shape_plan": plan.report() if plan else None}

    def lend(self, device: torch.device, dtype: str, mode: str) -> Lease | None:
        a = self.adapter
        if a is None or a.device != device or self.dtype != dtype or self.mode != mode:
            return None
        return Lease(a, self.report.get("load_s"), self.estimated_bytes, temporary=False)

    def bytes_on(self, device: torch.device) -> int:
        return self.adapter.bytes_on_device() if self.adapter is not None and self.adapter.device == device else 0


def state_checksum(module: torch.nn.Module) -> str:
    """SHA-256 over the module's state (names, dtypes, shapes and bytes) as it is in memory now:
    what `status` reports when asked, so a client can see that nothing wrote to a served model."""
    h = hashlib.sha256()
    for name, t in module.state_dict().items():
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return "sha256:" + h.hexdigest()
