"""A preallocated KV cache with fixed slots, for the static decode loop (generation/loop.py).

One key and one value tensor per layer, [slots, heads, length, head_dim], allocated once at the
model's load. Every running sequence owns one slot; the running ones are kept in slots
0..n-1, so a decode step runs on the first `bucket` slots (a view: the shape is one of the
plan's batch buckets whatever joins or leaves). All slots write the same column at a step
(transformers' StaticLayer keeps one write position): a sequence's tokens are a contiguous run
of columns ending at that column, left padded and masked by `mask`, its positions its own
(`pos`). A step attends over the first `window` columns only, the smallest of the plan's decode
lengths that holds the shared column, so its cost follows the longest running row, not the slot
(a view of the same tensors: one fixed shape per (batch bucket, window)); when the row that
reached furthest left leaves and a smaller window would hold the rest, every slot moves left to
column 0 (`_pack`). A joining sequence is prefilled on its own at its length bucket and its keys and values
copied into a free slot so that they end at the shared column; a finished one frees its slot
(the last running slot moves into it). When the shared column reaches the end, every slot
moves left by the columns no running sequence uses; a joiner longer than the columns before
the shared column moves every slot right. Moves copy data within the tensors, so no shape
changes. The buckets' caches are transformers StaticCache objects whose layers are views of
these tensors (StaticCache is what the model code supports for a fixed-size cache). With a
prefix cache, a few spare slots follow the largest decode batch (ShapePlan.spare_slots): a
prefill behind cached prefixes runs in slots, its padding rows included, and the spare ones hold
those rows when the batch is nearly full; no decode step reaches them.
"""

from __future__ import annotations

from typing import Any

import torch


def static_cache_problem(model) -> str | None:
    """Why this model's cache cannot be static (None: it can)."""
    try:
        from transformers.cache_utils import StaticCache, StaticLayer
    except ImportError:  # pragma: no cover - transformers without StaticCache
        return "this transformers has no StaticCache"
    if not getattr(model, "_can_compile_fullgraph", False):
        return f"{type(model).__name__} does not support transformers' StaticCache"
    try:
        probe = StaticCache(config=model.config, max_cache_len=8)
    except Exception as exc:  # noqa: BLE001 - any refusal means: not static
        return f"StaticCache refused this model's config ({type(exc).__name__})"
    if not probe.layers or not all(type(layer) is StaticLayer for layer in probe.layers):
        return "its attention layers are not all full attention (sliding windows or other cache layers)"
    return None


