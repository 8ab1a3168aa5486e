"""Reshaping a running batch's KV cache at token boundaries: merge joining rows in, drop
finished rows, trim columns no row needs.

Only plain dynamic caches (every layer a growing [batch, heads, seq, dim] key and value
tensor: transformers 5.x `DynamicLayer`, or 4.x `key_cache`/`value_cache` lists) can be
reshaped; for any other cache (sliding windows, static or quantized caches) `tensors_of`
returns None and the decode loop runs such a model one batch at a time instead.
Rows are left padded: every row's valid tokens are a contiguous suffix, masked by `mask`.
"""

from __future__ import annotations

from typing import Any

import torch


def tensors_of(cache: Any) -> list[tuple[Any, str]] | None:
    """(holder, attribute) pairs addressing every key and value tensor, or None if unsupported."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        try:
            from transformers.cache_utils import DynamicLayer
        except ImportError:  # pragma: no cover - a transformers without DynamicLayer
            return None
        if not all(type(layer) is DynamicLayer and getattr(layer, "is_initialized", False) for layer in layers):
            return None
        return [(layer, name) for layer in layers for name in ("keys", "values")]
    k, v = getattr(cache, "key_cache", None), getattr(cache, "value_cache", None)
    if isinstance(k, list) and isinstance(v, list) and k and len(k) == len(v):
        return [(lst, i) for lst in (k, v) for i in range(len(lst))]
    return None


def _get(holder, name):
    return holder[name] if isinstance(holder, list) else getattr(holder, name)


def _set(holder, name, value) -> None:
    if isinstance(holder, list):
        holder[name] = value
    else:
        setattr(holder, name, value)


def _pad_left(t: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    if n == 0:
        return t
    shape = list(t.shape)
    shape[dim] = n
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def merge(a: Any, mask_a: torch.Tensor, b: Any, mask_b: torch.Tensor) -> tuple[Any, torch.Tensor]:
    """Appends b's rows to a's (left padding the shorter); returns (a, merged mask)."""
    la, lb = mask_a.shape[1], mask_b.shape[1]
    length = max(la, lb)
    ta, tb = tensors_of(a), tensors_of(b)
    assert ta is not None and tb is not None and len(ta) == len(tb)
    for (ha, na), (hb, nb) in zip(ta, tb, strict=True):
        ka, kb = _get(ha, na), _get(hb, nb)
        _set(ha, na, torch.cat([_pad_left(ka, length - la, -2), _pad_left(kb, length - lb, -2)], dim=0))
    mask = torch.cat([_pad_left(mask_a, length - la, 1), _pad_left(mask_b, length - lb, 1)], dim=0)
    return a, mask


def select(cache: Any, mask: torch.Tensor, rows: list[int]) -> tuple[Any, torch.Tensor]:
    """Keeps `rows` (in that order), then drops leading columns no kept row attends to."""
    idx = torch.tensor(rows, dtype=torch.long, device=mask.device)
    mask = mask.index_select(0, idx)
    used = mask.any(dim=0)
    first = int(used.int().argmax()) if bool(used.any()) else 0
    for h, n in tensors_of(cache) or []:
        _set(h, n, _get(h, n).index_select(0, idx)[..., first:, :])
    return cache, mask[:, first:]
