"""A series says how sure it is: dispersion (MAD, bootstrap CI of p50), the host's load and steal,
a verdict with its reason, and an unstable series extended until it is stable or at its bound.
Noise, clock and load are made up here: no assertion depends on this machine's timing."""

from __future__ import annotations

import itertools

import pytest

from conftest import bench_args
from tpu_worker.bench import engine, stats
from tpu_worker.bench.host import HostFigures, HostWindow, ProcHost
from tpu_worker.bench.stability import Goal, assess, report, settle
from tpu_worker.ops import OpContext

QUIET = HostFigures(cpus=4, loadavg_1m=0.5, steal_pct=0.0)


def tight(n: int, base: float = 0.010) -> list[float]:
    """n samples within +-0.5 % of base (seconds)."""
    return [base * (1 + 0.005 * ((i * 7) % 3 - 1)) for i in range(n)]


def spread(n: int, base: float = 0.010) -> list[float]:
    """n samples spread from 0.5x to 2x base: a busy host's figures."""
    return [base * (0.5 + 1.5 * ((i * 37) % 11) / 10) for i in range(n)]


class FakeHost:
    """A HostSource whose load and steal the test sets; jiffies advance 100 per read."""

    def __init__(self, load: float = 0.2, steal_per_100: int = 0, cpus: int = 4) -> None:
        self.load, self.steal_per_100, self.cpus = load, steal_per_100, cpus
        self.reads = 0

    def cpu_count(self) -> int:
        return self.cpus

    def loadavg_1m(self) -> float | None:
        return self.load

    def cpu_jiffies(self) -> tuple[int, int] | None:
        self.reads += 1
        return self.reads * self.steal_per_100, self.reads * 100


