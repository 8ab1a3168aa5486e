"""One training step of a catalog model, for the benchmark's work "train_step": forward, the loss
head of the model's task, backward and an optimizer step, on a deep copy of the lent model, so
the model an agent loaded is never written to.

Loss heads (synthetic inputs and targets from a fixed seed):
  * text-generation: causal LM loss, next-token cross-entropy over the random ids themselves;
  * embedding: MSE of the pooled, normalised embedding to fixed random unit vectors;
  * tensor (mnist-cnn): cross-entropy on random class labels.

The step runs at the model's shape plan (`planned_batch`: the batch padded up to its batch
bucket, the sequence to its length bucket, as a request of that shape runs), and the padding is
masked out of the loss, so the loss and its gradients are the unpadded batch's: a padded token's
or row's target is cross-entropy's ignore index (the mean is over the real targets alone), an
embedding's padded row has weight 0 in the MSE (the sum over real rows, divided by their count ×
width), and padded positions are masked from attention (embeddings) or come after every real one
(causal LMs, right padded), so no real output sees them.

The copy stays in eval mode (dropout off), so a step is a function of the weights and the batch
alone: the loss series of bfloat16 compares with float32 step for step, and a plain PyTorch loop
of the same steps reproduces the float32 one. Weights stay float32 (the master copy); "bfloat16"
is autocast over them, as mixed-precision training runs. Two compiled modes, side by side:
  * "compile" compiles the model and its loss head as one module (forward and backward graphs);
    the optimizer step runs eagerly;
  * "compile_step" (WHOLE_STEP) compiles the whole step, as TorchTPU's compile guide advises:
    forward, loss, backward (compiled autograd traces it) and the optimizer step (AdamW with
    capturable=True: its step count stays a device tensor, so no host sync breaks the graph)
    under one torch.compile. Gradients are cleared before it, outside the graph (dynamo does
    not trace Optimizer.zero_grad). Graph breaks left are reported (graph_breaks).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch import nn

from ..adapters import Adapter, CausalLM, SentenceEmbedder
from ..adapters.text import pooled_embedding
from ..platforms import platform_for

OPTIMIZERS = ("adamw", "sgd")
WHOLE_STEP = "compile_step"
# What each mode compiles, in a configuration's report.
COMPILE_SCOPES = {
    "eager": None,
    "compile": "model and loss (forward and backward); optimizer eager",
    WHOLE_STEP: "whole step: forward, loss, backward and optimizer (capturable) in one torch.compile",
}
# Fixed hyper-parameters (the figures are of the step's cost, not of a fit): in the manifest.
OPTIMIZER_SETTINGS = {
    "adamw": {"lr": 1e-4, "weight_decay": 0.01, "betas": (0.9, 0.999), "eps": 1e-8},
    "sgd": {"lr": 1e-2, "momentum": 0.9},
}
# What each dtype of the grid means for training: float32 weights, optionally autocast.
TRAIN_PRECISIONS = {"float32": None, "bfloat16": torch.bfloat16}
TARGET_SEED_OFFSET = 1  # targets and labels are drawn apart from the inputs' seed
IGNORE = -100  # cross-entropy's ignore index: the target of a padded token or row adds nothing


def make_optimizer(name: str, params, *, capturable: bool = False, lr: float | None = None) -> torch.optim.Optimizer:
    """The optimizer; `capturable` (AdamW: its step count a device tensor, for a compiled step).
    SGD keeps no step count: nothing to capture. `lr` replaces the fixed rate (a fine-tune's)."""
    s = {**OPTIMIZER_SETTINGS[name], **({"lr": lr} if lr is not None else {})}
    if name == "adamw":
        return torch.optim.AdamW(params, **s, capturable=capturable)
    return torch.optim.SGD(params, **s)


def optimizer_report(name: str) -> dict:
    return {"name": name, **{k: list(v) if isinstance(v, tuple) else v for k, v in OPTIMIZER_SETTINGS[name].items()}}


class CausalLMLoss(nn.Module):
    """Next-token cross-entropy of a causal LM over its input ids (labels = ids shifted by one)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: dict) -> torch.Tensor:
        logits = self.model(input_ids=batch["input_ids"], use_cache=False).logits
        labels = batch["labels"]  # the ids, IGNORE where padded
        return nn.functional.cross_entropy(
            logits[:, :-1].float().reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=IGNORE
        )


class EmbeddingMSELoss(nn.Module):
    """MSE of the sentence embedding (mean-pooled, normalised) to a fixed target vector per row."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: dict) -> torch.Tensor:
        emb = pooled_embedding(self.model, {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]})
        w = batch["row_weight"]  # 1 a real row, 0 a padded one: the mean over the real rows alone
        return (((emb - batch["target"]) ** 2).sum(-1) * w).sum() / (w.sum() * emb.shape[-1])


