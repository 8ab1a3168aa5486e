"""The `benchmark` op's arguments, checked into one Plan before anything runs.

The server (tools/run_benchmark.ts) resolves every default and bound and sends the request fully
resolved, its bounds in `limits`. The worker only asserts: a missing or out-of-range value is
refused with an error that names the field, and no default is written here, so the two sides can
never disagree on one (runtime/PROTOCOL.md, `benchmark`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

from ..errors import WorkerError, invalid
from ..generation.params import GenParams, parse_sampling
from .train_step import OPTIMIZERS, TRAIN_PRECISIONS, WHOLE_STEP

SCENARIOS = ("single-stream", "offline")
WORKS = ("forward", "generate", "train_step", "fine_tune")
TRAINING = ("train_step", "fine_tune")  # works that train copies (float32 weights, autocast)
MAX_LEARNING_RATE = 1.0
MODES = ("eager", "compile")
# work "train_step" also compiles the whole step (train_step.WHOLE_STEP), beside "compile"'s split.
TRAIN_MODES = (*MODES, WHOLE_STEP)
MAX_LIST = 16  # a sanity bound on the wire; the server's own is tighter
MAX_EXTEND_FACTOR = 16


@dataclass(frozen=True)
class Bounds:
    """The server's benchmark bounds (its config `benchmark` section, plus the shortest sequence
    it benchmarks), sent with every request in `limits`."""

    max_configs: int
    max_iterations: int
    max_duration_s: float
    max_warmup: int
    min_seq_len: int

    @classmethod
    def from_args(cls, args: dict) -> Bounds:
        given = _required(args, "limits")
        if not isinstance(given, dict):
            raise invalid("args.limits must be an object of benchmark bounds")
        out = {}
        for f in fields(cls):
            v = given.get(f.name)
            if v is None:
                raise invalid(f"args.limits.{f.name} is required (the server sends its benchmark bounds)")
            if not _is_number(v) or v < 0:
                raise invalid(f"args.limits.{f.name} must be a non-negative number")
            out[f.name] = v
        return cls(**out)


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
    max_new: int | None
    # work "generate" only: how each token is chosen (greedy unless args.temperature > 0; a
    # sampled run always has a seed: every call decodes the same tokens, so runs compare).
    temperature: float
    seed: int | None
    matmul_precision: str | None
    # work "train_step" only: the optimizer of every step (None for other works).
    optimizer: str | None
    # An unstable series runs up to extend_factor x its requested window, within these bounds.
    extend_factor: int
    max_iterations: int
    max_duration_s: float
    # work "fine_tune" only: the catalog dataset, steps, held-out every eval_every steps, AdamW's rate.
    dataset: str | None = None
    steps: int | None = None
    eval_every: int | None = None
    learning_rate: float | None = None
    # work "fine_tune" only: {id, dtype, mode} of the configuration whose weights are kept (keep.py).
    keep: dict | None = None

    @property
    def sampling(self) -> GenParams | None:
        """The decode's parameters when it samples (None: greedy)."""
        if self.temperature == 0 or self.max_new is None:
            return None
        return GenParams(self.max_new, self.temperature, seed=self.seed)

    @property
    def sampling_report(self) -> dict | None:
        """What the report says of the decode (work "generate"): temperature, and seed when sampled."""
        if self.work != "generate":
            return None
        return {"temperature": self.temperature, "seed": self.seed}

    @property
    def configs(self) -> int:
        """Configurations the run reports (offline: one per series)."""
        per_series = len(self.batch_sizes) if self.scenario == "single-stream" else 1
        return per_series * len(self.seq_lens) * len(self.dtypes) * len(self.modes)


def plan(entry, args: dict) -> Plan:
    lim = entry.limits
    bounds = Bounds.from_args(args)
    scenario, work = _scenario_and_work(args, entry)
    batch_sizes = _int_list(args, "batch_sizes", 1, lim.max_batch)
    if entry.task in ("embedding", "text-generation"):
        seq_lens: list = _int_list(args, "seq_lens", int(bounds.min_seq_len), lim.max_seq_len)
    elif args.get("seq_lens") is not None:
        raise invalid(f"args.seq_lens: model {entry.id!r} takes tensors, not sequences; omit seq_lens")
    else:
        seq_lens = [None]
    # Training keeps float32 weights; bfloat16 is autocast over them (float16 would need a scaler).
    allowed = tuple(TRAIN_PRECISIONS) if work in TRAINING else entry.dtypes
    dtypes = _str_list(args, "dtypes", allowed, "unsupported_dtype")
    dtypes.sort(key=lambda d: d != "float32")  # the float32 reference is built first
    modes = _str_list(args, "modes", TRAIN_MODES if work in TRAINING else MODES)
    warmup = _int(args, "warmup", 0, bounds.max_warmup)
    iterations = _int(args, "iterations", 1, bounds.max_iterations, optional=True)
    duration = args.get("duration_s")
    if duration is not None and (not _is_number(duration) or not 0 < duration <= bounds.max_duration_s):
        raise invalid(f"args.duration_s must be a number of seconds in (0, {bounds.max_duration_s}]")
    tune = _fine_tune(args, work, batch_sizes, seq_lens, iterations, duration, bounds)
    if iterations is None and duration is None and work != "fine_tune":
        raise invalid("args.iterations or args.duration_s is required (how long to measure each configuration)")
    max_new = None
    temperature, seed = 0.0, None
    if work == "generate":
        max_new = _int(args, "max_new_tokens", 1, lim.max_new_tokens)
        temperature, seed = parse_sampling(args)
    else:
        given = [k for k in ("temperature", "seed") if args.get(k) is not None]
        if given:
            raise invalid(f"args.{given[0]}: only work 'generate' samples")
    optimizer = None
    if work == "fine_tune":
        optimizer = "adamw"
    elif work == "train_step":
        optimizer = _required(args, "optimizer")
        if optimizer not in OPTIMIZERS:
            raise invalid(f"args.optimizer must be one of {', '.join(OPTIMIZERS)}")
    elif args.get("optimizer") is not None:
        raise invalid("args.optimizer: only work 'train_step' takes an optimizer")
    extend_factor = _int(args, "extend_factor", 1, MAX_EXTEND_FACTOR)
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
        temperature=temperature,
        seed=seed,
        matmul_precision=args.get("matmul_precision"),
        optimizer=optimizer,
        extend_factor=extend_factor,
        max_iterations=int(bounds.max_iterations),
        max_duration_s=float(bounds.max_duration_s),
        **tune,
    )


