"""The worker's state and its operations (describe, status, load, unload, infer, ...).

`Worker.handle` is called from op threads and runs the op named in `OPS` (the explicit table of
the wire's ops); it returns (result, tensors) or raises WorkerError. Every loaded model is one
`Served` (served.py) in `served`, whatever serves it; the ops call only that surface. `infer` has
one path, `submit_infer`, which the transport's fast path takes too. Model forwards for `infer`
run on each model's own serving thread; load/unload of one model are serialised by a per-model
guard so concurrent calls cannot double-load. `adapter_for` lends benchmark, check and the float32
reference the loaded model, or a temporary copy released after the run.
"""

from __future__ import annotations

import contextlib
import os
import platform
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from . import PROTOCOL_VERSION, __version__, logs
from .adapters import Adapter, build_adapter, read_config
from .cancel import CancelToken
from .catalog import Catalog, CatalogError, Entry, load_catalog
from .check import run_check
from .compiles import CACHE_ENV, CompileCounter
from .errors import WorkerError, invalid
from .kinds import implementation_for
from .loaders import DEFAULT_MAX_WEIGHT_BYTES, DigestCache, WeightsInfo, inspect_weights
from .memory import estimate_bytes, first_use, refusal_message
from .platforms import PRECISIONS, platform_for, set_matmul_precision
from .probe import ProbeResult, device_label, parse_device, refresh_memory, torch_device_string
from .reports import describe_models, worker_status
from .selftest import run_selftest
from .served import Lease, LoadContext, ReplyScope, Served
from .shapes import ShapeCounter

# progress(done, total=None, message=None, delta=None): delta is a generation's {index, text}.
ProgressFn = Callable[..., None]
FreeMemoryFn = Callable[[torch.device], int | None]
MODES = ("eager", "compile")  # every kind of model loads in one of these


@dataclass
class OpContext:
    id: str
    token: CancelToken = field(default_factory=CancelToken)
    progress: ProgressFn = lambda p, total=None, message=None, delta=None: None
    trace: list | None = None  # [stage, µs] stamps of a traced request (protocol.Request.trace)