class ClassifierLoss(nn.Module):
    """Cross-entropy of a classifier's logits on synthetic class labels."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: dict) -> torch.Tensor:
        return nn.functional.cross_entropy(self.model(batch["x"]).float(), batch["labels"], ignore_index=IGNORE)


def loss_head(adapter: Adapter, model: nn.Module) -> nn.Module:
    """The loss of the adapter's task around `model` (a copy of the adapter's module)."""
    if isinstance(adapter, CausalLM):
        return CausalLMLoss(model)
    if isinstance(adapter, SentenceEmbedder):
        return EmbeddingMSELoss(model)
    return ClassifierLoss(model)


def loss_name(adapter: Adapter) -> str:
    if isinstance(adapter, CausalLM):
        return "causal LM cross-entropy (next token of the synthetic ids)"
    if isinstance(adapter, SentenceEmbedder):
        return "MSE of the normalised embedding to fixed random unit vectors"
    return "cross-entropy on synthetic class labels"


def synthetic_batch(adapter: Adapter, batch: int, seq_len: int | None, seed: int) -> dict:
    """The inputs of one step (the adapter's own synthetic example) and the targets of its loss."""
    inputs = adapter.example(batch, seq_len, seed=seed)
    g = torch.Generator().manual_seed(seed + TARGET_SEED_OFFSET)
    if isinstance(adapter, CausalLM):
        return {"input_ids": inputs, "labels": inputs}
    if isinstance(adapter, SentenceEmbedder):
        width = int(adapter.eager_model.config.hidden_size)
        target = nn.functional.normalize(torch.randn((batch, width), generator=g), dim=1)
        return {**inputs, "target": target.to(adapter.device), "row_weight": torch.ones(batch, device=adapter.device)}
    classes = int(adapter.eager_model.fc.out_features) if hasattr(adapter.eager_model, "fc") else 10
    labels = torch.randint(0, classes, (batch,), generator=g)
    return {"x": inputs.to(torch.float32), "labels": labels.to(adapter.device)}


@dataclass
class PlannedBatch:
    """A step's batch at the shape plan: what runs, the plan's buckets, how much of it is real."""

    batch: dict
    bucket: int  # the batch bucket
    length: int  # the length bucket (0: items of one shape)
    real: int  # real items x tokens (of bucket x length)


def _pad_to(t: torch.Tensor, rows: int, value: float) -> torch.Tensor:
    out = torch.full((rows, *t.shape[1:]), value, dtype=t.dtype, device=t.device)
    out[: t.shape[0]] = t
    return out


def planned_batch(adapter: Adapter, batch: int, seq_len: int | None, seed: int) -> PlannedBatch:
    """`synthetic_batch` padded up to the adapter's shape plan by the adapter's own padding (as a
    request of that shape runs), its targets padded so that the padding is masked out of the loss
    (IGNORE, or row weight 0); unpadded where the adapter keeps no plan."""
    real = synthetic_batch(adapter, batch, seq_len, seed)
    if adapter.plan is None:
        ids = real.get("input_ids")
        return PlannedBatch(real, batch, int(ids.shape[1]) if ids is not None else 0, tokens_in(real) or batch)
    if isinstance(adapter, CausalLM):
        ids = real["input_ids"]
        padded, bucket, length, n = adapter.pad_to_plan(ids)
        labels = torch.full_like(padded, IGNORE)
        labels[: ids.shape[0], : ids.shape[1]] = ids
        return PlannedBatch({"input_ids": padded, "labels": labels}, bucket, length, n)
    if isinstance(adapter, SentenceEmbedder):
        inputs = {"input_ids": real["input_ids"], "attention_mask": real["attention_mask"]}
        padded, bucket, length, n = adapter.pad_to_plan(inputs)
        target, weight = _pad_to(real["target"], bucket, 0.0), _pad_to(real["row_weight"], bucket, 0.0)
        return PlannedBatch({**padded, "target": target, "row_weight": weight}, bucket, length, n)
    padded, bucket, length, n = adapter.pad_to_plan(real["x"])
    labels = _pad_to(real["labels"], bucket, IGNORE)
    return PlannedBatch({"x": padded.to(torch.float32), "labels": labels}, bucket, length, n)


def tokens_in(batch: dict) -> int | None:
    ids = batch.get("input_ids")
    return int(ids.numel()) if ids is not None else None


def _bytes(tensors) -> int:
    return int(sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor)))


