"""The running batch's tensors, for the decode loop (generation/loop.py): how sequences join,
decode a step and leave. The loop keeps the sequences (row i of these tensors is its i-th
running sequence) and the scheduling; one of these keeps the KV cache.

`StaticRows` (the default): a preallocated cache with fixed slots (generation/slots.py); a
prefill runs at one of the shape plan's (batch, length) buckets and a decode step at one of its
batch buckets, so the model sees only the plan's shapes whatever joins or leaves.
`DynamicRows`: a DynamicCache grown by one column per token and reshaped when rows join or
leave (generation/kv.py), kept for a model whose cache cannot be static; every step has a new
shape there. Both record each forward's shape on the adapter's ShapeCounter.
"""

from __future__ import annotations

import torch

from ..platforms import platform_for
from ..shapes import ShapeCounter, ShapePlan
from . import kv
from .slots import SlotCache, static_cache_problem


class DynamicRows:
    kind = "dynamic"

    def __init__(self, adapter, shapes: ShapeCounter, reason: str | None = None) -> None:
        self.adapter = adapter
        self.shapes = shapes
        self.reason = reason  # why the cache is not static
        self.mergeable: bool | None = None  # can rows join a running batch: known after a prefill
        self.rows = 0
        self._cache = self._mask = self._pos = None

    def describe(self) -> dict:
        return {"cache": self.kind, "cache_reason": self.reason}

    def can_join(self) -> bool:
        return bool(self.mergeable)

    def join(self, prompts: list[list[int]], room: int) -> torch.Tensor:
        logits, cache, mask, pos = self.adapter.prefill(prompts, room)
        self.shapes.record("prefill", mask.shape[0], mask.shape[1], sum(len(p) for p in prompts))
        if self.rows:
            self._cache, self._mask = kv.merge(self._cache, self._mask, cache, mask)
            self._pos = torch.cat([self._pos, pos], dim=0)
        else:
            if self.mergeable is None:
                self.mergeable = kv.tensors_of(cache) is not None
            self._cache, self._mask, self._pos = cache, mask, pos
        self.rows += len(prompts)
        return logits

    def step(self, tokens: list[int]) -> torch.Tensor:
        dev = self._mask.device
        logits, self._cache, self._mask, self._pos = self.adapter.step(
            torch.tensor(tokens, dtype=torch.long, device=dev), self._cache, self._mask, self._pos
        )
        self.shapes.record("decode", len(tokens), self._mask.shape[1], len(tokens))
        return logits

    def warm(self, progress, token) -> int:
        return 0  # a dynamic cache has a new shape every step: nothing to warm ahead

    def keep(self, rows: list[int]) -> bool:
        """Keeps `rows` (in order); False when this cache cannot drop rows (they ride along)."""
        if not self.mergeable:
            return False
        self._cache, self._mask = kv.select(self._cache, self._mask, rows)
        self._pos = self._pos[rows]
        self.rows = len(rows)
        return True

    def reset(self) -> None:
        self.rows = 0
        self._cache = self._mask = self._pos = None


class StaticRows:
    kind = "static"

    def __init__(self, adapter, plan: ShapePlan, shapes: ShapeCounter, cache_length: int) -> None:
        self.adapter = adapter
        self.plan = plan
        self.shapes = shapes
        self.mergeable = True
        self.rows = 0
        self.slots = SlotCache(
            adapter.eager_model,
            slots=plan.batches[-1],
            length=cache_length,
            buckets=plan.batches,
            dtype=adapter.torch_dtype,
            device=adapter.device,
        )

    def describe(self) -> dict:
        return {
            "cache": self.kind,
            "cache_slots": self.slots.slots,
            "cache_length": self.slots.length,
            "cache_bytes": self.slots.nbytes(),
        }

    def can_join(self) -> bool:
        return True

    def join(self, prompts: list[list[int]], room: int) -> torch.Tensor:
        """Prefills `prompts` in groups of the plan's prefill batches, each at its length bucket,
        into the next free slots; returns their last logits [len(prompts), vocab]."""
        out = []
        cap = self.plan.prefill_batches[-1]
        for start in range(0, len(prompts), cap):
            group = prompts[start : start + cap]
            batch = self.plan.prefill_batch(len(group))
            length = self.plan.length(max(len(p) for p in group))
            logits, keys, values, mask, pos = self.adapter.prefill_static(group, batch, length)
            self.shapes.record("prefill", batch, length, sum(len(p) for p in group))
            self.slots.make_room(length, self.rows)
            for i in range(len(group)):
                self.slots.write(self.rows, keys, values, i, mask[i], pos[i])
                self.rows += 1
            out.append(logits[: len(group)])
        return torch.cat(out, dim=0)

    def step(self, tokens: list[int]) -> torch.Tensor:
        n = len(tokens)
        bucket = self.plan.batch(n)
        fed = torch.full((bucket,), self.adapter.pad_id, dtype=torch.long)
        fed[:n] = torch.tensor(tokens, dtype=torch.long)
        cache, mask, pos, column = self.slots.step(n, bucket)
        logits = self.adapter.step_static(fed.to(self.slots.device), cache, mask, pos, column)
        self.shapes.record("decode", bucket, 1, n)
        return logits[:n]

    def warm(self, progress, token) -> int:
        """Runs every forward shape of the plan once, on an empty batch (a compiled model
        compiles them now, not in a caller's request); returns how many."""
        shapes = self.plan.forward_shapes()
        pad = self.adapter.pad_id
        platform = platform_for(self.adapter.device)
        for i, (kind, b, n) in enumerate(shapes):
            token.check()
            progress(
                i, len(shapes), f"compiling the {kind} of batch {b}" + (f", length {n}" if kind == "prefill" else "")
            )
            with torch.no_grad():
                if kind == "prefill":
                    # Left padded, as nearly every real prompt is (a prompt filling its bucket exactly
                    # takes the same graph: the mask is an input, not a branch).
                    self.adapter.prefill_static([[pad] * max(n - 1, 1)] * b, b, n)
                else:
                    cache, mask, pos, column = self.slots.step(0, b)
                    fed = torch.full((b,), pad, dtype=torch.long, device=self.slots.device)
                    self.adapter.step_static(fed, cache, mask, pos, column)
            # The warm-up's time is the compiles' and their first runs' (the device's queue included).
            platform.synchronize(self.adapter.device)
        self.slots.reset()
        return len(shapes)

    def keep(self, rows: list[int]) -> bool:
        for j, i in enumerate(rows):  # rows ascend, so a source is never overwritten before it moves
            if i != j:
                self.slots.move(i, j)
        self.rows = len(rows)
        return True

    def reset(self) -> None:
        self.rows = 0
        self.slots.reset()


def rows_for(adapter, *, max_new_tokens: int) -> StaticRows | DynamicRows:
    """Static rows at the adapter's shape plan where the model's cache can be static, else the
    dynamic ones (saying why)."""
    plan = adapter.plan
    problem = "no shape plan" if plan is None else static_cache_problem(adapter.eager_model)
    if problem is not None:
        return DynamicRows(adapter, adapter.shapes, problem)
    return StaticRows(adapter, plan, adapter.shapes, plan.lengths[-1] + max_new_tokens)