class Worker:
    def __init__(
        self,
        catalog: Catalog,
        probe: ProbeResult,
        *,
        free_memory: FreeMemoryFn | None = None,
        max_weight_bytes: int = DEFAULT_MAX_WEIGHT_BYTES,
        engine_settings: Any = None,  # engines.VllmSettings: how engine models are reached
    ) -> None:
        self.catalog = catalog
        self.probe = probe
        self.device_info = probe.device
        self.device = torch.device(torch_device_string(probe.device))
        self.platform = platform_for(self.device)  # picked once, from the probe's decision
        self.started = time.monotonic()
        # Models built since start (loads and temporary copies): the first pays torch's first-use
        # set-up, which the server's load estimate prices as a cold load (reports.worker_status).
        self.models_built = 0
        self.max_weight_bytes = max_weight_bytes
        self.digests = DigestCache()
        self.served: dict[str, Served] = {}  # the loaded models, whatever serves them
        self.engine_settings = engine_settings
        # The transport's reply grouping, given to every model's batcher when it is built; the
        # transport that serves this worker (server.Server) sets it before any load.
        self.reply_scope: ReplyScope = None
        self._lock = threading.Lock()
        self._busy: set[str] = set()  # models being loaded or unloaded
        self._free_memory_override = free_memory

    # -- shared helpers -----------------------------------------------------------------------
    def hello(self) -> dict:
        return {
            "type": "hello",
            "protocol": PROTOCOL_VERSION,
            "worker_version": __version__,
            "torch_version": torch.__version__,
            "python_version": platform.python_version(),
            "pid": os.getpid(),
            "device": self.device_info,
            "devices": self.probe.devices,
            "probe": self.probe.steps,
            "backend_version": self.device_info.get("backend_version"),
            "execution_mode": self.platform.execution_mode(self.device),
            "eager_mode": self.platform.eager_mode_report(self.device),
            "matmul_precision": self.platform.matmul_precision(self.device),
            # Where compiled graphs persist across restarts: inductor's (--compile-cache) and the
            # backend's own (TorchTPU's tier-3 cache), None where none is kept.
            "compile_cache": {"dir": os.environ.get(CACHE_ENV), "backend_dir": self.platform.compile_cache_dir()},
        }

    def label(self, device: torch.device) -> str:
        """How the control plane names `device`: this worker's device by its host index (tpu:N
        is tpu:0 inside a process bound to chip N)."""
        return device_label(self.device_info) if device == self.device else str(device)

    def matmul_precision_arg(self, value: Any) -> str | None:
        """Validates args.matmul_precision and sets it for this process (every model here)."""
        if value is None:
            return None
        if value not in PRECISIONS:
            raise invalid(
                "args.matmul_precision must be 'medium', 'high' or 'highest' (float32 matmuls; on TPU "
                "1, 3 or 6 bf16 passes)"
            )
        set_matmul_precision(value)
        return value

    def target_device(self, value: Any) -> torch.device:
        """The device an op asks for: this worker's device, or the CPU (always present)."""
        if value is None:
            return self.device
        if not isinstance(value, str):
            raise invalid("args.device must be a string such as 'cpu', 'cuda:0' or 'tpu'")
        req = parse_device(value)
        if req.kind == "cpu":
            return torch.device("cpu")
        mine = self.device_info
        if req.kind in ("auto", mine["kind"]) and req.index in (None, mine["index"]):
            return self.device
        one_chip = " (TorchTPU drives one chip per process)" if mine["kind"] == "tpu" == req.kind else ""
        raise WorkerError(
            "unsupported_device",
            f"this worker serves {device_label(mine)} ({mine['name']}) only{one_chip}; device {value!r} "
            "needs the worker started with that --device",
        )

    def free_memory(self, device: torch.device) -> int | None:
        if self._free_memory_override is not None:
            return self._free_memory_override(device)
        if device.type == "cpu":
            return platform_for(device).memory_info(None)[1]
        info = refresh_memory(self.device_info)
        if info["memory_free_bytes"] is not None:
            return info["memory_free_bytes"]
        total = info["memory_total_bytes"]
        if total is None:
            return None
        # Backend reports no free figure (e.g. total from the HBM table): subtract what we hold.
        used = sum(m.bytes_on(device) for m in list(self.served.values()))
        return total - used

    def entry_and_weights(self, model: Any) -> tuple[Entry, WeightsInfo]:
        entry = self.catalog.get(model)
        info = inspect_weights(entry, self.catalog, max_total_bytes=self.max_weight_bytes)
        if entry.sha256 is not None and self.digests.digest(info.files) != entry.sha256:
            raise WorkerError(
                "unsafe_weights",
                f"model {entry.id!r}: its weight files' sha256 differs from the digest recorded when they were "
                "written; they changed on disk and are refused (run the fine-tune again to keep a fresh copy)",
            )
        return entry, info

    def config_for(self, entry: Entry, info: WeightsInfo) -> dict | None:
        if entry.task in ("embedding", "text-generation"):
            try:
                return read_config(info.model_dir, self.catalog, entry)
            except WorkerError:
                return None
        return None

    def estimate_load(self, entry: Entry, info: WeightsInfo, dtype: str) -> int:
        """The memory a load of `entry` as `dtype` and its first request would add here (memory.py):
        the weights' file size tells the dtype they are stored in; the modules not yet imported
        here are what a first load adds beyond the model."""
        params = info.parameters or info.weight_bytes // 4
        config = self.config_for(entry, info)
        return estimate_bytes(params, entry, config, dtype, weight_bytes=info.weight_bytes, first=first_use(entry))

    def check_memory(
        self, entry: Entry, info: WeightsInfo, dtype: str, device: torch.device, exclude: str | None = None
    ) -> int:
        """Raises insufficient_memory (with advice) when the estimate exceeds free memory."""
        need = self.estimate_load(entry, info, dtype)
        free = self.free_memory(device)
        if free is None:
            logs.warn("free memory unknown; skipping the pre-load check", model=entry.id, device=str(device))
            return need
        if need > free:
            alternatives = {d: self.estimate_load(entry, info, d) for d in entry.dtypes}
            loaded = [
                (m.entry.id, m.bytes_on(device))
                for k, m in list(self.served.items())
                if k != exclude and m.bytes_on(device)
            ]
            raise WorkerError(
                "insufficient_memory",
                refusal_message(
                    model=entry.id,
                    dtype=dtype,
                    need=need,
                    free=free,
                    device=str(device),
                    alternatives=alternatives,
                    loaded=loaded,
                ),
            )
        return need

    def build(
        self,
        entry: Entry,
        info: WeightsInfo,
        device: torch.device,
        dtype: str,
        mode: str,
        warmup_shapes: list[dict],
        token: CancelToken,
        counter: CompileCounter | None = None,
    ) -> tuple[Adapter, dict]:
        """Creates an adapter and runs compile + warmup; returns it with timing figures. An
        adapter with a shape plan compiles nothing here: its server warms the plan (TorchModel)."""
        t0 = time.perf_counter()
        adapter = build_adapter(entry, self.catalog, info, device, dtype)
        platform_for(device).synchronize(device)
        load_s = time.perf_counter() - t0
        token.check()
        compile_s = 0.0
        shapes = list(warmup_shapes)
        if mode == "compile":
            adapter.compile(counter)
        if mode == "compile" and adapter.plan is None:
            first = shapes.pop(0) if shapes else {"batch": 1, "seq_len": adapter.default_seq_len()}
            t1 = time.perf_counter()
            with torch.no_grad():
                out = adapter.forward_example(adapter.example(first["batch"], first.get("seq_len")))
            platform_for(device).synchronize(device)
            del out
            compile_s = time.perf_counter() - t1
        t2 = time.perf_counter()
        for shape in shapes:
            token.check()
            with torch.no_grad():
                # At the plan's bucket, as a request of this shape runs.
                out = adapter.forward_planned(adapter.example(shape["batch"], shape.get("seq_len")), ShapeCounter())
            platform_for(device).synchronize(device)
            del out
        warmup_s = time.perf_counter() - t2
        self.models_built += 1
        return adapter, {"load_s": round(load_s, 6), "compile_s": round(compile_s, 6), "warmup_s": round(warmup_s, 6)}

    @contextlib.contextmanager
    def adapter_for(
        self, entry: Entry, info: WeightsInfo, device: torch.device, dtype: str, mode: str, token: CancelToken
    ) -> Iterator[Lease]:
        """The loaded model when it runs on `device` as `dtype` in `mode`; else a temporary copy
        (after the memory check), released with the device's cache when the block ends."""
        m = self.served.get(entry.id)
        own = m.lend(device, dtype, mode) if m is not None else None
        if own is not None:
            yield own
            return
        estimated = self.check_memory(entry, info, dtype, device)
        adapter, report = self.build(entry, info, device, dtype, "eager", [], token)
        if mode == "compile":
            adapter.compile()
        lease = Lease(adapter, report["load_s"], estimated, temporary=True)
        del adapter
        try:
            yield lease
        finally:
            lease.adapter = None  # the last reference: the copy is freed before the cache is emptied
            platform_for(device).release_memory(device)

    def dtype_arg(self, entry: Entry, value: Any) -> str:
        dtype = entry.default_dtype if value is None else value
        if dtype not in entry.dtypes:
            raise WorkerError(
                "unsupported_dtype",
                f"model {entry.id!r} allows dtypes {', '.join(entry.dtypes)}; got {value!r}",
            )
        return dtype

    def _claim(self, model: str) -> None:
        with self._lock:
            if model in self._busy:
                raise WorkerError("model_already_loaded", f"model {model!r} is being loaded or unloaded; retry shortly")
            self._busy.add(model)

    def _release(self, model: str) -> None:
        with self._lock:
            self._busy.discard(model)

    # -- ops ----------------------------------------------------------------------------------
    def op_describe(self, args: dict, tensors, ctx: OpContext):
        return describe_models(self), []

    def op_status(self, args: dict, tensors, ctx: OpContext):
        checksums = args.get("weights_checksum", False)
        if not isinstance(checksums, bool):
            raise invalid("args.weights_checksum must be true or false")
        return worker_status(self, checksums=checksums), []

    def op_load(self, args: dict, tensors, ctx: OpContext):
        entry = self.catalog.get(args.get("model"))
        dtype = self.dtype_arg(entry, args.get("dtype"))
        mode = args.get("mode", "eager")
        if mode not in MODES:
            raise invalid("args.mode must be 'eager' or 'compile'")
        if entry.id in self.served:
            m = self.served[entry.id]
            raise WorkerError(
                "model_already_loaded",
                f"model {entry.id!r} is already loaded ({m.dtype}, {m.mode} on {m.device}); use it or unload it first",
            )
        self._claim(entry.id)
        try:
            _, info = self.entry_and_weights(entry.id)
            m = implementation_for(entry).load(LoadContext(self, entry, info, args, dtype, mode, ctx, self.reply_scope))
            self.served[entry.id] = m
        finally:
            self._release(entry.id)
        report = m.load_report()
        logs.info(
            "model loaded",
            model=entry.id,
            device=m.device,
            dtype=dtype,
            mode=mode,
            engine=entry.engine,
            **{k: report[k] for k in ("load_s", "compile_s", "warmup_s") if k in report},
        )
        return {"model": entry.id, "device": m.device, "dtype": dtype, "mode": mode, **report}, []

    def model(self, model: Any) -> Served:
        """The loaded model `model` names (model_not_loaded when it is not)."""
        entry = self.catalog.get(model)
        m = self.served.get(entry.id)
        if m is None:
            raise WorkerError("model_not_loaded", f"model {entry.id!r} is not loaded; load it first (load_model)")
        return m

    def op_unload(self, args: dict, tensors, ctx: OpContext):
        entry = self.catalog.get(args.get("model"))
        self._claim(entry.id)
        try:
            m = self.served.pop(entry.id, None)
            if m is None:
                raise WorkerError("model_not_loaded", f"model {entry.id!r} is not loaded")
            freed = m.unload(f"model {entry.id!r} was unloaded")
            del m
        finally:
            self._release(entry.id)
        logs.info("model unloaded", model=entry.id, freed_bytes=freed)
        return {"model": entry.id, "freed_bytes": freed}, []

    def submit_infer(
        self, args: dict, tensors, token: CancelToken, trace: list | None = None, progress: ProgressFn | None = None
    ) -> tuple[Future, str]:
        """Validates an infer and queues it on its model: (future of the Output, model). Both
        the op and the transport's fast path take this one path; `progress` receives a
        streaming generation's text deltas."""
        m = self.model(args.get("model"))
        return m.submit(args, tensors, token, trace, progress), m.entry.id

    def op_infer(self, args: dict, tensors, ctx: OpContext):
        return self.model(args.get("model")).infer(args, tensors, ctx)

    def op_benchmark(self, args: dict, tensors, ctx: OpContext):
        entry = self.catalog.get(args.get("model"))
        m = self.served.get(entry.id)
        if m is not None:
            return m.benchmark(self, args, ctx), []
        return implementation_for(entry).benchmark_unloaded(self, entry, args, ctx), []

    def op_check(self, args: dict, tensors, ctx: OpContext):
        return run_check(self, args, ctx), []

    def op_selftest(self, args: dict, tensors, ctx: OpContext):
        return run_selftest(self), []

    def op_reload_catalog(self, args: dict, tensors, ctx: OpContext):
        """Re-reads this worker's catalog file and adds the models it did not have (SIGHUP on the
        server). An entry already here keeps its definition, even where the file now differs (a
        loaded model must not change under its callers): that, and a removal, needs a restart."""
        try:
            fresh = load_catalog(self.catalog.path, self.catalog.kept_dir)
        except CatalogError as exc:
            raise invalid(f"the catalog file is refused, nothing changed: {exc}") from None
        old = self.catalog
        added = [i for i in fresh.entries if i not in old.entries]
        if added:
            # New roots are added (a new entry may live there); none is taken away before a restart.
            roots = old.roots + tuple(r for r in fresh.roots if r not in old.roots)
            self.catalog = Catalog(
                old.path, roots, {**old.entries, **{i: fresh.entries[i] for i in added}}, old.kept_dir
            )
        kept = [i for i in old.entries if i in fresh.entries and fresh.entries[i] != old.entries[i]]
        removed = [i for i in old.entries if i not in fresh.entries]
        return {"added": added, "changed": kept, "removed": removed}, []

    def op_shutdown(self, args: dict, tensors, ctx: OpContext):
        return {}, []

    def close(self) -> None:
        for m in list(self.served.values()):
            m.unload("the worker is shutting down")
        self.served.clear()

    def handle(self, op: str, args: dict, tensors: list[torch.Tensor], ctx: OpContext):
        run = OPS.get(op)
        if run is None:
            raise invalid(f"unknown op {op!r}; expected one of {', '.join(OPS)}")
        ctx.token.check()
        return run(self, args, tensors, ctx)


def infer_reply(out, model: str) -> tuple[dict, list[torch.Tensor]]:
    """An infer's result frame: the model's output, named."""
    return {**out.result, "model": model}, out.tensors


# The wire's op names (runtime/PROTOCOL.md) -> what runs them.
OPS: dict[str, Callable[..., tuple[dict, list]]] = {
    "describe": Worker.op_describe,
    "status": Worker.op_status,
    "load": Worker.op_load,
    "unload": Worker.op_unload,
    "infer": Worker.op_infer,
    "benchmark": Worker.op_benchmark,
    "check": Worker.op_check,
    "selftest": Worker.op_selftest,
    "reload_catalog": Worker.op_reload_catalog,
    "shutdown": Worker.op_shutdown,
}
