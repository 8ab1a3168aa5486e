"""Tensor-in, tensor-out adapters (the built-in MNIST CNN)."""

from __future__ import annotations

import torch
from torch import nn

try:
    import numpy as np
except ImportError:  # optional for torch; transformers brings it in practice
    np = None

from ..errors import invalid
from ..protocol import DTYPE_NAMES
from ..shapes import plan_for
from .base import Adapter, Output, Prepared


class MnistCNN(nn.Module):
    """conv-relu-pool x2 + linear: [N,1,28,28] -> [N,10] logits."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.fc = nn.Linear(32 * 7 * 7, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(torch.flatten(x, 1))


def _all_finite(x: torch.Tensor) -> bool:
    """Whether a CPU input tensor holds no NaN or infinity.

    Through numpy where the dtype allows (a view, no copy): torch's isfinite + all cost ~4x more
    per call on a small input (22 vs 5 µs on the development VM), and this runs once per request.
    """
    if np is not None and x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64, torch.float16):
        return bool(np.isfinite(x.numpy()).all())
    return bool(torch.isfinite(x).all())


def pad_rows(x: torch.Tensor, batch: int) -> torch.Tensor:
    """`x` with zero items appended up to `batch` (each item is computed on its own: a CNN's
    items never mix, so the padding rows change no real item and are dropped after)."""
    if x.shape[0] == batch:
        return x
    return torch.cat([x, x.new_zeros((batch - x.shape[0], *x.shape[1:]))])


class TensorModel(Adapter):
    """Items of one fixed shape: the plan has batch buckets only, the items padded with zeros."""

    architecture = "mnist-cnn"

    def __init__(self, entry, model, device, dtype) -> None:
        super().__init__(entry, model, device, dtype)
        self.plan = plan_for(entry, 0)

    def prepare(self, args, tensors) -> Prepared:
        spec = self.entry.input
        if args.get("texts") is not None:
            raise invalid(f"model {self.entry.id!r} takes one input tensor, not texts")
        if len(tensors) != 1:
            dims = ", ".join(map(str, spec.shape))
            raise invalid(f"model {self.entry.id!r} takes exactly one input tensor of shape [N, {dims}]")
        x = tensors[0]
        if tuple(x.shape) == spec.shape:
            x = x.unsqueeze(0)
        if tuple(x.shape[1:]) != spec.shape or x.shape[0] < 1:
            raise invalid(f"input tensor has shape {list(x.shape)}; expected [N, {', '.join(map(str, spec.shape))}]")
        if x.shape[0] > self.entry.limits.max_batch:
            most = self.entry.limits.max_batch
            raise invalid(
                f"batch of {x.shape[0]} exceeds this model's max_batch of {most} (its largest batch bucket); "
                f"split it into requests of at most {most} items"
            )
        if not x.is_floating_point():
            raise invalid(f"input tensor must be floating point (got {DTYPE_NAMES.get(x.dtype, x.dtype)})")
        if not _all_finite(x):
            raise invalid("input tensor contains NaN or infinite values")
        return Prepared(("tensor",), int(x.shape[0]), x)

    def run_batch(self, batch, should_stop) -> list[Output]:
        x = torch.cat([p.payload for p in batch])
        n = int(x.shape[0])
        bucket = self.plan.batch(n)
        with torch.no_grad():
            logits = self.model(pad_rows(x, bucket).to(self.device, self.torch_dtype))[:n].to("cpu", torch.float32)
        self.shapes.record("forward", bucket, 0, n)
        outs, pos = [], 0
        for p in batch:
            part = logits[pos : pos + p.items].contiguous()
            pos += p.items
            if self.entry.task == "classification":
                probs = part.softmax(-1)
                scores, idx = probs.max(-1)
                names = self.entry.labels
                labels = [names[i] if names and i < len(names) else str(i) for i in idx.tolist()]
                outs.append(Output({"task": "classification", "labels": labels, "scores": scores.tolist()}, []))
            else:
                outs.append(Output({"task": "tensor", "outputs": [{"name": "logits"}]}, [part]))
        return outs

    def example(self, batch, seq_len, seed=0):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn((batch, *self.entry.input.shape), generator=g)
        return x.to(self.device, self.torch_dtype)

    def forward_example(self, inputs):
        return self.model(inputs)

    def pad_to_plan(self, inputs):
        n = int(inputs.shape[0])
        bucket = self.plan.batch(n)
        return pad_rows(inputs, bucket), bucket, 0, n

    def unpad(self, out, inputs):
        return out[: inputs.shape[0]]
