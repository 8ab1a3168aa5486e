"""Dispersion of one benchmark series: median absolute deviation and a bootstrap confidence
interval of the median. Pure functions of the samples (no clock, no torch): the same samples give
the same figures, so a verdict built on them can be tested with made-up noise."""

from __future__ import annotations

import numpy as np

RESAMPLES = 1000
LEVEL = 0.95
# Resamples drawn per chunk: bounds the index matrix to ~16 MiB even at 10,000 iterations.
_CHUNK_CELLS = 2_000_000


def median(values: list[float]) -> float:
    if not values:
        raise ValueError("no samples")
    return float(np.median(np.asarray(values, dtype=np.float64)))


def mad(values: list[float]) -> float:
    """Median absolute deviation from the median (unscaled: about 0.67 sigma for normal noise).
    Robust where the standard deviation is not: one preempted call moves it very little."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("no samples")
    return float(np.median(np.abs(x - np.median(x))))


def bootstrap_median_ci(
    values: list[float], *, seed: int, resamples: int = RESAMPLES, level: float = LEVEL
) -> tuple[float, float]:
    """Percentile-bootstrap interval of the median: `resamples` draws with replacement from a
    generator seeded with `seed`, so the interval is a function of the samples alone."""
    x = np.asarray(values, dtype=np.float64)
    n = x.size
    if n == 0:
        raise ValueError("no samples")
    if n == 1:
        return float(x[0]), float(x[0])
    rng = np.random.default_rng(seed)
    medians = np.empty(resamples, dtype=np.float64)
    per_chunk = max(1, _CHUNK_CELLS // n)
    for lo in range(0, resamples, per_chunk):
        hi = min(resamples, lo + per_chunk)
        idx = rng.integers(0, n, size=(hi - lo, n))
        medians[lo:hi] = np.median(x[idx], axis=1)
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = np.percentile(medians, [tail, 100.0 - tail])
    return float(low), float(high)
