"""A loaded model's shape plan: the batch sizes and sequence lengths its forwards may take.

On a TPU every new tensor shape is a compile (TorchTPU compiles per op and shape even in eager
mode, and `torch.compile(backend="tpu")` refuses dynamic shapes), so a model serves a bounded
set of shapes chosen at load: a request's batch is padded up to the next batch bucket and its
sequence up to the next length bucket, and no request creates a shape outside the plan. The
buckets come from the catalog entry (`shapes.batch_buckets`, `shapes.length_buckets`) or the
defaults below; `ShapeCounter` records what was run, so status and the reports can say how many
distinct shapes were seen and how much of the padded work was real (padding waste).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from .errors import WorkerError

MIN_LENGTH = 8  # the shortest length bucket (as adapters.base.seq_bucket always padded)


def default_batches(max_batch: int) -> tuple[int, ...]:
    """1, 2, 4, 8, ... up to max_batch (max_batch itself always included)."""
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    out.append(max_batch)
    return tuple(out)


def default_lengths(max_len: int) -> tuple[int, ...]:
    """Powers of two from MIN_LENGTH up to max_len (max_len itself always included)."""
    if max_len <= 0:
        return ()
    out, n = [], MIN_LENGTH
    while n < max_len:
        out.append(n)
        n *= 2
    out.append(max_len)
    return tuple(out)


def prefill_buckets(batches: tuple[int, ...]) -> tuple[int, ...]:
    """A generation's prefill batches: 1 and every other batch bucket down from the largest (1, 4
    and 16 of 1..16). The largest is the slots, so the joiners of one length bucket always fit one
    forward; skipping every other bucket keeps the plan as small as prefills of at most 4 kept it
    (a compile each at load: 24 shapes, not 34, for tiny-gpt2; 24 took 1,005 s on the loaded
    2-core development VM), at the cost of padding rows up to 4x the joiners."""
    return tuple(sorted(set(batches[::-2]) | ({1} & set(batches))))


def _bucket(buckets: tuple[int, ...], n: int, what: str) -> int:
    for b in buckets:
        if b >= n:
            return b
    raise WorkerError(
        "invalid_argument", f"{what} {n} is above the largest bucket of this model's shape plan ({buckets[-1]})"
    )


@dataclass(frozen=True)
class ShapePlan:
    batches: tuple[int, ...]
    lengths: tuple[int, ...]  # () for a model whose items have a fixed shape (tensor models)
    # generation only: the batches a prefill may take (prefill_buckets), so that the joiners of
    # one token boundary are prefilled in one forward per length bucket (generation/rows.py)
    prefill_batches: tuple[int, ...] = ()
    # generation with a prefix cache: the lengths of a prefill behind cached prefixes
    # (generation/prefix.py), every length bucket but the largest (that one saves nothing), at
    # every prefill batch
    cached_lengths: tuple[int, ...] = ()
    # generation only: the columns a decode step attends over (generation/slots.py), the length
    # buckets and then the whole static cache: a step runs at the smallest one that holds its
    # longest row, so attention grows with the context, not with the slot
    decode_lengths: tuple[int, ...] = ()

    @classmethod
    def for_model(
        cls,
        batch_buckets,
        length_buckets,
        *,
        max_batch: int,
        max_len: int,
        generation: bool = False,
        prefix_cache: bool = False,
        max_new_tokens: int = 0,
    ) -> ShapePlan:
        batches = tuple(b for b in (batch_buckets or default_batches(max_batch)) if b <= max_batch)
        if not batches or batches[-1] < max_batch:
            batches = (*batches, max_batch)
        lengths = tuple(n for n in (length_buckets or default_lengths(max_len)) if n <= max_len)
        if max_len > 0 and (not lengths or lengths[-1] < max_len):
            lengths = (*lengths, max_len)
        prefill = prefill_buckets(batches) if generation else ()
        cached = lengths[:-1] if generation and prefix_cache else ()
        decode = ()
        if generation and lengths:
            decode = lengths if max_new_tokens <= 0 else (*lengths, lengths[-1] + max_new_tokens)
        return cls(batches, lengths, prefill, cached, decode)

    def batch(self, n: int) -> int:
        """The batch bucket a forward of `n` items runs at."""
        return _bucket(self.batches, n, "a batch of")

    def length(self, n: int) -> int:
        """The length bucket a sequence of `n` tokens is padded to."""
        return _bucket(self.lengths, max(n, 1), "a sequence of")

    def prefill_batch(self, n: int) -> int:
        return _bucket(self.prefill_batches, n, "a prefill of")

    def decode_length(self, n: int) -> int:
        """The columns a decode step attends over when its rows use `n` of them."""
        return _bucket(self.decode_lengths, n, "a decode over columns")

    @property
    def cache_slots(self) -> int:
        """The static KV cache's slots (generation/slots.py): one per sequence of the largest
        batch, and with a prefix cache (`cached_lengths`) `spare_slots` more past them."""
        return (self.batches[-1] if self.batches else 0) + self.spare_slots

    def cache_columns(self, max_new_tokens: int) -> int:
        """The static KV cache's columns (generation/rows.py): the longest prompt bucket and the
        new tokens after it."""
        return (self.lengths[-1] if self.lengths else 0) + max_new_tokens

    @property
    def spare_slots(self) -> int:
        """Slots past the decode batch for the padding rows of a prefill behind cached prefixes
        (generation/rows.py): its rows are slots, so a prefill of 2 or 3 joiners at batch 4 needs
        4 free slots. With the second prefill batch less one spare (3 of 1, 4, 16), that forward
        fits however full the batch is, and a larger group runs as forwards of that batch, not
        one forward per joiner. 0 without a prefix cache: a plain prefill's rows are its own
        tensors, copied into the slots afterwards."""
        pb = self.prefill_batches
        return pb[1] - 1 if self.cached_lengths and len(pb) > 1 else 0

    def forward_shapes(self) -> list[tuple[str, int, int]]:
        """Every (kind, batch, length) forward the plan allows: what a compile warms at load."""
        if self.prefill_batches:  # generation: prefills at (batch, length), decode steps at batch
            return (
                [("prefill", b, n) for b in self.prefill_batches for n in self.lengths]
                + [("prefill_cached", b, n) for b in self.prefill_batches for n in self.cached_lengths]
                + [("decode", b, n) for b in self.batches for n in (self.decode_lengths or (1,))]
            )
        return [("forward", b, n) for b in self.batches for n in (self.lengths or (0,))]

    @property
    def size(self) -> int:
        return len(self.forward_shapes())

    def report(self) -> dict:
        out = {"batch_buckets": list(self.batches), "length_buckets": list(self.lengths), "size": self.size}
        if self.prefill_batches:
            out["prefill_batch_buckets"] = list(self.prefill_batches)
        if self.cached_lengths:
            out["prefill_cached_length_buckets"] = list(self.cached_lengths)
        if self.decode_lengths:
            out["decode_length_buckets"] = list(self.decode_lengths)
        return out


@dataclass
class ShapeCounter:
    """The shapes a model's forwards ran at, and how much of the padded work was real."""

    seen: dict[tuple, int] = field(default_factory=dict)  # (kind, batch, length) -> forwards
    real_tokens: int = 0
    padded_tokens: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, kind: str, batch: int, length: int, real: int) -> None:
        """One forward at (batch, length) whose real (unpadded) items x tokens were `real`."""
        with self._lock:
            key = (kind, batch, length)
            self.seen[key] = self.seen.get(key, 0) + 1
            self.real_tokens += real
            self.padded_tokens += batch * max(length, 1)

    def report(self) -> dict:
        with self._lock:
            padded = self.padded_tokens
            return {
                "distinct_shapes": len(self.seen),
                "forwards": sum(self.seen.values()),
                "real_tokens": self.real_tokens,
                "padded_tokens": padded,
                # real ÷ padded tokens: 1.0 is no padding; padding_waste is the rest.
                "real_to_padded": round(self.real_tokens / padded, 4) if padded else None,
                "padding_waste": round(1 - self.real_tokens / padded, 4) if padded else None,
                "shapes": [
                    {"kind": k, "batch": b, "length": n, "forwards": c} for (k, b, n), c in sorted(self.seen.items())
                ],
            }


