"""A loaded model, whatever serves it: the one surface the worker's ops and transport use.

`Worker.served` holds one `Served` per loaded model. The ops (ops.py), the reports (reports.py)
and the transport's infer fast path (server.py) call only this surface, so a kind of model is
one implementation of it: `TorchModel` (torch_model.py: an adapter behind its batcher or decode
loop, in this process) and `EngineModel` (engines/served.py: a model in an engine process beside
the worker). kinds.py maps a catalog entry's `engine` to its implementation.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch

from .adapters import Adapter
from .batching import wait_result
from .cancel import CancelToken
from .catalog import Entry
from .loaders import WeightsInfo
from .protocol import now_us

# The transport's reply grouping (server.Server._batch_replies): the replies one pass of a
# serving thread sets leave in one write. None: each reply is written on its own.
ReplyScope = Callable[[], contextlib.AbstractContextManager] | None


class Served(ABC):
    """One loaded model. `load_report` is what `load` answers, `status_row` its row of `status`,
    `describe` its extra fields in `describe`'s entry; `submit` queues an infer (the op and the
    transport's fast path alike) and `infer` waits for it."""

    entry: Entry
    device: str  # the label the control plane uses (ops.Worker.label)
    dtype: str
    mode: str
    loaded_at: str
    # True when a cancelled infer still answers with a result (a generation's partial text),
    # so a waiter must not give up on its own when the token is cancelled.
    answers_cancel: bool = False
    # True when a load of this kind holds the model in this worker's memory, so that the worker's
    # own pre-flight (memory.py) prices it; False for a model held in another process.
    loads_in_worker: bool = True

    @abstractmethod
    def submit(
        self, args: dict, tensors: list[torch.Tensor], token: CancelToken, trace: list | None, progress
    ) -> Future:
        """Validates an infer and queues it: a future of its Output (adapters.base)."""

    def infer(self, args: dict, tensors: list[torch.Tensor], ctx) -> tuple[dict, list[torch.Tensor]]:
        future = self.submit(args, tensors, ctx.token, ctx.trace, ctx.progress)
        out = wait_result(future, ctx.token, early_cancel=not self.answers_cancel)
        if ctx.trace is not None:
            ctx.trace.append(["w.woke", now_us()])
        return {**out.result, "model": self.entry.id}, out.tensors

    @abstractmethod
    def benchmark(self, worker, args: dict, ctx) -> dict: ...

    # -- the kind's own entry points (implementation_for picks the class) --------------------------
    @classmethod
    @abstractmethod
    def load(cls, lc: LoadContext) -> Served:
        """Loads the model `lc.entry` names (the worker has checked it is not loaded)."""

    @classmethod
    @abstractmethod
    def benchmark_unloaded(cls, worker, entry: Entry, args: dict, ctx) -> dict:
        """A benchmark of a model of this kind that is not loaded."""

    @abstractmethod
    def unload(self, reason: str) -> int:
        """Stops serving (queued requests are refused with `reason`); returns the bytes freed."""

    @abstractmethod
    def load_report(self) -> dict: ...

    @abstractmethod
    def status_row(self) -> dict: ...

    def describe(self) -> dict:
        return {}

    def weights_checksum(self) -> str | None:
        """A checksum of the weights this process holds for the model as they are now (None:
        it holds none, e.g. an engine's)."""
        return None

    def lend(self, device: torch.device, dtype: str, mode: str) -> Lease | None:
        """This model's adapter lent to a run on `device` as `dtype` in `mode` (benchmark, check,
        the fp32 reference) when it has one that matches; None: the run builds its own copy."""
        return None

    def bytes_on(self, device: torch.device) -> int:
        """Bytes this model holds on `device` in this process (what a free-memory figure that
        the backend cannot report must subtract)."""
        return 0


@dataclass
class Lease:
    """An adapter lent to one run (benchmark, check, the fp32 reference): the loaded model's own,
    or a temporary copy built for the run and released when it ends."""

    adapter: Adapter | None
    load_s: float | None
    estimated_bytes: int
    temporary: bool


@dataclass
class LoadContext:
    """What a loader gets from the worker: the entry, its checked weights, the validated
    arguments the loaders share, the op's context, and the transport's reply grouping."""

    worker: Any  # ops.Worker (the shared helpers: device, memory check, build)
    entry: Entry
    info: WeightsInfo
    args: dict
    dtype: str
    mode: str
    ctx: Any  # ops.OpContext
    reply_scope: ReplyScope
