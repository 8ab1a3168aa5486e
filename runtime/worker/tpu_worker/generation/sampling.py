"""Choosing the next token of every row of a decode step, on the device, at the step's bucket shape.

`choose` takes the logits of the whole batch bucket [B, V] and per-row parameters as tensors
[B] (`RowParams`: temperature, top-p, top-k, seed key, step), so the ops it runs have the same
input shapes whatever rows are running, sampled, greedy or padding. Sampling draws one uniform
number per row and token from a counter-based hash of (the row's seed key, its token index): no
generator state, no host read, the same draw whatever batch the row shares. Greedy rows take
the argmax. Log-probabilities are those of the model's own distribution (before temperature,
top-k and top-p), as OpenAI-style APIs report them; the top `k` of every row are computed at
one `k` (the model's max_logprobs) and the host keeps each row's own number of them.

The result is one small tensor per step: the chosen ids [B], or with logprobs [B, 2 + 2k]
(id, its logprob, the top k logprobs, their ids) in float32 (ids below 2**24 are exact).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .params import GenParams

_M32 = 0xFFFFFFFF


@dataclass
class SeedStream:
    """A sequence's draws: its 32-bit key and the index of its next token."""

    key: int
    step: int = 0


def sequence_generator(seed: int, index: int) -> SeedStream:
    """The draws of prompt `index` of a request seeded with `seed`: prompt 0 uses the seed itself,
    the others a 32-bit mix of (seed, index)."""
    return SeedStream((seed if index == 0 else _mix(seed, index)) & _M32)


def _mix(seed: int, index: int) -> int:
    # splitmix64's finaliser over (seed, index): neighbouring seeds and indexes land far apart.
    z = ((seed << 32) + index) * 0x9E3779B97F4A7C15 & 0xFFFFFFFFFFFFFFFF
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) & 0xFFFFFFFF


def _hash32(x: torch.Tensor) -> torch.Tensor:
    # A 32-bit integer finaliser in int64 arithmetic: a product may wrap past 2**63, its low 32
    # bits (all that is kept) are still right.
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def uniform(keys: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """One float32 in [0, 1) per row from (key, step) [B] int64: 24 bits of a hash of both."""
    x = _hash32(_hash32(keys & _M32) ^ (steps & _M32))
    return (x >> 8).to(torch.float32) * (1.0 / (1 << 24))


@dataclass
class RowParams:
    """Per-row sampling parameters [B] on the device (padding and greedy rows: greedy)."""

    greedy: torch.Tensor  # bool
    temperature: torch.Tensor  # float32, 1 where greedy (never divided by 0)
    top_p: torch.Tensor  # float32
    top_k: torch.Tensor  # int64, 0 = off
    keys: torch.Tensor  # int64
    steps: torch.Tensor  # int64

    @classmethod
    def build(cls, rows: list[tuple[GenParams, SeedStream] | None], device) -> RowParams:
        """From each row's (params, draws), None for a greedy or padding row; one host build and
        one copy per tensor, at len(rows) (the bucket)."""
        sampled = [r is not None for r in rows]
        floats = torch.tensor(
            [[r[0].temperature, r[0].top_p] if r is not None else [1.0, 1.0] for r in rows], dtype=torch.float32
        ).to(device)
        ints = torch.tensor(
            [[r[0].top_k, r[1].key, r[1].step] if r is not None else [0, 0, 0] for r in rows], dtype=torch.long
        ).to(device)
        flags = torch.tensor(sampled, dtype=torch.bool).to(device)
        return cls(~flags, floats[:, 0], floats[:, 1], ints[:, 0], ints[:, 1], ints[:, 2])


def sampled_ids(x: torch.Tensor, p: RowParams) -> torch.Tensor:
    """One token per row of float32 logits [B, V] with its temperature, top-k and top-p: the
    tokens sorted by logit (stable), top-k and then top-p keep a prefix, and the row's uniform
    draw picks within the kept mass."""
    v = x.shape[-1]
    rank = torch.arange(v, device=x.device)
    vals, idx = torch.sort(x / p.temperature[:, None], dim=-1, descending=True, stable=True)
    k = torch.where((p.top_k > 0) & (p.top_k < v), p.top_k, v)
    vals = vals.masked_fill(rank[None, :] >= k[:, None], float("-inf"))
    probs = torch.softmax(vals, dim=-1)
    # Keep the smallest prefix whose mass reaches top_p; never empty (the first has none before it).
    before = torch.cumsum(probs, dim=-1) - probs
    # top_p 1 keeps every token (a float32 cumsum may pass 1 before the tail).
    keep = (before < p.top_p[:, None]) | (p.top_p[:, None] >= 1)
    probs = torch.where(keep, probs, torch.zeros_like(probs))
    cum = torch.cumsum(probs, dim=-1)
    u = uniform(p.keys, p.steps) * cum[:, -1]
    j = (cum <= u[:, None]).sum(-1).clamp(max=v - 1)
    # Rounding at the top end: the last kept token at or before j.
    j = torch.where((probs > 0) & (rank[None, :] <= j[:, None]), rank[None, :], -1).amax(-1).clamp(min=0)
    return idx.gather(1, j[:, None]).squeeze(1)


def choose(logits: torch.Tensor, p: RowParams | None, k: int | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The step's choice on the device: (the one tensor to read: ids [B], or [B, 2 + 2k] with
    logprobs when `k` is not None; the rows' log-probabilities [B, V] when `k` is not None).
    `p` None: every row greedy."""
    x = logits.float()
    ids = x.argmax(-1)
    if p is not None:
        ids = torch.where(p.greedy, ids, sampled_ids(x, p))
    if k is None:
        return ids, None
    lp = torch.log_softmax(x, dim=-1)
    chosen = lp.gather(1, ids[:, None])
    top, top_ids = torch.topk(lp, k, dim=-1) if k else (lp[:, :0], ids[:, None][:, :0])
    out = torch.cat([ids[:, None].float(), chosen, top, top_ids.float()], dim=1)
    return out, lp


def sample(logits: torch.Tensor, p: GenParams, stream: SeedStream | torch.Generator) -> int:
    """One token from a row of logits [V] with the sequence's parameters and its next draw
    (what `choose` picks for that row in any batch); a torch.Generator instead of a sequence's
    draws gives each call a key of its own from it."""
    if isinstance(stream, torch.Generator):
        stream = SeedStream(int(torch.randint(0, 1 << 32, (), generator=stream)))
    params = RowParams.build([(p, stream)], logits.device)
    stream.step += 1
    return int(sampled_ids(logits.float()[None, :], params)[0])


def top_logprobs(logits: torch.Tensor, chosen: int, k: int) -> tuple[float, list[tuple[int, float]]]:
    """The chosen token's log-probability and the k most likely tokens with theirs."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    vals, idx = torch.topk(lp, k) if k else (lp[:0], lp[:0].long())
    return float(lp[chosen]), [(int(i), float(v)) for i, v in zip(idx.tolist(), vals.tolist(), strict=True)]
