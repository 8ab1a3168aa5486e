"""The host's load while a series runs, read from /proc behind a small interface so that tests
(and the bench's simulated load) can hand in their own: the 1-minute load average and the CPU
time the hypervisor stole (steal jiffies over all jiffies, from /proc/stat deltas)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol


class HostSource(Protocol):
    """Where load figures come from; None where the platform has no such figure."""

    def cpu_count(self) -> int: ...

    def loadavg_1m(self) -> float | None: ...

    def cpu_jiffies(self) -> tuple[int, int] | None:
        """(steal, total) jiffies of all CPUs since boot."""
        ...


class ProcHost:
    """Linux's /proc. `root` may point at another directory with the same files (the load
    signal is simulated that way; TPU_WORKER_PROC_ROOT sets it for a whole worker)."""

    def __init__(self, root: str | None = None) -> None:
        self.root = root or os.environ.get("TPU_WORKER_PROC_ROOT") or "/proc"

    def _read(self, name: str) -> str | None:
        try:
            with open(os.path.join(self.root, name), encoding="ascii") as fh:
                return fh.read()
        except OSError:
            return None

    def cpu_count(self) -> int:
        return os.cpu_count() or 1

    def loadavg_1m(self) -> float | None:
        text = self._read("loadavg")
        try:
            return float(text.split()[0]) if text else None
        except (ValueError, IndexError):
            return None

    def cpu_jiffies(self) -> tuple[int, int] | None:
        text = self._read("stat")
        if not text:
            return None
        for line in text.splitlines():
            if line.startswith("cpu "):
                # user nice system idle iowait irq softirq steal guest guest_nice; guest time is
                # already counted in user/nice, so it is left out of the total.
                vals = [int(v) for v in line.split()[1:]]
                total = sum(vals[:8])
                steal = vals[7] if len(vals) > 7 else 0
                return steal, total
        return None


@dataclass
class HostFigures:
    cpus: int
    loadavg_1m: float | None  # the highest sampled during the series
    steal_pct: float | None  # over the whole series


class HostWindow:
    """Load figures over one series: started before its first call, sampled at each verdict."""

    def __init__(self, source: HostSource) -> None:
        self.source = source
        self.start_jiffies = source.cpu_jiffies()
        self.load_max: float | None = None
        self.sample()

    def sample(self) -> HostFigures:
        load = self.source.loadavg_1m()
        if load is not None:
            self.load_max = load if self.load_max is None else max(self.load_max, load)
        return HostFigures(cpus=self.source.cpu_count(), loadavg_1m=self.load_max, steal_pct=self._steal())

    def _steal(self) -> float | None:
        now = self.source.cpu_jiffies()
        if now is None or self.start_jiffies is None:
            return None
        steal = now[0] - self.start_jiffies[0]
        total = now[1] - self.start_jiffies[1]
        return 100.0 * steal / total if total > 0 else 0.0