def kv_layout(cfg) -> tuple[int, int, int]:
    """(layers, key/value heads, head_dim) of a model's config: a transformers config or its
    config.json as a dict (GPT-2's names too). Grouped-query attention keeps fewer key/value heads
    than query heads, so the cache is not hidden_size wide (SmolLM2: 3 × 64, not 576)."""
    if isinstance(cfg, dict):
        cfg = cfg.get("text_config") or cfg
        get = cfg.get
    else:
        get = lambda name: getattr(cfg, name, None)  # noqa: E731
    heads = int(get("num_attention_heads") or get("n_head"))
    kv_heads = int(get("num_key_value_heads") or heads)
    head_dim = int(get("head_dim") or int(get("hidden_size") or get("n_embd")) // heads)
    return int(get("num_hidden_layers") or get("n_layer")), kv_heads, head_dim


def max_positions(cfg) -> int:
    """The positions a model's config allows (GPT-2's n_positions, else max_position_embeddings)."""
    get = cfg.get if isinstance(cfg, dict) else lambda name: getattr(cfg, name, None)
    return int(get("n_positions") or get("max_position_embeddings") or 1024)


def slot_cache_bytes(cfg, *, slots: int, length: int, itemsize: int) -> int:
    """What SlotCache allocates: a key and a value tensor [slots, heads, length, head_dim] per
    layer (the memory pre-flight counts this, memory.py)."""
    layers, heads, head_dim = kv_layout(cfg)
    return 2 * layers * slots * heads * length * head_dim * itemsize


class SlotCache:
    def __init__(
        self,
        model,
        *,
        slots: int,
        length: int,
        buckets: tuple[int, ...],
        dtype,
        device,
        windows: tuple[int, ...] = (),
    ) -> None:
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        n_layers, heads, head_dim = kv_layout(cfg)
        self.slots, self.length, self.device, self.dtype = slots, length, device, dtype
        # The columns a decode step may attend over (ShapePlan.decode_lengths), the whole cache last.
        self.windows = (*sorted({w for w in windows if 0 < w < length}), length)
        shape = (slots, heads, length, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.mask = torch.zeros((slots, length), dtype=torch.long, device=device)
        self.pos = torch.zeros((slots, 1), dtype=torch.long, device=device)  # each slot's newest position
        self.column = 0  # the next column every slot writes
        # Each slot's first used column, kept on the host (make_room reads no device value).
        self.first = [length] * slots
        self._columns = torch.arange(length, dtype=torch.long, device=device)
        self._slot_ids = torch.arange(slots, dtype=torch.long, device=device)[:, None]
        self.shifts = 0  # times every slot's columns moved (left at the end, right for a joiner)
        # Each layer's write position (StaticLayer.cumulative_length, which its update advances),
        # shared by that layer's view in every bucket: a prefill behind cached prefixes writes there.
        self._written = [torch.zeros((), dtype=torch.long, device=device) for _ in range(n_layers)]
        # The column a decode step writes, one tensor read by every layer of every step view
        # (_StepLayer): one copy a step, where a write position per layer took 30 on SmolLM2.
        self._at = torch.zeros((1,), dtype=torch.long, device=device)
        self._config, self._heads, self._head_dim = model.config, heads, head_dim
        # (batch bucket, window) -> the view of the first `batch` slots' first `window` columns
        self.views: dict[tuple[int, int], Any] = {(b, length): self._step_view(b, length) for b in buckets}
        # (first slot, batch) -> the view of those slots: a prefill behind cached prefixes
        self._slot_views: dict[tuple[int, int], Any] = {}

    def _view(self, rows: slice, batch: int, window: int | None = None):
        from transformers.cache_utils import StaticCache

        window = window or self.length
        cache = StaticCache(config=self._config, max_cache_len=window)
        for i, layer in enumerate(cache.layers):
            layer.keys, layer.values = self.keys[i][rows, :, :window], self.values[i][rows, :, :window]
            layer.max_cache_len = window
            layer.device, layer.batch_size, layer.num_heads = self.device, batch, self._heads
            layer.k_head_dim = layer.v_head_dim = self._head_dim
            layer.cumulative_length = self._written[i]
            layer.is_initialized = True
        return cache

    def _step_view(self, batch: int, window: int):
        """The view a decode step of `batch` slots runs on, over the first `window` columns: its
        layers write the step's one column at `_at` (_StepLayer)."""
        cache = self._view(slice(0, batch), batch, window)
        layer_class = _step_layer()
        for layer in cache.layers:
            layer.__class__ = layer_class
            layer.at = self._at
        return cache

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in [*self.keys, *self.values])

    # -- a step -------------------------------------------------------------------------------
    def step(self, running: int, bucket: int, least: int = 0) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Advances the first `bucket` slots by one column for a decode step: (their cache
        view over the step's window, its 4D additive mask, positions, the column written as
        cache_position). The window is the smallest that holds the shared column (at least
        `least`: the warm-up's shapes). Every slot of the bucket attends to the column it writes
        (a free slot to that alone, at position 0, so no row of the attention is empty)."""
        self.make_room(0, running)
        self._pack(running)
        c = self.column
        window = self.window(max(c + 1, least))
        # Index tensors and whole-tensor ops: the same input shapes whatever `running` and `c`.
        column = self._at.copy_(self._columns[c : c + 1])
        self.mask.index_fill_(1, column, 1)
        live = (self._slot_ids < running).long()
        self.pos.add_(1).mul_(live)  # running slots advance; free ones sit at position 0
        self.column += 1
        view = self.views.get((bucket, window))
        if view is None:
            view = self.views[(bucket, window)] = self._step_view(bucket, window)
        return view, self._additive(self.mask[:bucket, :window]), self.pos[:bucket], column

    def _additive(self, mask: torch.Tensor) -> torch.Tensor:
        """The step's mask as the model's 4D additive one ([rows, 1, 1, window]: 0 where a row
        attends, the dtype's minimum elsewhere), which transformers passes to attention as it
        is rather than building one from a 2D mask every step; the one query needs no causal
        part (no row has a column past the one it writes)."""
        return ((1 - mask[:, None, None, :].to(self.dtype)) * torch.finfo(self.dtype).min).contiguous()

    def window(self, columns: int) -> int:
        """The smallest decode window that holds `columns` columns."""
        for w in self.windows:
            if w >= columns:
                return w
        return self.windows[-1]

    def _pack(self, running: int) -> None:
        """Moves the slots left to column 0 when that lets a smaller window hold the running
        rows (the row that reached furthest left has gone)."""
        if not running:
            return
        first = min(self.first[:running])
        if 0 < first < self.column and self.window(self.column + 1 - first) < self.window(self.column + 1):
            self._shift(first, running)

    # -- joins and leaves ---------------------------------------------------------------------
    def make_room(self, need_before: int, running: int) -> None:
        """Makes sure `need_before` columns precede the shared column (a joiner's prompt) and one
        column is left to write, moving the running slots' columns if they must."""
        if not running:  # nothing to keep: the joiner starts at column 0 (the smallest window)
            self.column = need_before
            return
        # Left first (it may leave fewer columns before the shared one), then right.
        if self.column >= self.length:
            first = min(self.first[:running], default=self.column)
            self._shift(min(first, self.column), running)
            if self.column >= self.length:  # pragma: no cover - a sequence longer than the cache
                raise RuntimeError("the static KV cache is full")
        if self.column < need_before:
            self._shift(self.column - need_before, running)

    def _shift(self, by: int, running: int) -> None:
        """Moves every running slot's columns `by` to the left (negative: to the right)."""
        if by == 0:
            return
        # Every slot moves (free ones hold nothing anyone reads): the shapes do not depend on `running`.
        for t in [*self.keys, *self.values]:
            t.copy_(torch.roll(t, -by, dims=2))
        wrapped = self._columns >= self.length - by if by > 0 else self._columns < -by
        self.mask.copy_(torch.roll(self.mask, -by, dims=1).masked_fill_(wrapped, 0))
        self.first = [f - by for f in self.first]
        self.column -= by
        self.shifts += 1

    def write(
        self, slot: int, keys: list[torch.Tensor], values: list[torch.Tensor], row: int, mask_row, pos, used: int = 0
    ) -> None:
        """Copies row `row` of a prefill's cache (per-layer [n, heads, P, dim]) into `slot`, its
        P columns ending just before the shared column; `mask_row` [P] and `pos` its mask and
        last position; `used` its real tokens (the padding before them is free to move over)."""
        p = keys[0].shape[-2]
        c = self.column
        for i in range(len(self.keys)):
            self.keys[i][slot, :, c - p : c] = keys[i][row]
            self.values[i][slot, :, c - p : c] = values[i][row]
        self.mask[slot].zero_()
        self.mask[slot, c - p : c] = mask_row
        self.pos[slot] = pos
        self.first[slot] = c - (used or p)

    def write_prefixes(self, first: int, batch: int, prompts: list[tuple[list, int]], window: int):
        """Places prompts behind their cached prefixes in slots `first`.. (one slot each, `batch`
        slots in all: the slots after the prompts' take padding rows), for one prefill of their
        last `window` tokens. Each prompt is (its cached `blocks` (generation/prefix.py), its
        length n): its columns end just before the shared column, its blocks' keys and values
        copied into its first columns. A padding row attends to the window's columns alone.
        Returns (the slots' cache view, their mask [batch, length], the window's columns as
        cache_position). That prefill writes those columns (re-running any cached tokens among
        them)."""
        c = self.column
        for j in range(batch):
            slot = first + j
            blocks, n = prompts[j] if j < len(prompts) else ([], window)
            col = c - n
            for b in blocks:
                keys, values = b.keys, b.values
                w = keys[0].shape[-2]
                for i in range(len(self.keys)):
                    self.keys[i][slot, :, col : col + w] = keys[i]
                    self.values[i][slot, :, col : col + w] = values[i]
                col += w
            self.mask[slot].copy_((self._columns >= c - n) & (self._columns < c))  # no slice at the prompt's length
            self.pos[slot] = n - 1
            self.first[slot] = c - n
        for w in self._written:
            w.fill_(c - window)
        view = self._slot_views.get((first, batch))
        if view is None:
            view = self._slot_views[(first, batch)] = self._view(slice(first, first + batch), batch)
        columns = torch.arange(c - window, c, dtype=torch.long, device=self.device)
        return view, self.mask[first : first + batch], columns

    def read_block(self, slot: int, n: int, block: int, index: int):
        """Block `index` ([block] tokens) of the prompt of `n` tokens that ends before the shared
        column in `slot`: per-layer keys and values [heads, block, dim] (views)."""
        a = self.column - n + index * block
        return [k[slot, :, a : a + block] for k in self.keys], [v[slot, :, a : a + block] for v in self.values]

    def move(self, src: int, dst: int) -> None:
        """Slot `src` takes slot `dst`'s place (dst is free)."""
        for t in [*self.keys, *self.values]:
            t[dst] = t[src]
        self.mask[dst] = self.mask[src]
        self.pos[dst] = self.pos[src]
        self.first[dst] = self.first[src]

    def reset(self) -> None:
        self.mask.zero_()
        self.pos.zero_()
        self.column = 0
        self.first = [self.length] * self.slots


_STEP_LAYER: type | None = None


def _step_layer() -> type:
    """transformers' StaticLayer writing a decode step's column at `at` (a tensor the slot cache
    sets once a step, shared by every layer) instead of at a write position of its own, which
    its update would rebuild and advance in every layer: 3 more ops per layer and step."""
    global _STEP_LAYER
    if _STEP_LAYER is None:
        from transformers.cache_utils import StaticLayer

        class _StepLayer(StaticLayer):
            at: torch.Tensor

            def update(self, key_states, value_states, *args, **kwargs):
                self.keys.index_copy_(2, self.at, key_states)
                self.values.index_copy_(2, self.at, value_states)
                return self.keys, self.values

        _STEP_LAYER = _StepLayer
    return _STEP_LAYER
