"""The generation arguments of `infer` (the shared contract in the lead's GENERATION_CONTRACT.md:
texts or messages, max_new_tokens, temperature, top_p, top_k, seed, stop, logprobs, stream),
checked against the catalog entry's bounds before anything reaches an engine."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from ..catalog import Entry
from ..errors import invalid

ROLES = ("system", "user", "assistant")
MAX_MESSAGES = 64
MAX_STOPS = 4
MAX_STOP_CHARS = 64
MAX_LOGPROBS = 5
SEED_MAX = 2**31 - 1


@dataclass(frozen=True)
class GenArgs:
    texts: list[str] | None
    messages: list[dict] | None
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int | None  # None when greedy
    stop: tuple[str, ...]
    logprobs: int
    stream: bool
    seq_len: int | None


def _number(args: dict, key: str, lo: float, hi: float, default: float, *, lo_open: bool = False) -> float:
    v = args.get(key)
    if v is None:
        return default
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (lo < v if lo_open else lo <= v) and v <= hi
    if not ok:
        raise invalid(f"args.{key} must be a number in {'(' if lo_open else '['}{lo:g}, {hi:g}]")
    return float(v)


def _integer(args: dict, key: str, lo: int, hi: int, default: int | None) -> int | None:
    v = args.get(key)
    if v is None:
        return default
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise invalid(f"args.{key} must be an integer in {lo}..{hi}")
    return v


def parse_gen_args(entry: Entry, args: dict) -> GenArgs:
    lim = entry.limits
    texts, messages = args.get("texts"), args.get("messages")
    if (texts is None) == (messages is None):
        raise invalid(f"model {entry.id!r} needs exactly one of args.texts (a list of strings) or args.messages")
    if texts is not None:
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise invalid(f"model {entry.id!r} needs args.texts: a non-empty list of strings")
        if len(texts) > lim.max_batch:
            raise invalid(f"{len(texts)} texts exceed this model's max_batch of {lim.max_batch}; split the request")
        for i, t in enumerate(texts):
            if len(t) > lim.max_text_chars:
                raise invalid(f"texts[{i}] has {len(t)} characters; the limit is {lim.max_text_chars}")
    else:
        if not isinstance(messages, list) or not 0 < len(messages) <= MAX_MESSAGES:
            raise invalid(f"args.messages must be a list of 1..{MAX_MESSAGES} {{role, content}} objects")
        total = 0
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                raise invalid(f"args.messages[{i}] must be {{role: {'|'.join(ROLES)}, content: string}}")
            total += len(m["content"])
        if total > lim.max_text_chars:
            raise invalid(f"the messages hold {total} characters; the limit is {lim.max_text_chars}")
        messages = [{"role": m["role"], "content": m["content"]} for m in messages]
    max_new = _integer(args, "max_new_tokens", 1, lim.max_new_tokens, min(16, lim.max_new_tokens))
    temperature = _number(args, "temperature", 0.0, 2.0, 0.0)
    top_p = _number(args, "top_p", 0.0, 1.0, 1.0, lo_open=True)
    top_k = _integer(args, "top_k", 0, 1000, 0)
    seed = _integer(args, "seed", 0, SEED_MAX, None)
    if temperature > 0 and seed is None:
        seed = secrets.randbelow(SEED_MAX + 1)  # returned, so the caller can reproduce it
    if temperature == 0:
        seed = None  # greedy: top_p, top_k and seed have no effect
    stop = args.get("stop") or []
    if (
        not isinstance(stop, list)
        or len(stop) > MAX_STOPS
        or not all(isinstance(s, str) and 1 <= len(s) <= MAX_STOP_CHARS for s in stop)
    ):
        raise invalid(f"args.stop must be up to {MAX_STOPS} strings of 1..{MAX_STOP_CHARS} characters")
    max_lp = min(MAX_LOGPROBS, int(getattr(lim, "max_logprobs", MAX_LOGPROBS)))
    logprobs = _integer(args, "logprobs", 0, max_lp, 0)
    stream = args.get("stream", False)
    if not isinstance(stream, bool):
        raise invalid("args.stream must be true or false")
    seq_len = _integer(args, "seq_len", 2, lim.max_seq_len, None)
    return GenArgs(texts, messages, max_new, temperature, top_p, top_k, seed, tuple(stop), logprobs, stream, seq_len)


def held_back(text: str, stops: tuple[str, ...]) -> int:
    """How many characters at the end of `text` could still begin a stop sequence (so are not
    final yet and must not be streamed)."""
    keep = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:n]):
                keep = max(keep, n)
                break
    return keep


def first_stop(text: str, stops: tuple[str, ...]) -> int | None:
    """Where the earliest stop sequence starts in `text`, or None."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None
