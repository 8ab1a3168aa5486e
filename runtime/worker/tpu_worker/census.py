"""The shape census of a decode step's work around the model's forward.

A `ShapeCensus` is a TorchDispatchMode entered (`watch`) around the step's bookkeeping and token
choice (generation/rows.py, generation/loop.py), never around the forward itself. It records
each ATen op it sees as a signature (op, the shapes and dtypes of its tensor inputs; scalar
arguments apart). A backend that compiles eager ops per op and shape (TorchTPU's eager mode,
docs/tpu-vm.md) compiles once per signature, so after the load's warm-up (`seal`) a new
signature is a compile in a caller's request: counted (`new_since_load`, in
`recompiles_since_load`), logged as a warning, and under `shapes.strict` refused with
`recompile_after_load`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import logs
from .errors import WorkerError

Signature = tuple[Any, tuple]  # (the op, ((shape, dtype), ...))


def signature(func, args, kwargs) -> Signature:
    """(op, the (shape, dtype) of each tensor input, in order). Runs for every op of every step:
    a plain walk of the arguments and of the lists among them (what ATen ops take)."""
    out = []
    for a in (*args, *(kwargs.values() if kwargs else ())):
        if isinstance(a, torch.Tensor):
            out.append((tuple(a.shape), a.dtype))
        elif isinstance(a, (list, tuple)):
            out.extend((tuple(t.shape), t.dtype) for t in a if isinstance(t, torch.Tensor))
    return func, tuple(out)


def refusal(model: str, sig: Signature) -> WorkerError:
    op, shapes = str(sig[0]), sig[1]
    return WorkerError(
        "recompile_after_load",
        f"model {model!r} ran {op} at input shapes {[list(s) for s, _ in shapes]}, a shape its load did not "
        "warm, and its catalog entry sets shapes.strict: true (a compile after warm-up is refused); "
        "set shapes.strict: false to serve it (it is then counted in recompiles_since_load) and report the shape",
    )


class _Mode(TorchDispatchMode):
    def __init__(self, census: ShapeCensus) -> None:
        super().__init__()
        self.census = census

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.census.saw(signature(func, args, kwargs))
        return func(*args, **(kwargs or {}))


class ShapeCensus:
    def __init__(self, model: str, *, strict: bool = False) -> None:
        self.model = model
        self.strict = strict
        self.seen: set[Signature] = set()
        self.sealed = False
        self.new: list[Signature] = []  # the signatures first seen after the seal, in order
        self._local = threading.local()

    @contextmanager
    def watch(self) -> Iterator[None]:
        """Counts the ops run inside (re-entrant: an inner watch adds nothing)."""
        if getattr(self._local, "on", False):
            yield
            return
        self._local.on = True
        try:
            with _Mode(self):
                yield
        finally:
            self._local.on = False

    def saw(self, sig: Signature) -> None:
        if sig in self.seen:
            return
        if not self.sealed:
            self.seen.add(sig)
            return
        if sig not in self.new:
            self.new.append(sig)
            logs.warn(
                "new op shape after warm-up: a compile per op and shape on an eager TPU backend",
                model=self.model,
                op=str(sig[0]),
                shapes=[list(s) for s, _ in sig[1]],
                new_since_load=len(self.new),
                strict=self.strict,
            )
        if self.strict:
            raise refusal(self.model, sig)  # not kept as seen: the same shape is refused again
        self.seen.add(sig)

    def seal(self) -> None:
        """The warm-up is over: every signature seen from now on is counted as new."""
        self.sealed = True

    @property
    def new_since_load(self) -> int:
        return len(self.new)

    def report(self) -> dict:
        return {
            "signatures": len(self.seen),
            "new_since_load": self.new_since_load,
            "strict": self.strict,
            "sealed": self.sealed,
        }