class FakeClock:
    """Advances by what each fake call says it took."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def calls_from(values, clock: FakeClock):
    it = iter(values)

    def call() -> float:
        v = next(it)
        clock.t += v
        return v

    return call


# --- statistics ---------------------------------------------------------------------------


def test_mad_is_the_median_distance_from_the_median_and_ignores_one_outlier():
    assert stats.mad([1.0, 2.0, 3.0, 4.0, 100.0]) == 1.0
    assert stats.mad([5.0] * 9) == 0.0


def test_the_bootstrap_interval_is_seeded_holds_the_median_and_widens_with_noise():
    xs = [s * 1000 for s in spread(40)]
    a = stats.bootstrap_median_ci(xs, seed=0)
    assert a == stats.bootstrap_median_ci(list(xs), seed=0)  # deterministic
    assert a[0] <= stats.median(xs) <= a[1]
    narrow = stats.bootstrap_median_ci([s * 1000 for s in tight(40)], seed=0)
    assert narrow[1] - narrow[0] < (a[1] - a[0]) / 10
    assert stats.bootstrap_median_ci([3.0], seed=0) == (3.0, 3.0)
    with pytest.raises(ValueError):
        stats.mad([])


# --- verdicts -----------------------------------------------------------------------------


def test_tight_samples_on_a_quiet_host_are_stable():
    v = assess(tight(20), QUIET, seed=0)
    assert v.stable and v.reason is None
    assert v.p50_ci_ms[0] <= 10.05 and v.p50_ci_ms[1] >= 9.95 and v.mad_ms < 0.1


@pytest.mark.parametrize(
    ("samples", "host", "reason"),
    [
        (spread(20), QUIET, r"^CI of p50 wider than 10 % of p50 \(\d+ %\)$"),
        (tight(20), HostFigures(cpus=4, loadavg_1m=0.5, steal_pct=12.0), r"^steal above 5 % \(12\.0 %\)$"),
        (tight(20), HostFigures(cpus=2, loadavg_1m=9.0, steal_pct=0.0), r"^load above cores \(9\.00 on 2 CPUs\)$"),
        (tight(3), QUIET, r"^only 3 iterations \(a verdict needs 5\)$"),
        (spread(20), HostFigures(cpus=2, loadavg_1m=3.0, steal_pct=None), r"^CI of p50 .*; load above cores"),
    ],
)
def test_each_unstable_series_says_why(samples, host, reason):
    v = assess(samples, host, seed=0)
    assert v.stable is False
    assert v.reason is not None
    import re

    assert re.search(reason, v.reason), v.reason


def test_the_host_window_reports_steal_over_the_series_and_the_highest_load():
    src = FakeHost(load=1.0, steal_per_100=10)
    w = HostWindow(src)
    src.load = 3.0
    w.sample()
    src.load = 2.0
    f = w.sample()
    assert f.loadavg_1m == 3.0 and f.cpus == 4
    assert f.steal_pct == pytest.approx(10.0)


def test_proc_host_reads_loadavg_and_steal_from_its_root(tmp_path):
    (tmp_path / "loadavg").write_text("7.50 3.00 1.00 3/200 12345\n")
    (tmp_path / "stat").write_text("cpu  100 0 50 800 10 0 0 40 0 0\ncpu0 1 2 3 4\nprocs_running 3\n")
    host = ProcHost(str(tmp_path))
    assert host.loadavg_1m() == 7.5
    assert host.cpu_jiffies() == (40, 1000)
    empty = ProcHost(str(tmp_path / "missing"))
    assert empty.loadavg_1m() is None and empty.cpu_jiffies() is None


# --- extension ----------------------------------------------------------------------------


def test_a_noisy_series_is_extended_until_it_is_stable():
    clock = FakeClock()
    # 10 spread samples, then the host goes quiet: doubling outweighs the noise in the median.
    values = itertools.chain(spread(10), itertools.repeat(0.010))
    goal = Goal(10, None, factor=8, max_iterations=10_000, max_duration_s=600)
    s = settle(calls_from(values, clock), goal, HostWindow(FakeHost()), seed=0, clock=clock)
    assert s is not None and s.extended and s.verdict.stable
    assert 10 < len(s.samples_s) <= 80 and s.requested == 10
    r = report(s)
    assert r["stable"] is True and r["extended"] is True and r["iterations_requested"] == 10
    assert r["p50_ci_ms"][0] <= 10.0 <= r["p50_ci_ms"][1]


def test_a_series_that_stays_noisy_stops_at_its_bound_and_says_so():
    clock = FakeClock()
    goal = Goal(10, None, factor=4, max_iterations=10_000, max_duration_s=600)
    s = settle(calls_from(itertools.cycle(spread(11)), clock), goal, HostWindow(FakeHost()), seed=0, clock=clock)
    assert s is not None and len(s.samples_s) == 40 and not s.verdict.stable
    assert s.verdict.reason.startswith("CI of p50 wider")
    # The server's bound wins over the factor, and a loaded host is not fixed by more samples.
    clock = FakeClock()
    goal = Goal(10, None, factor=4, max_iterations=25, max_duration_s=600)
    s = settle(calls_from(itertools.repeat(0.010), clock), goal, HostWindow(FakeHost(load=9.0)), seed=0, clock=clock)
    assert len(s.samples_s) == 25 and s.verdict.reason == "load above cores (9.00 on 4 CPUs)"


def test_an_iteration_run_is_bounded_in_time_and_a_duration_run_by_its_factor():
    clock = FakeClock()
    goal = Goal(10, None, factor=16, max_iterations=10_000, max_duration_s=1.0)
    s = settle(
        calls_from(itertools.cycle(spread(11, base=0.1)), clock), goal, HostWindow(FakeHost()), seed=0, clock=clock
    )
    assert 1.0 <= s.window_s < 1.3 and not s.verdict.stable  # stopped at max_duration_s
    clock = FakeClock()
    goal = Goal(None, 0.5, factor=2, max_iterations=10_000, max_duration_s=600)
    s = settle(calls_from(itertools.cycle(spread(11)), clock), goal, HostWindow(FakeHost()), seed=0, clock=clock)
    assert 1.0 <= s.window_s < 1.05 and s.extended and s.requested is None


def test_a_stable_series_is_not_extended_and_a_stop_ends_it():
    clock = FakeClock()
    goal = Goal(10, None, factor=4, max_iterations=10_000, max_duration_s=600)
    s = settle(calls_from(itertools.cycle(tight(10)), clock), goal, HostWindow(FakeHost()), seed=0, clock=clock)
    assert len(s.samples_s) == 10 and not s.extended and s.verdict.stable
    stopped = settle(lambda: 0.01, Goal(10, None, 4, 100, 600), HostWindow(FakeHost()), seed=0, stop=lambda: True)
    assert stopped is None


# --- the real engine with a simulated load signal -----------------------------------------


def test_a_report_measured_on_a_loaded_host_is_marked_unstable_and_extended(shared_worker, monkeypatch):
    monkeypatch.setattr(engine, "ProcHost", lambda: FakeHost(load=9.0, cpus=2))
    r = shared_worker.handle(
        "benchmark", bench_args(batch_sizes=[1, 2], iterations=3, extend_factor=4), [], OpContext("s")
    )[0]
    assert r["manifest"]["extend_factor"] == 4
    for c in r["configs"]:
        st = c["stability"]
        assert st["stable"] is False and "load above cores (9.00 on 2 CPUs)" in st["reason"]
        assert st["extended"] is True and st["iterations_requested"] == 3 and c["iterations"] == 12
        assert st["p50_ci_ms"][0] <= c["latency_ms"]["p50"] <= st["p50_ci_ms"][1]
        assert st["mad_ms"] >= 0 and st["loadavg_1m"] == 9.0 and st["cpus"] == 2


def test_the_extension_factor_comes_from_the_request(shared_worker):
    from tpu_worker.errors import WorkerError

    with pytest.raises(WorkerError, match=r"args.extend_factor must be an integer in 1\.\.16"):
        shared_worker.handle("benchmark", bench_args(extend_factor=0), [], OpContext("e"))
