"""Choosing the next token of one sequence: greedy, or sampled with its own generator.

Sampling runs on the CPU in float32 with a per-sequence `torch.Generator` that draws exactly
one number per token, so a sequence's tokens depend on its seed and its logits only: not on
the batch it shares, the other sequences' parameters, or the device's random state.
Log-probabilities are those of the model's own distribution (before temperature, top-k and
top-p), as OpenAI-style APIs report them.
"""

from __future__ import annotations

import torch

from .params import GenParams


def sequence_generator(seed: int, index: int) -> torch.Generator:
    """The generator of prompt `index` of a request seeded with `seed`: prompt 0 uses the seed
    itself, the others a 32-bit mix of (seed, index) (the CPU generator keeps 32 bits of a seed)."""
    return torch.Generator(device="cpu").manual_seed(seed if index == 0 else _mix(seed, index))


def _mix(seed: int, index: int) -> int:
    # splitmix64's finaliser over (seed, index): neighbouring seeds and indexes land far apart.
    z = ((seed << 32) + index) * 0x9E3779B97F4A7C15 & 0xFFFFFFFFFFFFFFFF
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) & 0xFFFFFFFF


def sample(logits: torch.Tensor, p: GenParams, gen: torch.Generator) -> int:
    """One token from a float32 CPU row of logits, with temperature, top-k and top-p."""
    scaled = logits / p.temperature
    if p.top_k and p.top_k < scaled.numel():
        vals, idx = torch.topk(scaled, p.top_k)  # sorted, largest first
    elif p.top_p < 1:
        vals, idx = torch.sort(scaled, descending=True, stable=True)
    else:
        vals, idx = scaled, None
    probs = torch.softmax(vals, dim=-1)
    if p.top_p < 1:
        # Keep the smallest prefix (of the sorted tokens) whose mass reaches top_p; never empty.
        before = torch.cumsum(probs, dim=-1) - probs
        probs = torch.where(before < p.top_p, probs, torch.zeros_like(probs))
    cum = torch.cumsum(probs, dim=-1)
    u = torch.rand((), generator=gen, dtype=torch.float32) * cum[-1]
    j = int(torch.searchsorted(cum, u.reshape(1), right=True).clamp(max=cum.numel() - 1))
    while j > 0 and probs[j] == 0:  # rounding at the top end: step back onto a kept token
        j -= 1
    return int(idx[j]) if idx is not None else j


def top_logprobs(logits: torch.Tensor, chosen: int, k: int) -> tuple[float, list[tuple[int, float]]]:
    """The chosen token's log-probability and the k most likely tokens with theirs."""
    lp = torch.log_softmax(logits, dim=-1)
    vals, idx = torch.topk(lp, k) if k else (lp[:0], lp[:0].long())
    return float(lp[chosen]), [(int(i), float(v)) for i, v in zip(idx.tolist(), vals.tolist(), strict=True)]
