"""The float32 CPU reference of a benchmark: the outputs its precision error is measured against,
and the FLOPs of one forward, once per input shape."""

from __future__ import annotations

import contextlib

import torch

from .. import flops, logs
from ..errors import WorkerError
from ..shapes import ShapeCounter
from .measure import SEED, as_float_cpu

REFERENCE_MAX_ELEMENTS = 16_000_000
REFERENCE_CACHE_ELEMENTS = 64_000_000


class Reference:
    """Built on first use from the loaded model when it is float32 eager on the CPU, else from a
    temporary copy held until close(); `unavailable` says why there is none."""

    def __init__(self, worker, entry, info, token) -> None:
        self.worker, self.entry, self.info, self.token = worker, entry, info, token
        self.unavailable: str | None = None
        self.cache: dict[tuple, tuple[torch.Tensor | None, int | None]] = {}
        self.cached_elements = 0
        self._lease = None
        self._held = contextlib.ExitStack()  # the reference adapter's lease, until close()

    def _ensure(self):
        if self._lease is None and self.unavailable is None:
            cpu = torch.device("cpu")
            try:
                lease = self.worker.adapter_for(self.entry, self.info, cpu, "float32", "eager", self.token)
                self._lease = self._held.enter_context(lease)
            except WorkerError as exc:
                if exc.code == "cancelled":
                    raise
                self.unavailable = f"unavailable ({exc.code})"
                logs.warn("no float32 CPU reference for the benchmark", model=self.entry.id, error=exc.message)
        return self._lease.adapter if self._lease is not None else None

    def get(self, batch: int, seq_len: int | None) -> tuple[torch.Tensor | None, int | None]:
        """(reference output, FLOPs of one forward) for the inputs of (batch, seq_len)."""
        key = (batch, seq_len)
        if key in self.cache:
            return self.cache[key]
        if self.token.stopped:  # out of budget or time: a stopped config goes without a reference
            return None, None
        adapter = self._ensure()
        if adapter is None:
            return None, None
        inputs = adapter.example(batch, seq_len, seed=SEED)
        with torch.no_grad():
            # At the plan's bucket, as the measured forward ran: the FLOPs of the padded work.
            out, n = flops.count_flops(lambda: adapter.forward_planned(inputs, ShapeCounter()))
        ref = as_float_cpu(out)
        if ref is not None and ref.numel() > REFERENCE_MAX_ELEMENTS:
            ref = None
        if ref is None or self.cached_elements + ref.numel() <= REFERENCE_CACHE_ELEMENTS:
            self.cache[key] = (ref, n)
            self.cached_elements += ref.numel() if ref is not None else 0
        return ref, n

    def close(self) -> None:
        self.cache.clear()
        self._held.close()
