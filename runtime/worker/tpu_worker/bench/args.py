"""The `benchmark` op's arguments, checked into one Plan before anything runs."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import WorkerError, invalid

SCENARIOS = ("single-stream", "offline")
WORKS = ("forward", "generate")
DEFAULT_ITERATIONS = 20
DEFAULT_SEQ_LEN = 128
MIN_SEQ_LEN = 2


@dataclass(frozen=True)
class Bounds:
    """The server's benchmark bounds (config `benchmark`), sent with every request in `limits`.

    The defaults only serve callers that send none (the worker's own tests): the server is the
    one source of truth, so an operator who raises a limit never meets a stricter worker."""

    max_configs: int = 64
    max_iterations: int = 10_000
    max_duration_s: float = 600.0
    max_warmup: int = 100

    @classmethod
    def from_args(cls, args: dict) -> Bounds:
        given = args.get("limits")
        if given is None:
            return cls()
        if not isinstance(given, dict):
            raise invalid("args.limits must be an object of benchmark bounds")
        out = {}
        for name, default in cls().__dict__.items():
            v = given.get(name, default)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
                raise invalid(f"args.limits.{name} must be a non-negative number")
            out[name] = v
        return cls(**out)


def _int_list(args: dict, key: str, lo: int, hi: int, default: list) -> list:
    v = args.get(key)
    if v is None:
        return default
    if (
        not isinstance(v, list)
        or not v
        or len(v) > 16
        or not all(isinstance(x, int) and not isinstance(x, bool) and lo <= x <= hi for x in v)
    ):
        raise invalid(f"args.{key} must be a list of 1-16 integers in {lo}..{hi}")
    return list(dict.fromkeys(v))


def _str_list(args: dict, key: str, allowed: tuple, default: list, code: str = "invalid_argument") -> list:
    v = args.get(key)
    if v is None:
        return default
    if not isinstance(v, list) or not v or not all(isinstance(x, str) for x in v):
        raise invalid(f"args.{key} must be a non-empty list of strings")
    bad = [x for x in v if x not in allowed]
    if bad:
        raise WorkerError(code, f"args.{key}: {', '.join(map(repr, bad))} not allowed; use {', '.join(allowed)}")
    return list(dict.fromkeys(v))


def _scenario_and_work(args: dict, entry) -> tuple[str, str]:
    scenario = args.get("scenario") or "single-stream"
    work = args.get("work")
    if scenario in WORKS:  # protocol v1 spelling: the scenario named the work
        if work is not None and work != scenario:
            raise invalid(f"args.scenario {scenario!r} contradicts args.work {work!r}")
        work, scenario = scenario, "single-stream"
    work = work or "forward"
    if scenario not in SCENARIOS:
        raise invalid(f"args.scenario must be one of {', '.join(SCENARIOS)}")
    if work not in WORKS:
        raise invalid(f"args.work must be one of {', '.join(WORKS)}")
    if work == "generate" and entry.task != "text-generation":
        raise invalid("work 'generate' needs a text-generation model")
    return scenario, work


@dataclass(frozen=True)
class Plan:
    """A checked benchmark request."""

    scenario: str
    work: str
    batch_sizes: list[int]
    seq_lens: list[int | None]
    dtypes: list[str]
    modes: list[str]
    warmup: int
    iterations: int | None
    duration: float | None
    max_new: int
    matmul_precision: str | None

    @property
    def configs(self) -> int:
        """Configurations the run reports (offline: one per series)."""
        per_series = len(self.batch_sizes) if self.scenario == "single-stream" else 1
        return per_series * len(self.seq_lens) * len(self.dtypes) * len(self.modes)


def plan(entry, args: dict) -> Plan:
    lim = entry.limits
    scenario, work = _scenario_and_work(args, entry)
    batch_sizes = _int_list(args, "batch_sizes", 1, lim.max_batch, [1])
    text = entry.task in ("embedding", "text-generation")
    bounds = Bounds.from_args(args)
    seq_lens: list = (
        _int_list(args, "seq_lens", MIN_SEQ_LEN, lim.max_seq_len, [min(DEFAULT_SEQ_LEN, lim.max_seq_len)])
        if text
        else [None]
    )
    dtypes = _str_list(args, "dtypes", entry.dtypes, [entry.default_dtype], "unsupported_dtype")
    dtypes.sort(key=lambda d: d != "float32")
    modes = _str_list(args, "modes", ("eager", "compile"), ["eager"])
    warmup = args.get("warmup", 3)
    if not isinstance(warmup, int) or isinstance(warmup, bool) or not 0 <= warmup <= bounds.max_warmup:
        raise invalid(f"args.warmup must be an integer in 0..{bounds.max_warmup}")
    iterations = args.get("iterations")
    if iterations is not None and (
        not isinstance(iterations, int) or isinstance(iterations, bool) or not 1 <= iterations <= bounds.max_iterations
    ):
        raise invalid(f"args.iterations must be an integer in 1..{bounds.max_iterations}")
    duration = args.get("duration_s")
    if duration is not None and (
        not isinstance(duration, (int, float))
        or isinstance(duration, bool)
        or not 0 < duration <= bounds.max_duration_s
    ):
        raise invalid(f"args.duration_s must be a number of seconds in (0, {bounds.max_duration_s}]")
    if iterations is None and duration is None:
        iterations = DEFAULT_ITERATIONS
    max_new = args.get("max_new_tokens", min(16, lim.max_new_tokens or 1))
    if work == "generate" and (not isinstance(max_new, int) or not 1 <= max_new <= lim.max_new_tokens):
        raise invalid(f"args.max_new_tokens must be an integer in 1..{lim.max_new_tokens}")
    grid = len(batch_sizes) * len(seq_lens) * len(dtypes) * len(modes)
    if grid > bounds.max_configs:
        raise invalid(f"{grid} configurations exceed the limit of {bounds.max_configs}; narrow the grid")
    return Plan(
        scenario=scenario,
        work=work,
        batch_sizes=batch_sizes,
        seq_lens=seq_lens,
        dtypes=dtypes,
        modes=modes,
        warmup=warmup,
        iterations=iterations,
        duration=duration,
        max_new=max_new,
        matmul_precision=args.get("matmul_precision"),
    )