def generation_plan(entry, max_len: int) -> ShapePlan:
    """A causal LM's plan (adapters/text.py) at `max_len`, the catalog's limit within the model's
    positions; the memory pre-flight sizes the static KV cache from the same plan (memory.py)."""
    shapes = entry.shapes
    return ShapePlan.for_model(
        shapes.batch_buckets,
        shapes.length_buckets,
        max_batch=entry.limits.max_batch,
        max_len=max_len,
        generation=True,
        prefix_cache=entry.prefix_cache.max_bytes > 0,
        max_new_tokens=entry.limits.max_new_tokens,
    )


def plan_for(entry, max_len: int) -> ShapePlan:
    """The plan the adapter of `entry` holds when its model allows `max_len` tokens (0 for items
    of a fixed shape): one source for the adapters and for `describe`'s plan_shapes, which the
    server's estimator prices a compiled load by."""
    shapes, top = entry.shapes, entry.limits.max_batch
    if entry.architecture == "mnist-cnn":
        return ShapePlan.for_model(shapes.batch_buckets, (), max_batch=top, max_len=0)
    if entry.architecture == "sentence-transformer":
        return ShapePlan.for_model(shapes.batch_buckets, shapes.length_buckets, max_batch=top, max_len=max_len)
    return generation_plan(entry, max_len)
