"""Generation arguments (the shared generation contract), validated into one `GenParams`, and a
whole generation call (texts or messages, seq_len, the params) into one `GenCall`: the one
parser of the worker's own decode loop and of the vLLM engine.

Bounds come from the contract and the catalog entry's limits (max_new_tokens, max_logprobs);
every refusal is an `invalid_argument` that names the argument and its range.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
from dataclasses import dataclass
from typing import Any

from ..catalog import Entry
from ..errors import invalid
from ..inputs import check_texts, seq_len_arg
from .chat import check_messages
from .grammar import ResponseFormat, parse_response_format
from .tools import Tools, parse_tools, tools_format

MAX_TEMPERATURE = 2.0
MAX_TOP_K = 1000
MAX_SEED = 2**31 - 1
MAX_STOPS = 4
MAX_STOP_CHARS = 64


@dataclass(frozen=True)
class GenParams:
    max_new_tokens: int
    temperature: float = 0.0  # 0 = greedy: top_p, top_k and seed are ignored
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None  # set whenever temperature > 0 (picked by the worker if not given)
    stop: tuple[str, ...] = ()
    logprobs: int = 0
    stream: bool = False
    response_format: ResponseFormat | None = None  # structured output (generation/grammar.py)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class GenRequest:
    """A validated generation request: token ids per prompt, and how to generate."""

    prompts: list[list[int]]
    params: GenParams
    # The prefix cache's partition (generation/prefix.py): the caller's principal key, one shared
    # key where the operator allows sharing, or "" for a call that names none.
    prefix_key: str = ""
    grammar: Any = None  # grammar.Compiled when params.response_format is set


@dataclass(frozen=True)
class GenCall:
    """A generation call's arguments, checked: exactly one of texts and messages (the prompt
    before tokenization), the longest prompt in tokens, and how to generate."""

    texts: list[str] | None
    messages: list[dict] | None
    seq_len: int
    params: GenParams
    tools: Tools | None = None  # the functions the model may call (generation/tools.py)


def _number(args: dict, key: str, default: float) -> float:
    v = args.get(key, default)
    if v is None:
        return default
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        raise invalid(f"args.{key} must be a number")
    return float(v)


def _integer(args: dict, key: str, lo: int, hi: int, default: int | None) -> int | None:
    v = args.get(key, default)
    if v is None:
        return default
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise invalid(f"args.{key} must be an integer in {lo}..{hi}")
    return v


def parse_params(entry: Entry, args: dict[str, Any]) -> GenParams:
    lim = entry.limits
    n = _integer(args, "max_new_tokens", 1, lim.max_new_tokens, min(16, lim.max_new_tokens))
    temperature, seed = parse_sampling(args)
    top_p = _number(args, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise invalid("args.top_p must be in (0, 1]")
    top_k = _integer(args, "top_k", 0, MAX_TOP_K, 0)
    stop = args.get("stop")
    if stop is None:
        stop = []
    if (
        not isinstance(stop, list)
        or len(stop) > MAX_STOPS
        or not all(isinstance(s, str) and 1 <= len(s) <= MAX_STOP_CHARS for s in stop)
    ):
        raise invalid(f"args.stop must be a list of at most {MAX_STOPS} strings of 1..{MAX_STOP_CHARS} characters")
    max_lp = lim.max_logprobs
    logprobs = args.get("logprobs", 0)
    if logprobs is None:
        logprobs = 0
    if not isinstance(logprobs, int) or isinstance(logprobs, bool) or not 0 <= logprobs <= max_lp:
        why = "this model returns no logprobs (limits.max_logprobs is 0)" if max_lp == 0 else f"0..{max_lp}"
        raise invalid(f"args.logprobs must be an integer in {why}" if max_lp else f"args.logprobs: {why}")
    stream = args.get("stream", False)
    if not isinstance(stream, bool):
        raise invalid("args.stream must be true or false")
    if temperature == 0:
        top_p, top_k = 1.0, 0  # greedy: ignored, as the contract says (and the seed: None)
    fmt = parse_response_format(args.get("response_format"))
    return GenParams(n, temperature, top_p, top_k, seed, tuple(dict.fromkeys(stop)), logprobs, stream, fmt)


MAX_PREFIX_KEY_CHARS = 128


def parse_prefix_key(args: dict[str, Any]) -> str:
    key = args.get("prefix_key", "")
    if key is None:
        return ""
    if not isinstance(key, str) or len(key) > MAX_PREFIX_KEY_CHARS:
        raise invalid(f"args.prefix_key must be a string of at most {MAX_PREFIX_KEY_CHARS} characters")
    return key


def parse_sampling(args: dict[str, Any]) -> tuple[float, int | None]:
    """temperature and seed (all the benchmark samples with): (0.0, None) is greedy; sampling
    without a seed picks one, returned with the result so the caller can replay it."""
    temperature = _number(args, "temperature", 0.0)
    if not 0 <= temperature <= MAX_TEMPERATURE:
        raise invalid(f"args.temperature must be in 0..{MAX_TEMPERATURE:g} (0 = greedy)")
    seed = _integer(args, "seed", 0, MAX_SEED, None)
    if temperature == 0:
        return 0.0, None
    return temperature, secrets.randbelow(MAX_SEED + 1) if seed is None else seed


def parse_generation(entry: Entry, args: dict[str, Any], max_len: int) -> GenCall:
    """Every argument of a generation call, checked before anything runs; `max_len` is the
    model's longest prompt (args.seq_len may lower it)."""
    has_texts, has_messages = args.get("texts") is not None, args.get("messages") is not None
    if has_texts == has_messages:
        raise invalid(f"model {entry.id!r} needs exactly one of args.texts or args.messages")
    params = parse_params(entry, args)
    seq_len = seq_len_arg(args, max_len)
    tools = parse_tools(args)
    if has_texts:
        if tools is not None:
            raise invalid("args.tools needs args.messages: the model calls functions in a chat")
        return GenCall(check_texts(entry, args), None, seq_len, params)
    if tools is not None:
        if params.response_format is not None:
            raise invalid("args.tools and args.response_format both constrain the answer: give one of them")
        # The calls' grammar is the answer's format: the decode loop follows it as it does any other.
        # tool_grammar false (the bench's unconstrained side; the server never sends it) leaves it off.
        grammar = args.get("tool_grammar", True)
        if not isinstance(grammar, bool):
            raise invalid("args.tool_grammar must be true or false")
        params = dataclasses.replace(params, response_format=tools_format(tools) if grammar else None)
    messages = check_messages(args.get("messages"), entry.limits.max_text_chars)
    return GenCall(None, messages, seq_len, params, tools)