KEPT_ID = re.compile(r"^kept-[0-9a-f]{12}$")
DTYPES_OF_KEEP = ("float32", "bfloat16")
MODES_OF_KEEP = ("eager", "compile", "compile_step")
FINE_TUNE_KEYS = ("dataset", "steps", "eval_every", "learning_rate", "keep")


def _fine_tune(args: dict, work: str, batch_sizes, seq_lens, iterations, duration, bounds: Bounds) -> dict:
    """work "fine_tune"'s own fields (one shape; steps, not a timed window); none for other works."""
    if work != "fine_tune":
        given = [k for k in FINE_TUNE_KEYS if args.get(k) is not None]
        if given:
            raise invalid(f"args.{given[0]}: only work 'fine_tune' takes it")
        return {}
    if iterations is not None or duration is not None:
        raise invalid("work 'fine_tune' runs args.steps steps; omit iterations and duration_s")
    if len(batch_sizes) != 1 or len(seq_lens) != 1 or seq_lens[0] is None:
        raise invalid("work 'fine_tune' trains one shape: give one batch size and one seq_len")
    dataset = _required(args, "dataset")
    if not isinstance(dataset, str) or not dataset:
        raise invalid("args.dataset must be a catalog dataset id")
    steps = _int(args, "steps", 1, bounds.max_iterations)
    eval_every = _int(args, "eval_every", 1, steps)
    lr = _required(args, "learning_rate")
    if not _is_number(lr) or not 0 < lr <= MAX_LEARNING_RATE:
        raise invalid(f"args.learning_rate must be a number in (0, {MAX_LEARNING_RATE}]")
    keep = args.get("keep")
    if keep is not None:
        if not (
            isinstance(keep, dict)
            and isinstance(keep.get("id"), str)
            and KEPT_ID.match(keep["id"])
            and keep.get("dtype") in DTYPES_OF_KEEP
            and keep.get("mode") in MODES_OF_KEEP
        ):
            raise invalid("args.keep must be {id: 'kept-<12 hex>', dtype, mode} of a configuration of the grid")
        keep = {"id": keep["id"], "dtype": keep["dtype"], "mode": keep["mode"]}
    return {"dataset": dataset, "steps": steps, "eval_every": eval_every, "learning_rate": float(lr), "keep": keep}


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _required(args: dict, key: str) -> Any:
    v = args.get(key)
    if v is None:
        raise invalid(f"args.{key} is required (the server resolves every benchmark default)")
    return v


def _int(args: dict, key: str, lo: int, hi: int, *, optional: bool = False) -> int | None:
    v = args.get(key) if optional else _required(args, key)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise invalid(f"args.{key} must be an integer in {lo}..{hi}")
    return v


def _int_list(args: dict, key: str, lo: int, hi: int) -> list:
    v = _required(args, key)
    if (
        not isinstance(v, list)
        or not v
        or len(v) > MAX_LIST
        or not all(isinstance(x, int) and not isinstance(x, bool) and lo <= x <= hi for x in v)
    ):
        raise invalid(f"args.{key} must be a list of 1-{MAX_LIST} integers in {lo}..{hi}")
    return list(dict.fromkeys(v))


def _str_list(args: dict, key: str, allowed: tuple, code: str = "invalid_argument") -> list:
    v = _required(args, key)
    if not isinstance(v, list) or not v or not all(isinstance(x, str) for x in v):
        raise invalid(f"args.{key} must be a non-empty list of strings")
    bad = [x for x in v if x not in allowed]
    if bad:
        raise WorkerError(code, f"args.{key}: {', '.join(map(repr, bad))} not allowed; use {', '.join(allowed)}")
    return list(dict.fromkeys(v))


def _scenario_and_work(args: dict, entry) -> tuple[str, str]:
    scenario = _required(args, "scenario")
    work = args.get("work")
    if scenario in WORKS:  # protocol v1 spelling: the scenario named the work
        if work is not None and work != scenario:
            raise invalid(f"args.scenario {scenario!r} contradicts args.work {work!r}")
        work, scenario = scenario, "single-stream"
    if scenario not in SCENARIOS:
        raise invalid(f"args.scenario must be one of {', '.join(SCENARIOS)}")
    if work is None:
        raise invalid("args.work is required (the server resolves every benchmark default)")
    if work not in WORKS:
        raise invalid(f"args.work must be one of {', '.join(WORKS)}")
    if work == "generate" and entry.task != "text-generation":
        raise invalid("work 'generate' needs a text-generation model")
    if work in TRAINING and scenario != "single-stream":
        raise invalid(f"work {work!r} runs in the single-stream scenario only (one step at a time)")
    if work == "fine_tune" and entry.task != "text-generation":
        raise invalid("work 'fine_tune' trains text-generation models on text; pick a causal LM")
    return scenario, work
