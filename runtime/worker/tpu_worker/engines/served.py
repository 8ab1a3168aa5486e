"""A model served by a vLLM engine beside this worker (served.Served).

Its infers stream over HTTP, so each runs on a thread of this model's own pool (the transport's
fast path queues them here as it queues a torch model's on its batcher); vLLM batches them.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from ..adapters.base import Output
from ..catalog import Entry
from ..errors import WorkerError, invalid
from ..protocol import now_iso
from ..served import LoadContext, Served
from .settings import VllmSettings
from .vllm import VllmEngine
from .vllm_bench import run_engine_benchmark

# Requests one engine model streams at once (vLLM queues the rest itself): above any max_batch.
MAX_IN_FLIGHT = 128


def _no_progress(*_a, **_k) -> None:
    return None


@dataclass
class EngineCall:
    """What VllmEngine.infer reads of an op's context: the cancel token, the progress sink and
    the traced request's span list (spans.py)."""

    token: object
    progress: object = _no_progress
    trace: list | None = None


@dataclass(eq=False)
class EngineModel(Served):
    entry: Entry
    engine: VllmEngine
    device: str
    dtype: str
    mode: str
    loaded_at: str
    report: dict
    answers_cancel = True  # a cancelled generation answers with its partial text
    loads_in_worker = False  # the engine's process holds the model; it prices its own memory
    _pool: ThreadPoolExecutor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=MAX_IN_FLIGHT, thread_name_prefix=f"engine-{self.entry.id}")

    @classmethod
    def load(cls, lc: LoadContext) -> EngineModel:
        """Starts the model's engine server (minutes the first time: see docs/vllm.md)."""
        w, entry = lc.worker, lc.entry
        if lc.args.get("device") not in (None, "auto", w.label(w.device), w.device_info["kind"]):
            raise WorkerError(
                "unsupported_device", f"model {entry.id!r} runs in a vLLM engine beside this worker; omit device"
            )
        lc.ctx.progress(0, 1, f"starting vLLM for {entry.id} ({lc.dtype}, {lc.mode})")
        engine = VllmEngine(entry, w.catalog, lc.info, w.engine_settings or VllmSettings(), lc.dtype, lc.mode)
        timings = engine.start(lc.ctx.token)
        report = {
            "parameters": engine.parameters(),
            "bytes_on_device": engine.bytes_on_device(),
            "estimated_bytes": engine.bytes_on_device(),
            **timings,
            "execution_mode": "vllm",
            "batching": {"enabled": True, "kind": "vllm continuous batching"},
            "engine": engine.status(),
        }
        return cls(entry, engine, w.label(w.device), lc.dtype, lc.mode, now_iso(), report)

    def submit(self, args, tensors, token, trace, progress) -> Future:
        if tensors:
            raise invalid(f"model {self.entry.id!r} takes texts or messages, not tensors")
        call = EngineCall(token, progress or _no_progress, trace)
        return self._pool.submit(lambda: Output(self.engine.infer(args, call), []))

    def benchmark(self, worker, args: dict, ctx) -> dict:
        return run_engine_benchmark(self, args, ctx)

    @classmethod
    def benchmark_unloaded(cls, worker, entry: Entry, args: dict, ctx) -> dict:
        raise WorkerError("model_not_loaded", f"model {entry.id!r} runs in a vLLM engine: load it first (load_model)")

    def unload(self, reason: str) -> int:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.engine.stop()
        return self.engine.bytes_on_device()

    def load_report(self) -> dict:
        return self.report

    def status_row(self) -> dict:
        e = self.engine
        return {
            "model": self.entry.id,
            "device": self.device,
            "dtype": self.dtype,
            "mode": self.mode,
            "parameters": e.parameters(),
            "bytes_on_device": e.bytes_on_device(),
            "queue_depth": e.counters.in_flight,
            "loaded_at": self.loaded_at,
            # The engine, its version and health: what get_runtime_status and doctor show.
            "engine": e.status(),
            "prefix_cache": e.prefix_report(),
        }
