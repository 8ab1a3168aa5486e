"""Whether a series can be trusted, and running it longer until it can (as pyperf calibrates).

A series is stable when the 95 % bootstrap interval of its p50 is narrow against the p50 and the
host was not busy while it ran. An unstable one is extended, doubling its window, until it is
stable or it reaches its bound: `extend_factor` times the requested iterations (or duration),
and never past the server's max_iterations / max_duration_s. Clock, calls and host are passed
in, so tests prove the verdicts and the extension with made-up noise and load.

Thresholds (docs/benchmarks.md says why):
  * CI_MAX_REL: the interval of p50 wider than 10 % of p50 (the median is not known to +-5 %);
  * STEAL_MAX_PCT: the hypervisor stole more than 5 % of the CPU time during the series;
  * load above cores: the 1-minute load average exceeded the CPU count (something waited);
  * MIN_ITERATIONS: fewer than 5 iterations say nothing about their spread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from . import stats
from .host import HostFigures, HostWindow

CI_MAX_REL = 0.10
STEAL_MAX_PCT = 5.0
MIN_ITERATIONS = 5


@dataclass(frozen=True)
class Verdict:
    stable: bool
    reason: str | None
    mad_ms: float
    p50_ci_ms: tuple[float, float]
    host: HostFigures


def assess(samples_s: list[float], host: HostFigures, *, seed: int) -> Verdict:
    """The verdict on one series' samples (seconds) and the host's figures while it ran."""
    ms = [s * 1000.0 for s in samples_s]
    p50 = stats.median(ms)
    lo, hi = stats.bootstrap_median_ci(ms, seed=seed)
    reasons = []
    if len(ms) < MIN_ITERATIONS:
        reasons.append(f"only {len(ms)} iterations (a verdict needs {MIN_ITERATIONS})")
    elif p50 > 0 and (hi - lo) / p50 > CI_MAX_REL:
        reasons.append(f"CI of p50 wider than {CI_MAX_REL * 100:.0f} % of p50 ({(hi - lo) / p50 * 100:.0f} %)")
    if host.steal_pct is not None and host.steal_pct > STEAL_MAX_PCT:
        reasons.append(f"steal above {STEAL_MAX_PCT:.0f} % ({host.steal_pct:.1f} %)")
    if host.loadavg_1m is not None and host.loadavg_1m > host.cpus:
        reasons.append(f"load above cores ({host.loadavg_1m:.2f} on {host.cpus} CPUs)")
    return Verdict(
        stable=not reasons,
        reason="; ".join(reasons) or None,
        mad_ms=stats.mad(ms),
        p50_ci_ms=(lo, hi),
        host=host,
    )


@dataclass
class Goal:
    """When the measured window ends: the request's iterations or duration, raised by `extend`
    while the series is unstable and room is left under its bound."""

    iterations: int | None
    duration_s: float | None
    factor: int
    max_iterations: int
    max_duration_s: float

    def __post_init__(self) -> None:
        self.requested = self.iterations
        it_cap = self.iterations * self.factor if self.iterations is not None else self.max_iterations
        self.cap_iterations = min(self.max_iterations, it_cap)
        dur_cap = self.duration_s * self.factor if self.duration_s is not None else self.max_duration_s
        self.cap_s = min(self.max_duration_s, dur_cap)

    def reached(self, n: int, elapsed_s: float) -> bool:
        if self.iterations is not None and n >= self.iterations:
            return True
        return self.duration_s is not None and n > 0 and elapsed_s >= self.duration_s

    def extend(self, n: int, elapsed_s: float) -> bool:
        """Doubles the window within the bound; False when no room is left."""
        if n >= self.cap_iterations or elapsed_s >= self.cap_s:
            return False
        if self.iterations is not None:
            self.iterations = min(self.cap_iterations, 2 * n)
            # An iteration run is bounded in time too: a slow series stops at max_duration_s.
            self.duration_s = self.cap_s if self.duration_s is None else self.duration_s
            return True
        self.duration_s = min(self.cap_s, 2 * elapsed_s)
        return True


@dataclass
class Settled:
    samples_s: list[float]
    window_s: float
    verdict: Verdict
    requested: int | None
    extended: bool


def settle(
    call: Callable[[], float],
    goal: Goal,
    host: HostWindow,
    *,
    seed: int,
    stop: Callable[[], bool] = lambda: False,
    keep: Callable[[], bool] = lambda: False,
    clock: Callable[[], float] = time.perf_counter,
) -> Settled | None:
    """Runs `call` (one timed iteration; returns its seconds, or None when a stop cut it short)
    until the goal is reached and the series is stable, or its bound is. When `stop` says the run
    was stopped: None (cancelled), unless `keep` says the samples so far stand (the server's stop
    for budget or time), and there are some."""
    samples: list[float] = []
    start = end = clock()
    extended = False
    while True:
        if goal.reached(len(samples), end - start):
            verdict = assess(samples, host.sample(), seed=seed)
            if verdict.stable or not goal.extend(len(samples), end - start):
                break
            extended = True
        took = None if stop() else call()
        if took is None:
            if not (keep() and samples):
                return None
            verdict = assess(samples, host.sample(), seed=seed)
            break
        samples.append(took)
        end = clock()
    return Settled(samples, end - start, verdict, goal.requested, extended)


def report(s: Settled) -> dict:
    """The series' `stability` object of the report."""
    v = s.verdict
    return {
        "stable": v.stable,
        "reason": v.reason,
        "mad_ms": round(v.mad_ms, 4),
        "p50_ci_ms": [round(v.p50_ci_ms[0], 4), round(v.p50_ci_ms[1], 4)],
        "iterations_requested": s.requested,
        "extended": s.extended,
        "loadavg_1m": v.host.loadavg_1m,
        "steal_pct": round(v.host.steal_pct, 2) if v.host.steal_pct is not None else None,
        "cpus": v.host.cpus,
    }
