"""Work accounting: FLOPs per item (torch.utils.flop_counter), the device's peak FLOP/s, and the
fraction of peak a configuration achieved.

Peaks are dense (no sparsity) per chip, from the vendors' published figures, divided by the
devices a chip exposes (TPU v7: two devices per chip, so one worker's device has half the peak). A float32 matmul on
a TPU runs by default as one bf16 pass, so the bf16 peak applies unless a higher matmul precision
is in force; a float32 matmul on CUDA runs at the TF32 peak when TF32 is allowed. On the CPU there
is no published figure to trust, so the worker measures a matmul peak once per dtype per life of
the process and says that it did.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import torch

T = 1e12

# Dense peak FLOP/s per chip by dtype. "float32" on TPU is the one-pass bf16 default. TPU
# "float16" has no published figure: assumed to take the bf16 path.
PEAKS: dict[str, dict[str, float]] = {
    "tpu v4": {"bfloat16": 275 * T, "float16": 275 * T, "float32": 275 * T},
    "tpu v5e": {"bfloat16": 197 * T, "float16": 197 * T, "float32": 197 * T},
    "tpu v5p": {"bfloat16": 459 * T, "float16": 459 * T, "float32": 459 * T},
    "tpu v6e": {"bfloat16": 918 * T, "float16": 918 * T, "float32": 918 * T},
    "tpu v7": {"bfloat16": 2307 * T, "float16": 2307 * T, "float32": 2307 * T},
    "nvidia a100": {"bfloat16": 312 * T, "float16": 312 * T, "tf32": 156 * T, "float32": 19.5 * T},
    "nvidia h100": {"bfloat16": 989 * T, "float16": 989 * T, "tf32": 494.7 * T, "float32": 66.9 * T},
    "nvidia h200": {"bfloat16": 989 * T, "float16": 989 * T, "tf32": 494.7 * T, "float32": 66.9 * T},
    "nvidia l4": {"bfloat16": 121 * T, "float16": 121 * T, "tf32": 60 * T, "float32": 30.3 * T},
}

# Device names as backends report them -> a key of PEAKS. Order matters (v5p before v5).
_NAME_PATTERNS: list[tuple[str, str]] = [
    (r"v5p", "tpu v5p"),
    (r"v5\s*lite|v5e|v5litepod", "tpu v5e"),
    (r"v6\s*lite|v6e|trillium", "tpu v6e"),
    (r"\bv7|ironwood", "tpu v7"),
    (r"\bv4\b|tpu\s*v4", "tpu v4"),
    (r"a100", "nvidia a100"),
    (r"h200", "nvidia h200"),
    (r"h100", "nvidia h100"),
    (r"\bl4\b", "nvidia l4"),
]

_cpu_peaks: dict[str, float] = {}
_cpu_lock = threading.Lock()


def count_flops(fn) -> tuple[Any, int]:
    """Runs fn() under FlopCounterMode; returns (its result, total FLOPs counted)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        out = fn()
    return out, int(counter.get_total_flops())


def table_key(kind: str, name: str | None) -> str | None:
    text = f"{kind} {name or ''}".lower()
    if kind not in ("tpu", "xla", "cuda"):
        return None
    for pattern, key in _NAME_PATTERNS:
        if re.search(pattern, text) and key.startswith("tpu" if kind in ("tpu", "xla") else "nvidia"):
            return key
    return None


def measure_cpu_peak(dtype: str, budget_s: float = 0.5) -> float:
    """Best observed square-matmul FLOP/s on the CPU for dtype, measured once per process."""
    with _cpu_lock:
        if dtype in _cpu_peaks:
            return _cpu_peaks[dtype]
        tdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
        # Large enough that bf16 kernels reach their stride (at 512 the bf16 "peak" came out below
        # what MiniLM's own matmuls achieved); float16 has no fast CPU path, so keep it small.
        n = 512 if dtype == "float16" else 1024
        g = torch.Generator().manual_seed(0)
        a = torch.randn((n, n), generator=g).to(tdtype)
        b = torch.randn((n, n), generator=g).to(tdtype)
        with torch.no_grad():
            torch.mm(a, b)  # first call: allocations, kernel selection
            best = float("inf")
            start = time.perf_counter()
            reps = 0
            while reps < 3 or (time.perf_counter() - start < budget_s and reps < 50):
                t0 = time.perf_counter()
                torch.mm(a, b)
                best = min(best, time.perf_counter() - t0)
                reps += 1
        peak = 2 * n**3 / best if best > 0 else 0.0
        _cpu_peaks[dtype] = peak
        return peak


def peak_flops(kind: str, name: str | None, dtype: str, matmul_precision: str) -> tuple[float | None, str]:
    """(peak FLOP/s for dtype on this device, where the figure comes from)."""
    if kind == "cpu":
        return measure_cpu_peak(dtype), f"measured: best {dtype} matmul on this CPU in this worker"
    key = table_key(kind, name)
    if key is None:
        return None, f"unknown: no peak figure for {name or kind}"
    row = PEAKS[key]
    if kind == "tpu":
        from .probe import tpu_devices_per_chip

        per_chip = tpu_devices_per_chip(name or "")
        if per_chip > 1:
            peak, source = _tpu_peak(row, key, dtype, matmul_precision)
            return (peak / per_chip if peak else None), f"{source}, per device ({per_chip} devices per chip)"
    if kind in ("tpu", "xla"):
        return _tpu_peak(row, key, dtype, matmul_precision)
    if kind == "cuda" and dtype == "float32" and matmul_precision.startswith("tf32"):
        return row["tf32"], f"table: {key} dense tf32 (TF32 allowed)"
    return row.get(dtype), f"table: {key} dense {dtype}"


def _tpu_peak(row: dict, key: str, dtype: str, matmul_precision: str) -> tuple[float | None, str]:
    if dtype == "float32":
        p = matmul_precision.lower()
        if p.startswith("highest") or p.startswith("high"):
            # HIGH is 3 bf16 passes and HIGHEST 6: the bf16 peak divided accordingly.
            passes = 6 if p.startswith("highest") else 3
            return row["bfloat16"] / passes, f"table: {key} dense bf16 / {passes} passes ({matmul_precision})"
        return row["bfloat16"], f"table: {key} dense bf16 (float32 as one bf16 pass)"
    if dtype == "float16":
        return row["bfloat16"], f"table: {key} dense bf16 (no published float16 figure; assumed bf16 path)"
    return row.get(dtype), f"table: {key} dense {dtype}"