@dataclass
class MemorySplit:
    weights_bytes: int
    gradients_bytes: int | None
    optimizer_state_bytes: int | None


class Trainer:
    """A deep copy of `adapter`'s module with its loss head and optimizer, on the adapter's device;
    `step(batch)` runs one training step and returns the loss (a device tensor, detached)."""

    def __init__(self, adapter: Adapter, precision: str, mode: str, optimizer: str, lr: float | None = None) -> None:
        self.device = adapter.device
        self.platform = platform_for(self.device)
        # The served module is never trained: a copy, float32, gradients on.
        model = copy.deepcopy(adapter.eager_model).to(torch.float32).eval()
        for p in model.parameters():
            p.requires_grad_(True)
        self.model = model  # the trained module itself (keep.py writes its weights)
        self.module = loss_head(adapter, model)
        self.autocast_dtype = TRAIN_PRECISIONS[precision]
        self.mode = mode
        self.compile_scope = COMPILE_SCOPES[mode]
        self.compile_backend = None
        self.run = self.module
        if mode != "eager":
            # The platform's backend (TorchTPU's on a TPU), for either compiled mode.
            self.compile_backend = self.platform.compile_backend(self.device)
        if mode == "compile":
            self.run = torch.compile(self.module, backend=self.compile_backend, dynamic=False)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.capturable = mode == WHOLE_STEP and optimizer == "adamw"
        self.optimizer = make_optimizer(optimizer, self.params, capturable=self.capturable, lr=lr)
        self.whole = None
        if mode == WHOLE_STEP:
            self.whole = torch.compile(self._update, backend=self.compile_backend, dynamic=False)

    def _loss(self, batch: dict, run) -> torch.Tensor:
        if self.autocast_dtype is None:
            return run(batch)
        with torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype):
            return run(batch)

    def _update(self, batch: dict) -> torch.Tensor:
        """Forward, loss, backward and the optimizer's update: the step after its zero_grad."""
        loss = self._loss(batch, self.run)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def step(self, batch: dict) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        if self.whole is None:
            return self._update(batch)
        # Compiled autograd: the backward is traced into the step's graphs, not run apart.
        with torch._dynamo.config.patch(compiled_autograd=True):
            return self.whole(batch)

    def count_flops(self, batch: dict) -> tuple[int, int]:
        """(FLOPs of forward + backward, of the forward alone) on the eager module, float32; the
        gradients are dropped after, so the first real step starts from none."""
        from .. import flops

        with torch.no_grad():
            _, forward = flops.count_flops(lambda: self.module(batch))

        def fwd_bwd():
            self.module(batch).backward()

        _, total = flops.count_flops(fwd_bwd)
        self.optimizer.zero_grad(set_to_none=True)
        return total, forward

    def memory_split(self) -> MemorySplit:
        """Bytes held by the weights, the gradients and the optimizer's state (after a step)."""
        weights = _bytes(self.params) + _bytes(self.module.buffers())
        grads = [p.grad for p in self.params if p.grad is not None]
        state = [v for s in self.optimizer.state.values() for v in s.values()]
        return MemorySplit(
            weights_bytes=weights,
            gradients_bytes=_bytes(grads) if grads else None,
            optimizer_state_bytes=_bytes(state),
        )


def loss_drift(losses: list[float], reference: list[float] | None) -> dict | None:
    """How far a loss series strays from the float32 one over the steps both ran."""
    if not reference:
        return None
    n = min(len(losses), len(reference))
    if n == 0:
        return None
    diffs = [abs(a - b) for a, b in zip(losses[:n], reference[:n], strict=True)]
    final_ref = reference[n - 1]
    return {
        "steps": n,
        "max_abs": _round(max(diffs)),
        "final_abs": _round(diffs[-1]),
        "final_rel": _round(diffs[-1] / abs(final_ref)) if final_ref else None,
    }


def _round(x: float) -> float | None:
    return float(f"{x:.6g}") if math.isfinite(x) else None


def loss_curve(losses: list[float], cap: int = 256) -> dict:
    """Every step's loss, or every k-th one past `cap` steps (the last always kept)."""
    stride = max(1, math.ceil(len(losses) / cap))
    picked = losses[::stride]
    if losses and (len(losses) - 1) % stride:
        picked.append(losses[-1])
    return {"stride": stride, "values": [_round(v) for v in picked]}
