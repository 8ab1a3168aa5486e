"""Output error against a float32 eager reference computed on the CPU for the same inputs."""

from __future__ import annotations

import math

import torch

REFERENCE = "cpu float32 eager"


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def compare(out: torch.Tensor | None, ref: torch.Tensor | None) -> dict:
    """max/mean absolute error, max relative error (to the reference's largest magnitude), and
    cosine similarity per output row (last dimension: an embedding, a logits vector).

    Returns None figures when the two are not comparable (missing, or different shapes).
    """
    empty = {
        "max_abs_error_vs_fp32": None,
        "mean_abs_error_vs_fp32": None,
        "max_rel_error_vs_fp32": None,
        "cosine_similarity_vs_fp32": None,
        "nonfinite_outputs": None,
    }
    if out is None or ref is None or tuple(out.shape) != tuple(ref.shape) or out.numel() == 0:
        return empty
    o = out.detach().to("cpu", torch.float64)
    r = ref.detach().to("cpu", torch.float64)
    bad = int((~torch.isfinite(o)).sum())
    if bad:
        return {**empty, "nonfinite_outputs": bad}
    diff = (o - r).abs()
    max_abs = float(diff.max())
    scale = float(r.abs().max())
    rows_o = o.reshape(-1, o.shape[-1]) if o.dim() >= 2 else o.reshape(1, -1)
    rows_r = r.reshape(-1, r.shape[-1]) if r.dim() >= 2 else r.reshape(1, -1)
    cos = torch.nn.functional.cosine_similarity(rows_o, rows_r, dim=1, eps=1e-30)
    return {
        "max_abs_error_vs_fp32": _finite(max_abs),
        "mean_abs_error_vs_fp32": _finite(float(diff.mean())),
        "max_rel_error_vs_fp32": _finite(max_abs / scale) if scale > 0 else (0.0 if max_abs == 0 else None),
        # The worst row: one bad embedding must not hide behind a good average.
        "cosine_similarity_vs_fp32": _finite(min(1.0, float(cos.min()))),
        "nonfinite_outputs": 0,
    }
