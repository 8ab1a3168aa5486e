"""The host CPU: no queue to wait for, memory from /proc."""

from __future__ import annotations

import os
import time

import torch

from .base import Platform

# Test knob (runtime/PROTOCOL.md, "Environment"): every synchronize() waits this long, as a host
# waits for a slower device. The budget-cap tests use it to give work a known floor of device
# time per benchmark iteration, whatever the host's load; 0 (the default) in production.
DEVICE_WAIT_S = float(os.environ.get("TPU_WORKER_CPU_DEVICE_WAIT_S") or 0)


def free_memory_cap() -> int | None:
    """TPU_WORKER_FREE_MEMORY_BYTES: the most free memory the worker reads on the CPU (a smaller
    host, such as a 2 GiB laptop, or memory kept for other processes); unset: MemAvailable."""
    raw = os.environ.get("TPU_WORKER_FREE_MEMORY_BYTES", "").strip()
    if not raw:
        return None
    if not raw.isdigit():
        raise ValueError(
            f"TPU_WORKER_FREE_MEMORY_BYTES must be a whole number of bytes, such as 2147483648; got {raw!r}"
        )
    return int(raw)


def read_meminfo(path: str = "/proc/meminfo") -> tuple[int | None, int | None]:
    """(MemTotal, MemAvailable) in bytes from /proc/meminfo; None when unreadable."""
    values: dict[str, int] = {}
    try:
        with open(path, encoding="ascii") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts and parts[0].isdigit():
                    values[key] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    except OSError:
        return None, None
    return values.get("MemTotal"), values.get("MemAvailable")


class CpuPlatform(Platform):
    kind = "cpu"
    fallback_detection = "none needed: the target is the CPU"

    def memory_info(self, index: int | None) -> tuple[int | None, int | None]:
        total, free = read_meminfo()
        cap = free_memory_cap()
        return total, (min(free, cap) if free is not None and cap is not None else free)

    def synchronize(self, device: torch.device) -> None:
        if DEVICE_WAIT_S > 0:
            time.sleep(DEVICE_WAIT_S)
