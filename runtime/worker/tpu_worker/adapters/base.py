"""The adapter surface: a request `Prepared` for batching, its `Output`, and the `Adapter` base
class every architecture extends (see the package docstring)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..catalog import Entry
from ..compiles import CompileCounter, allow_graphs, counted_backend
from ..platforms import platform_for
from ..shapes import ShapeCounter, ShapePlan

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MIN_BUCKET = 8


def seq_bucket(n: int, cap: int) -> int:
    """Power-of-two padding length >= n (at least MIN_BUCKET), never above cap."""
    b = MIN_BUCKET
    while b < n:
        b *= 2
    return min(b, cap)


@dataclass
class Prepared:
    """One validated request, ready to be batched with others that share its key."""

    key: tuple
    items: int
    payload: Any


@dataclass
class Output:
    result: dict
    tensors: list[torch.Tensor]


StopFn = Callable[[], bool]


class Adapter:
    architecture = ""

    def __init__(self, entry: Entry, model: nn.Module, device: torch.device, dtype: str) -> None:
        self.entry = entry
        self.eager_model = model
        self.model: Callable = model
        self.device = device
        self.dtype = dtype
        self.torch_dtype = TORCH_DTYPES[dtype]
        self.mode = "eager"
        # The shapes this model's forwards may take (set by the architecture) and those it took.
        self.plan: ShapePlan | None = None
        self.shapes = ShapeCounter()

    # -- accounting ---------------------------------------------------------------------------
    def _unique_tensors(self) -> list[torch.Tensor]:
        seen, out = set(), []
        for t in [*self.eager_model.parameters(), *self.eager_model.buffers()]:
            key = (t.data_ptr(), t.numel()) if t.device.type != "meta" else id(t)
            if key not in seen:
                seen.add(key)
                out.append(t)
        return out

    def parameters(self) -> int:
        seen, total = set(), 0
        for p in self.eager_model.parameters():
            if p.data_ptr() not in seen:
                seen.add(p.data_ptr())
                total += p.numel()
        return total

    def bytes_on_device(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._unique_tensors())

    # -- execution ----------------------------------------------------------------------------
    def compile(self, counter: CompileCounter | None = None) -> None:
        """torch.compile with the platform's backend (counting each graph into `counter`)."""
        name = platform_for(self.device).compile_backend(self.device)
        self.compile_dynamic = self._dynamic()
        backend = counted_backend(name, counter) if counter is not None else name
        if self.plan is not None:
            # One graph per shape of the plan for the same code: dynamo must keep them all
            # rather than fall back to eager after its default of 8.
            allow_graphs(self.plan.size + 8)
        self.model = torch.compile(self.eager_model, backend=backend, dynamic=self.compile_dynamic)
        self.mode = "compile"

    def warm(self, progress, token) -> int:
        """Runs every forward shape of the plan once (a compiled model compiles them now, not in
        a caller's request); returns how many. Architectures without a plan warm nothing."""
        if self.plan is None:
            return 0
        shapes = self.plan.forward_shapes()
        for i, (_, b, n) in enumerate(shapes):
            token.check()
            progress(i, len(shapes), f"warming batch {b}" + (f", length {n}" if n else ""))
            with torch.no_grad():
                out = self.forward_example(self.example(b, n or None))
            platform_for(self.device).synchronize(self.device)
            del out
        return len(shapes)

    def _dynamic(self) -> bool | None:
        return False  # shapes are bucketed, so static graphs are reused

    def prepare(self, args: dict, tensors: list[torch.Tensor]) -> Prepared:
        raise NotImplementedError

    def run_batch(self, batch: list[Prepared], should_stop: StopFn) -> list[Output]:
        raise NotImplementedError

    def example(self, batch: int, seq_len: int | None, seed: int = 0) -> Any:
        raise NotImplementedError

    def forward_example(self, inputs: Any) -> Any:
        raise NotImplementedError

    def pad_to_plan(self, inputs: Any) -> tuple[Any, int, int, int]:
        """`example` inputs padded up to the plan's bucket: (padded inputs, batch bucket, length
        bucket (0: items of a fixed shape), real items x tokens). Padded rows and tokens are masked
        or dropped by `unpad`, so the answer is the unpadded one."""
        raise NotImplementedError

    def unpad(self, out: Any, inputs: Any) -> Any:
        """A forward's output at the bucket cut back to the unpadded `inputs`."""
        raise NotImplementedError

    def forward_planned(self, inputs: Any, shapes: ShapeCounter) -> Any:
        """`forward_example` at the plan's bucket for `inputs` (recorded on `shapes`), its padding
        dropped from the output: what the check and the benchmark run, so they see the shapes a
        request would. Without a plan, the inputs as they are."""
        if self.plan is None:
            return self.forward_example(inputs)
        padded, batch, length, real = self.pad_to_plan(inputs)
        shapes.record("forward", batch, length, real)
        return self.unpad(self.forward_example(padded), inputs)

    def items_per_example(self, batch: int, seq_len: int | None) -> int:
        return batch

    def default_seq_len(self) -> int | None:
        return None
