"""The running batch's tensors, for the decode loop (generation/loop.py): how sequences join,
decode a step and leave. The loop keeps the sequences (row i of these tensors is its i-th
running sequence) and the scheduling; one of these keeps the KV cache.

`StaticRows` (the default): a preallocated cache with fixed slots (generation/slots.py); a
prefill runs at one of the shape plan's (batch, length) buckets and a decode step at one of its
batch buckets, so the model sees only the plan's shapes whatever joins or leaves. The sequences
that join at one token boundary are prefilled one forward per length bucket (`forwards`), so a
burst of joiners costs at most one forward per bucket, and a short prompt is never padded to a
long neighbour's bucket.
`DynamicRows`: a DynamicCache grown by one column per token and reshaped when rows join or
leave (generation/kv.py), kept for a model whose cache cannot be static; every step has a new
shape there. Both record each forward's shape on the adapter's ShapeCounter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from ..census import ShapeCensus
from ..platforms import platform_for
from ..shapes import ShapeCounter, ShapePlan
from . import kv
from .prefix import PrefixCache
from .slots import SlotCache, static_cache_problem


@dataclass
class Forward:
    """One prefill forward of a join: which of the joining prompts it runs (row order), their
    prefix-cache partitions, and for a forward behind cached prefixes each prompt's cached
    blocks (empty: a plain prefill)."""

    indices: list[int]
    partitions: list[str | None]
    behind: list[list] = field(default_factory=list)
    # per prompt, how many of its tokens came from the prefix cache (set when it ran)
    cached: list[int] = field(default_factory=list)
    counted: bool = False  # its prompts count toward the prefix cache's hit rate
    length: int = 0  # its length bucket (behind a cached prefix: the rest's), the order of a join
    shape: tuple[str, int, int] | None = None  # (kind, batch, length) it ran at (set when it ran)

    def part(self, start: int, stop: int) -> Forward:
        """Its prompts start..stop, as a forward of their own (before it ran)."""
        return Forward(
            self.indices[start:stop],
            self.partitions[start:stop],
            self.behind[start:stop],
            counted=self.counted,
            length=self.length,
        )


class DynamicRows:
    kind = "dynamic"

    def __init__(self, adapter, shapes: ShapeCounter, reason: str | None = None) -> None:
        self.adapter = adapter
        self.shapes = shapes
        self.reason = reason  # why the cache is not static
        self.mergeable: bool | None = None  # can rows join a running batch: known after a prefill
        self.rows = 0
        self.prefix = None  # no prefix reuse over a dynamic cache
        # Never sealed: a dynamic cache has a new shape every step, nothing to count against.
        self.census = ShapeCensus(adapter.entry.id)
        self._cache = self._mask = self._pos = None

    # One forward per join (`forwards`): no budget between decode steps (loop.py).
    stall_tokens = 0

    def padded_tokens(self, fwd: Forward) -> int:
        return 0

    def describe(self) -> dict:
        return {"cache": self.kind, "cache_reason": self.reason}

    def can_join(self) -> bool:
        return bool(self.mergeable)

    def forwards(self, prompts: list[list[int]], partitions: list[str | None] | None = None) -> list[Forward]:
        """One forward for all of them (no prefix reuse over a dynamic cache)."""
        return [Forward(list(range(len(prompts))), [None] * len(prompts))]

    def prefill(self, fwd: Forward, prompts: list[list[int]], room: int) -> torch.Tensor:
        """Prefills the forward's prompts into the batch, after its rows: their last logits."""
        ps = [prompts[i] for i in fwd.indices]
        fwd.cached = [0] * len(ps)
        logits, cache, mask, pos = self.adapter.prefill(ps, room)
        self.shapes.record("prefill", mask.shape[0], mask.shape[1], sum(len(p) for p in ps))
        fwd.shape = ("prefill", int(mask.shape[0]), int(mask.shape[1]))
        if self.rows:
            self._cache, self._mask = kv.merge(self._cache, self._mask, cache, mask)
            self._pos = torch.cat([self._pos, pos], dim=0)
        else:
            if self.mergeable is None:
                self.mergeable = kv.tensors_of(cache) is not None
            self._cache, self._mask, self._pos = cache, mask, pos
        self.rows += len(ps)
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

    def __init__(
        self, adapter, plan: ShapePlan, shapes: ShapeCounter, cache_length: int, prefix: PrefixCache | None = None
    ) -> None:
        self.adapter = adapter
        self.plan = plan
        self.shapes = shapes
        self.prefix = prefix  # the model's prefix cache (generation/prefix.py), or None: no reuse
        self.mergeable = True
        self.rows = 0
        self.census = ShapeCensus(adapter.entry.id, strict=adapter.entry.shapes.strict)
        # The padded tokens one prefill forward may take: the second prefill batch at the longest
        # length (tiny-gpt2: 4 × 128). A prefill's time grows with its padded tokens, and every
        # row of a forward waits for all of them: a burst of long prompts runs as several smaller
        # forwards whose first tokens leave one after another; at short lengths, where a forward
        # costs little more than its launch, a forward still takes up to the largest batch.
        pb = plan.prefill_batches
        self.prefill_tokens = plan.lengths[-1] * pb[min(1, len(pb) - 1)]
        # The padded prefill tokens the loop runs between two decode steps while rows decode
        # (loop.py): one forward's most, so a running row waits for one such forward at most and
        # a burst of short prompts still joins at one boundary.
        self.stall_tokens = self.prefill_tokens
        self.slots = SlotCache(
            adapter.eager_model,
            slots=plan.cache_slots,
            length=cache_length,
            buckets=plan.batches,
            dtype=adapter.torch_dtype,
            device=adapter.device,
            windows=plan.decode_lengths,
        )
        if prefix is not None:  # its pool is held from the load on, as the pre-flight counts it
            _, heads, _, dim = self.slots.keys[0].shape
            prefix.reserve(len(self.slots.keys), heads, dim, adapter.torch_dtype, adapter.device)

    def describe(self) -> dict:
        return {
            "cache": self.kind,
            "cache_slots": self.slots.slots,
            "cache_length": self.slots.length,
            "cache_bytes": self.slots.nbytes(),
            "prefix_cache": self.prefix is not None,
        }

    def can_join(self) -> bool:
        return True

    def forwards(self, prompts: list[list[int]], partitions: list[str | None] | None = None) -> list[Forward]:
        """How joining `prompts` are prefilled: one forward per length bucket, at the batch bucket
        that holds its prompts (at most `_cap` of them: more take several forwards); the prompts whose prefix
        the prefix cache holds for their partition (`partitions`, one per prompt; None: no reuse)
        in forwards of their own, one per length bucket of their uncached rests. Shortest length
        bucket first, in the order they came within a bucket: a short prompt's first token does
        not wait for a long prompt's forward."""
        out: list[Forward] = []
        # (behind a cached prefix, length bucket) -> its forward still taking prompts
        open_at: dict[tuple[bool, int], Forward] = {}
        use = partitions is not None and self.prefix is not None
        if self.prefix is not None:
            self.prefix.settle()  # the blocks the last admission looked up are copied
        for i, p in enumerate(prompts):
            part = partitions[i] if use else None
            blocks = self._cached_blocks(part, p) if part is not None else []
            # Behind a cached prefix, the bucket of the rest of the prompt (what is prefilled).
            length = self.plan.length(len(p) - len(blocks) * self.prefix.block if blocks else len(p))
            key = (bool(blocks), length)
            fwd = open_at.get(key)
            if fwd is None or len(fwd.indices) == self._cap(length):
                fwd = open_at[key] = Forward([], [], counted=use, length=length)
                out.append(fwd)
            fwd.indices.append(i)
            fwd.partitions.append(part)
            if blocks:
                fwd.behind.append(blocks)
        return self._fit(sorted(out, key=lambda f: f.length))  # stable: arrival order within a bucket

    def padded_tokens(self, fwd: Forward) -> int:
        """The padded tokens a forward of `forwards` runs (its batch bucket × length bucket)."""
        return self.plan.prefill_batch(len(fwd.indices)) * fwd.length

    def _fit(self, forwards: list[Forward]) -> list[Forward]:
        """Splits a forward behind cached prefixes whose batch bucket's rows would not fit in the
        free slots (after the rows of the forwards before it) into forwards of the largest prefill
        batch that fits, in order, so each part's first tokens leave before the next part runs."""
        out: list[Forward] = []
        rows = self.rows
        for planned in forwards:
            fwd = planned
            while fwd.behind and rows + self.plan.prefill_batch(len(fwd.indices)) > self.slots.slots:
                n = self._fitting(rows)  # < len(fwd.indices): a smaller bucket than the one that holds them
                out.append(fwd.part(0, n))
                fwd, rows = fwd.part(n, len(fwd.indices)), rows + n
            out.append(fwd)
            rows += len(fwd.indices)
        return out

    def _fitting(self, rows: int) -> int:
        """The largest prefill batch whose rows fit in the slots after `rows` (at least 1)."""
        fits = [b for b in self.plan.prefill_batches if rows + b <= self.slots.slots]
        return fits[-1] if fits else 1

    def _cap(self, length: int) -> int:
        """The most prompts of one forward at this length bucket: the largest prefill batch
        within `prefill_tokens` (at least 1)."""
        fits = [b for b in self.plan.prefill_batches if b * length <= self.prefill_tokens]
        return fits[-1] if fits else 1

    def prefill(self, fwd: Forward, prompts: list[list[int]], room: int) -> torch.Tensor:
        """Runs one of `forwards`: its prompts into the next free slots, in its order. Returns
        their last logits, row i the i-th prompt's, at the forward's batch bucket [batch, vocab]
        (rows past the prompts are padding), and sets `fwd.cached`."""
        ps = [prompts[i] for i in fwd.indices]
        if fwd.behind:
            group = list(zip(ps, fwd.partitions, fwd.behind, strict=True))
            logits, batch = self._prefill_behind(group, fwd.length)
            fwd.cached = [len(blocks) * self.prefix.block for blocks in fwd.behind]
            fwd.shape = ("prefill_cached", batch, fwd.length)
        else:
            logits = self._prefill_group(list(zip(ps, fwd.partitions, strict=True)))
            fwd.cached = [0] * len(ps)
            fwd.shape = ("prefill", self.plan.prefill_batch(len(ps)), fwd.length)
        if self.prefix is not None and fwd.counted:
            for p, cached in zip(ps, fwd.cached, strict=True):
                self.prefix.count(len(p), cached)
        return logits

    def _cached_blocks(self, partition: str, prompt: list[int]) -> list:
        """The prompt's cached prefix blocks, when prefilling behind them runs a shorter bucket."""
        blocks = self.prefix.lookup(partition, prompt)
        if not blocks:
            return []
        rest = len(prompt) - len(blocks) * self.prefix.block
        if self.plan.length(rest) >= self.plan.length(len(prompt)):
            return []  # the same bucket either way: nothing saved
        return blocks

    def _prefill_group(self, group: list[tuple[list[int], str | None]]) -> torch.Tensor:
        """Prompts of one length bucket, in one forward at the batch bucket that holds them."""
        prompts = [p for p, _ in group]
        batch = self.plan.prefill_batch(len(prompts))
        length = self.plan.length(max(len(p) for p in prompts))
        with self.census.watch():
            ids, mask, pos = self.adapter.padded_prompts(prompts, batch, length)
        logits, keys, values = self.adapter.prefill_padded(ids, mask, pos)
        self.shapes.record("prefill", batch, length, sum(len(p) for p in prompts))
        with self.census.watch():
            self.slots.make_room(length, self.rows)
            for i, (p, part) in enumerate(group):
                self.slots.write(self.rows, keys, values, i, mask[i], pos[i, -1:], len(p))
                self._keep_prefix(part, p)
                self.rows += 1
        return logits  # the whole batch bucket: rows past the prompts are padding

    def _prefill_behind(self, group: list[tuple[list[int], str, list]], window: int) -> tuple[torch.Tensor, int]:
        """Prompts whose first blocks are cached, with rests of one length bucket (`window`): the
        blocks are copied into their slots and only the rests are prefilled, in one forward at
        the prefill batch bucket that holds them, after the cached columns. Where the free slots
        cannot hold that bucket's padding rows (`forwards` plans around that; rows it did not
        expect), several forwards at the largest batch that fits. Returns their last logits and
        the largest batch it ran at."""
        batch = self.plan.prefill_batch(len(group))
        if self.rows + batch > self.slots.slots:
            n = self._fitting(self.rows)
            head, head_batch = self._prefill_behind(group[:n], window)  # n is a batch bucket: n rows
            rest, rest_batch = self._prefill_behind(group[n:], window)
            return torch.cat([head, rest]), max(head_batch, rest_batch)
        block = self.prefix.block
        with self.census.watch():
            self.slots.make_room(max(window, *(len(p) for p, _, _ in group)), self.rows)
            first = self.rows
            cache, mask, columns = self.slots.write_prefixes(first, batch, [(b, len(p)) for p, _, b in group], window)
            ids, pos = self._behind_inputs([p for p, _, _ in group], batch, window)
        logits = self.adapter.extend_static(ids, cache, mask, pos, columns)
        real = sum(len(p) - len(b) * block for p, _, b in group)
        self.shapes.record("prefill_cached", batch, window, real)
        with self.census.watch():
            for p, part, _ in group:
                self._keep_prefix(part, p)
                self.rows += 1
        return logits, batch  # the whole batch bucket: rows past the prompts are padding

    def _behind_inputs(self, prompts: list[list[int]], batch: int, window: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The last `window` tokens of each prompt and their positions, left padded, [batch,
        window] on the device (padding rows: their own window)."""
        pad = self.adapter.pad_id
        ids, pos = [], []
        for p in prompts:
            n = len(p)
            fed = p[max(0, n - window) :]
            ids.append([pad] * (window - len(fed)) + fed)
            pos.append([0] * (window - len(fed)) + list(range(n - len(fed), n)))
        ids += [[pad] * window] * (batch - len(prompts))
        pos += [list(range(window))] * (batch - len(prompts))
        dev = self.slots.device
        return torch.tensor(ids, dtype=torch.long).to(dev), torch.tensor(pos, dtype=torch.long).to(dev)

    def _keep_prefix(self, partition: str | None, prompt: list[int]) -> None:
        """Offers the prompt's blocks, now in slot `self.rows`, to the prefix cache."""
        if partition is None or self.prefix is None:
            return
        slot, block = self.rows, self.prefix.block
        self.prefix.store(partition, prompt, lambda i: self.slots.read_block(slot, len(prompt), block, i))

    def step(self, tokens: list[int]) -> torch.Tensor:
        """One decode step: logits of the whole batch bucket [bucket, V] (rows past `tokens` are
        padding), never cut to the running rows, so every op after it keeps the bucket's shape."""
        n = len(tokens)
        bucket = self.plan.batch(n)
        with self.census.watch():
            fed = torch.tensor(tokens + [self.adapter.pad_id] * (bucket - n), dtype=torch.long).to(self.slots.device)
            cache, mask, pos, column = self.slots.step(n, bucket)
        logits = self.adapter.step_static(fed, cache, mask, pos, column)
        self.shapes.record("decode", bucket, mask.shape[-1], n)  # the step's window (slots.py)
        return logits

    def warm(self, progress, token) -> int:
        """Runs every forward shape of the plan once, on an empty batch (a compiled model
        compiles them now, not in a caller's request); returns how many."""
        shapes = self.plan.forward_shapes()
        pad = self.adapter.pad_id
        platform = platform_for(self.adapter.device)
        for i, (kind, b, n) in enumerate(shapes):
            token.check()
            what = {"prefill": f", length {n}", "decode": f", over {n} columns"}.get(kind, "")
            progress(i, len(shapes), f"compiling the {kind} of batch {b}{what}")
            with torch.no_grad():
                if kind == "prefill":
                    # Left padded, as nearly every real prompt is (a prompt filling its bucket exactly
                    # takes the same graph: the mask is an input, not a branch).
                    self.adapter.prefill_static([[pad] * max(n - 1, 1)] * b, b, n)
                elif kind == "prefill_cached":
                    self.slots.make_room(n, 0)
                    cache, mask, columns = self.slots.write_prefixes(0, b, [], n)
                    ids = torch.full((b, n), pad, dtype=torch.long, device=self.slots.device)
                    pos = torch.arange(n, device=self.slots.device).repeat(b, 1)
                    self.adapter.extend_static(ids, cache, mask, pos, columns)
                else:
                    cache, mask, pos, column = self.slots.step(0, b, least=n)
                    fed = torch.full((b,), pad, dtype=torch.long, device=self.slots.device)
                    self.adapter.step_static(fed, cache, mask, pos, column)
            # The warm-up's time is the compiles' and their first runs' (the device's queue included).
            platform.synchronize(self.adapter.device)
        self.slots.reset()
        return len(shapes)

    def warm_steps(self) -> None:
        """The work around the forward at every shape of the plan, no forward run (the census's
        warm-up, census.py): a prefill's inputs and its writes into a slot, a decode step's
        inputs and bookkeeping, the moves of a leave and of a full cache."""
        pad = self.adapter.pad_id
        slots = self.slots
        dtype, dev = slots.keys[0].dtype, slots.device
        heads, dim = slots.keys[0].shape[1], slots.keys[0].shape[3]
        for kind, b, n in self.plan.forward_shapes():
            if kind == "prefill":
                # One zero tensor stands for every layer's keys and values: a copy per layer would
                # hold a whole prefill's cache at the largest bucket for inputs the writes only read.
                keys = [torch.zeros((b, heads, n, dim), dtype=dtype, device=dev)] * len(slots.keys)
                with self.census.watch():
                    _, mask, pos = self.adapter.padded_prompts([[pad]] * b, b, n)
                    slots.make_room(n, 0)
                    slots.write(0, keys, keys, 0, mask[0], pos[0, -1:], 1)
            elif kind == "prefill_cached":
                block = self.prefix.block
                slots.make_room(max(n, block), 0)
                k, v = slots.read_block(0, block, block, 0)
                cached = SimpleNamespace(keys=[t.clone() for t in k], values=[t.clone() for t in v])
                with self.census.watch():
                    if self.prefix._pool is not None:  # a cached block as the pool lends it
                        cached = SimpleNamespace(
                            keys=list(self.prefix._pool[0, 0].unbind(0)), values=list(self.prefix._pool[0, 1].unbind(0))
                        )
                    slots._view(slice(0, b), b)  # a view of other slots, made at its first use
                    slots.write_prefixes(0, b, [([cached], block)], n)  # one cached block copied in
                    self._behind_inputs([], b, n)
            elif kind == "decode":
                with self.census.watch():
                    torch.tensor([pad] * b, dtype=torch.long).to(dev)
                    slots.step(min(b, 1), b, least=n)
            slots.reset()
        with self.census.watch():
            if self.prefix is not None:  # a prompt's blocks copied into the prefix cache
                slots.make_room(self.prefix.block, 0)
                keys, values = slots.read_block(0, self.prefix.block, self.prefix.block, 0)
                if self.prefix._pool is None:
                    self.prefix.reserve(len(keys), keys[0].shape[0], keys[0].shape[2], keys[0].dtype, keys[0].device)
                pool = self.prefix._pool  # a block's copy into the pool (a free entry: overwritten at its use)
                for layer, (kt, vt) in enumerate(zip(keys, values, strict=True)):
                    pool[0, 0, layer].copy_(kt)
                    pool[0, 1, layer].copy_(vt)
            if slots.slots > 1:
                slots.move(1, 0)
            slots._shift(1, 0)
            slots._shift(-1, 0)
        slots.reset()

    def keep(self, rows: list[int]) -> bool:
        with self.census.watch():
            self._keep(rows)
        self.rows = len(rows)
        return True

    def _keep(self, rows: list[int]) -> None:
        for j, i in enumerate(rows):  # rows ascend, so a source is never overwritten before it moves
            if i != j:
                self.slots.move(i, j)

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
    spec = adapter.entry.prefix_cache
    prefix = PrefixCache(spec.max_bytes, spec.block_tokens) if plan.cached_lengths else None
    return StaticRows(adapter, plan, adapter.shapes, plan.cache_columns(max_new_tokens), prefix)
