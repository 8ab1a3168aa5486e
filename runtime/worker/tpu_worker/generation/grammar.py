"""Structured output: a generation's `response_format` (a JSON schema, any JSON object, a regex or
a choice of strings) compiled into a grammar that constrains every token it samples.

The grammar library is llguidance (the one vLLM's structured outputs use too): a Rust matcher
that builds the allowed-token bitmask of a sequence's next token on the CPU in well under a
millisecond, and compiles a schema in milliseconds. The decode loop (generation/loop.py) fills
one bitmask row per constrained sequence each step and applies it to the logits on the model's
device as a tensor op (`apply_masks`), before argmax or sampling, so greedy decoding, seeds and
logprobs work as without a grammar (logprobs are then those of the constrained distribution).

Bounds, checked before anything compiles (each refusal is `response_format_refused`, saying what
to change): the schema's size in bytes and nesting depth, the size of each enum, the regex's
length, the number and length of choices. The compile itself runs in a thread (llguidance drops
the GIL while it builds) and is waited for at most COMPILE_TIMEOUT_S, so a hostile grammar
cannot hold the worker: its other calls go on meanwhile; llguidance's own limits (lexer fuel,
Earley items per step) bound the compile and every later mask computation.

So that an answer parses (issue 44): a schema's unbounded strings and numbers get default bounds
before it compiles (bounds.py), JSON output is penalized for repeating itself inside a string
(repetition.py), and each sequence keeps room for the shortest closing of its text and takes it
when its tokens run out (closing.py, `Constraint.fit`).
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .. import logs
from ..errors import WorkerError
from .bounds import bound_schema
from .closing import Closer
from .repetition import JSON_KINDS, ValueTokens, penalize

MAX_SCHEMA_BYTES = 16 * 1024
MAX_SCHEMA_DEPTH = 16
MAX_ENUM = 256
MAX_PATTERN_CHARS = 1024
MAX_CHOICES = 256
MAX_CHOICE_CHARS = 256
COMPILE_TIMEOUT_S = 5.0
KINDS = ("json_schema", "json_object", "regex", "choice")

# JSON is written compactly (no whitespace at all): a small model cannot wander into endless
# newlines between the fields, the text stays short, and it is what vLLM's llguidance backend
# writes with disable_any_whitespace (engines/vllm_process.py), so both engines agree.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}


def refused(message: str) -> WorkerError:
    return WorkerError("response_format_refused", message)


@dataclass(frozen=True)
class ResponseFormat:
    """A checked response_format: its kind, the llguidance grammar text built from it, and the
    same request as vLLM's structured outputs take it (engines/vllm.py)."""

    kind: str
    grammar: str
    structured_outputs: dict


def _depth(node: Any, level: int = 1) -> int:
    """Nesting depth of a JSON document (a scalar is 0, `{}` is 1); stops past the bound."""
    if level > MAX_SCHEMA_DEPTH + 1:
        return level
    if isinstance(node, dict):
        return max([level, *(_depth(v, level + 1) for v in node.values())])
    if isinstance(node, list):
        return max([level, *(_depth(v, level + 1) for v in node)])
    return level - 1


def _largest_enum(node: Any) -> int:
    if isinstance(node, dict):
        own = len(node["enum"]) if isinstance(node.get("enum"), list) else 0
        return max([own, *(_largest_enum(v) for v in node.values())])
    if isinstance(node, list):
        return max([0, *(_largest_enum(v) for v in node)])
    return 0


def check_schema(schema: dict, where: str) -> None:
    """The bounds of a schema to compile (its size, nesting and enums), refused naming `where`."""
    size = len(json.dumps(schema, separators=(",", ":")).encode())
    if size > MAX_SCHEMA_BYTES:
        raise refused(f"{where}: the schema is {size} bytes; at most {MAX_SCHEMA_BYTES}: make it smaller")
    depth = _depth(schema)
    if depth > MAX_SCHEMA_DEPTH:
        raise refused(
            f"{where}: the schema nests deeper than {MAX_SCHEMA_DEPTH} levels: flatten it (fewer nested objects)"
        )
    enum = _largest_enum(schema)
    if enum > MAX_ENUM:
        raise refused(f"{where}: an enum has {enum} values; at most {MAX_ENUM}: use fewer, or a pattern")


def _schema_grammar(schema: Any) -> str:
    from llguidance import LLMatcher

    if not isinstance(schema, dict):
        raise refused("response_format.json_schema.schema must be a JSON schema object")
    check_schema(schema, "response_format")
    try:
        return LLMatcher.grammar_from_json_schema(bound_schema(schema), defaults=_JSON_OPTIONS)
    except ValueError as exc:  # an unsupported keyword or a malformed schema
        raise refused(f"response_format: the schema is not supported ({_short(exc)}): remove or change it") from None


def parse_response_format(value: Any) -> ResponseFormat | None:
    """`args.response_format` in the OpenAI-compatible shapes, checked against the bounds."""
    from llguidance import LLMatcher

    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in KINDS:
        raise refused(f"response_format.type must be one of {', '.join(KINDS)}")
    if kind == "json_schema":
        inner = value.get("json_schema")
        schema = inner.get("schema") if isinstance(inner, dict) else value.get("schema")
        # vLLM gets the bounded schema too, so both engines write the same values.
        grammar = _schema_grammar(schema)
        return ResponseFormat(kind, grammar, {"json": bound_schema(schema)})
    if kind == "json_object":
        grammar = LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=_JSON_OPTIONS)
        return ResponseFormat(kind, grammar, {"json_object": True})
    if kind == "regex":
        pattern = value.get("pattern")
        if not isinstance(pattern, str) or not 1 <= len(pattern) <= MAX_PATTERN_CHARS:
            raise refused(f"response_format.pattern must be a regex of 1..{MAX_PATTERN_CHARS} characters")
        return ResponseFormat(kind, LLMatcher.grammar_from_regex(pattern), {"regex": pattern})
    choices = value.get("choices")
    if (
        not isinstance(choices, list)
        or not 1 <= len(choices) <= MAX_CHOICES
        or not all(isinstance(c, str) and 1 <= len(c) <= MAX_CHOICE_CHARS for c in choices)
    ):
        raise refused(
            f"response_format.choices must be 1..{MAX_CHOICES} strings of 1..{MAX_CHOICE_CHARS} characters each: "
            "use fewer or shorter choices"
        )
    # A Lark rule of string literals (JSON string escapes are Lark's): exactly one of them.
    unique = list(dict.fromkeys(choices))
    alternatives = " | ".join(json.dumps(c, ensure_ascii=False) for c in unique)
    return ResponseFormat(kind, LLMatcher.grammar_from_lark(f"start: {alternatives}"), {"choice": unique})


def _where(fmt: ResponseFormat) -> str:
    """The argument a grammar came from: the functions of `tools`, or response_format."""
    return "tools" if fmt.kind == "tools" else "response_format"


def _message(error: str) -> str:
    """llguidance's error on one line, without its echo of the grammar (caret and source lines)."""
    lines = [line.strip() for line in error.splitlines()]
    kept = [line for line in lines if line and not set(line) <= set("^ ") and "|" not in line]
    return " ".join(kept)[:240]


def _short(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__


class Grammars:
    """One model's grammar compiler: its llguidance tokenizer (built once, on first use) and a
    thread that compiles with a timeout."""

    # One thread for every model's compiles: a compile past its timeout keeps that thread until
    # llguidance's limits end it, and the next compile gets a fresh one (see compile).
    _pool_lock = threading.Lock()
    _pool: ThreadPoolExecutor | None = None

    def __init__(self, tokenizer, vocab: int, eos_id: int | None) -> None:
        self._source = tokenizer  # a tokenizers.Tokenizer
        self._vocab = vocab
        self._eos = eos_id
        self._tokenizer = None
        self._closer: Closer | None = None
        self._unsupported: str | None = None  # why this model's tokenizer cannot take a grammar
        self._lock = threading.Lock()
        self.compiles = 0
        self.refusals = 0

    def tokenizer(self):
        from llguidance import LLMatcher, LLTokenizer

        with self._lock:
            if self._unsupported:
                raise refused(self._unsupported)
            if self._tokenizer is None:
                spec = json.loads(self._source.to_str())
                spec["padding"] = spec["truncation"] = None  # masks are per token
                try:
                    tok = LLTokenizer(json.dumps(spec), n_vocab=self._vocab, eos_token=self._eos)
                except ValueError as exc:
                    # A tokenizer whose tokens are not byte strings (WordPiece's "##" pieces).
                    kind = (spec.get("model") or {}).get("type") or "this"
                    logs.debug("no grammar tokenizer", error=_short(exc))
                    self._unsupported = (
                        f"response_format: this model's tokenizer ({kind}) has tokens that are not byte strings, "
                        "which the grammar cannot follow: use a model with a byte-level BPE tokenizer, "
                        "e.g. smollm2-135m-instruct"
                    )
                    raise refused(self._unsupported) from None
                # The first matcher of a tokenizer builds its token trie (seconds on a slow CPU):
                # here, once, not inside a caller's timed compile.
                LLMatcher(tok, LLMatcher.grammar_from_regex("a"), log_level=0).compute_bitmask()
                self._closer = Closer(tok, self._vocab, self._eos)
                self._tokenizer = tok
            return self._tokenizer

    def closer(self) -> Closer:
        """This tokenizer's closing order (built with the grammar tokenizer)."""
        self.tokenizer()
        assert self._closer is not None
        return self._closer

    @property
    def vocab(self) -> int:
        return self._vocab

    def compile(self, fmt: ResponseFormat, timeout_s: float = COMPILE_TIMEOUT_S) -> Compiled:
        """A matcher for `fmt`'s grammar, its first mask computed (the lexer built), within
        `timeout_s`; refused with the grammar's error, or when it takes longer."""
        tok = self.tokenizer()
        t0 = time.perf_counter()
        future = self._executor().submit(_build, tok, fmt.grammar)
        try:
            matcher = future.result(timeout=timeout_s)
        except FutureTimeout:
            self.refusals += 1
            self._abandon()
            raise refused(
                f"{_where(fmt)}: the grammar did not compile within {timeout_s:g} s: simplify it "
                "(fewer alternatives, shorter repetition bounds)"
            ) from None
        error = matcher.get_error()
        if error:
            self.refusals += 1
            raise refused(f"{_where(fmt)}: {_message(error)}: change it")
        self.compiles += 1
        return Compiled(fmt.kind, matcher, round(time.perf_counter() - t0, 6), self.closer())

    @classmethod
    def _executor(cls) -> ThreadPoolExecutor:
        with cls._pool_lock:
            if cls._pool is None:
                cls._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar")
            return cls._pool

    @classmethod
    def _abandon(cls) -> None:
        """Leaves the stuck compile to its thread (llguidance's fuel ends it) and starts a new one."""
        with cls._pool_lock:
            if cls._pool is not None:
                cls._pool.shutdown(wait=False, cancel_futures=True)
            cls._pool = None


def _build(tokenizer, grammar: str):
    from llguidance import LLMatcher, LLParserLimits

    # Fewer lexer states and grammar symbols than llguidance's defaults: a schema this server
    # admits needs far less, and a hostile one fails fast instead of taking memory.
    limits = LLParserLimits(max_lexer_states=50_000, max_grammar_size=100_000)
    matcher = LLMatcher(tokenizer, grammar, log_level=0, limits=limits)
    if not matcher.is_error():
        matcher.compute_bitmask()  # the first mask builds the lexer: part of the timed compile
    return matcher


@dataclass
class Compiled:
    kind: str
    matcher: Any  # llguidance.LLMatcher in its start state
    compile_s: float
    closer: Closer | None = None

    def matchers(self, n: int) -> list:
        """One matcher per sequence (the first the compiled one, the others copies)."""
        return [self.matcher, *(self.matcher.deep_copy() for _ in range(n - 1))]


class Constraint:
    """One sequence's grammar while it decodes, with the closing of its text (closing.py) and,
    for JSON, the tokens of the string it is writing (repetition.py)."""

    def __init__(self, kind: str, matcher, closer: Closer | None = None) -> None:
        self.kind = kind
        self.matcher = matcher
        self.closer = closer
        self.error: str | None = None
        self.values = ValueTokens() if kind in JSON_KINDS and closer is not None else None
        self._closing: list[int] | None = None  # the closing of the text so far, when known
        self._after: tuple[int, list[int]] | None = None  # (token, the closing after it) from `fit`

    def fit(self, token: int, left: int) -> int:
        """The token to write with `left` tokens to go (this one included): `token` when the
        closing of the text it leads to fits in the rest, else the next token of the closing of
        the text so far (which fits: this check ran at every token before)."""
        if self.error is not None or self.closer is None:
            return token
        if self._closing and self._closing[0] == token:
            self._after = (token, self._closing[1:])  # the greedy closing goes on as it was
            return token
        after = self.matcher.deep_copy()
        if not after.consume_token(token):
            return token
        closing = self.closer.plan(after, left - 1)
        if closing is not None:
            self._after = (token, closing)
            return token
        now = self._closing if self._closing is not None else self.closer.plan(self.matcher, left)
        if now == [] and self.closer.eos is not None:
            return self.closer.eos  # the text is complete: it ends here
        if not now:  # no closing fits even now: the text will be cut whatever comes
            return token
        self._after = (now[0], now[1:])
        return now[0]

    def advance(self, token: int) -> None:
        if self.error is None and not self.matcher.consume_token(token):
            self.error = (self.matcher.get_error() or "the token was not allowed")[:240]
        after, self._after = self._after, None
        self._closing = after[1] if after is not None and after[0] == token else None
        if self.values is not None and self.closer is not None:
            self.values.push(token, self.closer.token_bytes[token])

    @property
    def done(self) -> bool:
        """Nothing but the end can follow (the grammar is complete), or the matcher failed."""
        return self.error is not None or self.matcher.is_stopped() or bool(self.matcher.is_error())

    @property
    def complete(self) -> bool:
        return self.error is None and bool(self.matcher.is_accepting())

    def report(self, cut: bool) -> dict:
        """The answer's fields: whether the text is a complete sentence of the grammar (never
        when a stop sequence cut it, or the matcher failed)."""
        out: dict[str, Any] = {"grammar_complete": self.complete and not cut}
        err = self.error or (self.matcher.get_error() if self.matcher.is_error() else None)
        if err:
            out["grammar_error"] = _message(err)
        return out


class MaskBuilder:
    """The allowed-token bitmasks of a batch's constrained rows, filled on the CPU in parallel
    (llguidance's executor, GIL dropped), applied to the logits on their device."""

    def __init__(self, vocab: int) -> None:
        from llguidance import LLExecutor

        self.vocab = vocab
        self.words = (vocab + 31) // 32
        self._executor = LLExecutor()
        self._shifts: dict[torch.device, torch.Tensor] = {}
        self._digit_start: dict[torch.device, torch.Tensor] = {}

    def apply(self, logits: torch.Tensor, rows: list[tuple[int, Constraint]]) -> torch.Tensor:
        """`logits` [n, V] with every token the rows' grammars forbid at -inf (other rows as they were)."""
        from llguidance.torch import fill_next_token_bitmask_par

        n = logits.shape[0]
        bits = torch.full((n, self.words), -1, dtype=torch.int32)
        live = [(c.matcher, i) for i, c in rows if c.error is None]
        if live:
            fill_next_token_bitmask_par(self._executor, live, bits)
        out = apply_masks(logits, bits.to(logits.device, non_blocking=True), self._shift(logits.device))
        values = [(i, c.values) for i, c in rows if c.values is not None and c.error is None]
        if values:
            closer = next(c.closer for _, c in rows if c.closer is not None)
            out = penalize(out, values, self._digits(closer, out.device))
        return out

    def _digits(self, closer: Closer, device: torch.device) -> torch.Tensor:
        if device not in self._digit_start:
            digits = np.zeros(self.vocab, dtype=np.bool_)  # logits may be wider than the tokenizer
            n = min(self.vocab, len(closer.token_bytes))
            # Built from the token texts without torch ops: only the copy to the device runs (census.py).
            digits[:n] = [data[:1].isdigit() for data in closer.token_bytes[:n]]
            self._digit_start[device] = torch.from_numpy(digits).to(device)
        return self._digit_start[device]

    def _shift(self, device: torch.device) -> torch.Tensor:
        if device not in self._shifts:
            self._shifts[device] = torch.arange(32, dtype=torch.int32, device=device)
        return self._shifts[device]


def apply_masks(logits: torch.Tensor, bits: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor:
    """Tensor ops on the logits' device: bit j of word w of a row allows token 32·w + j; tokens
    past the bitmask (a model whose logits are wider than its tokenizer) are forbidden."""
    n, vocab = logits.shape
    allowed = ((bits.unsqueeze(-1) >> shifts) & 1).reshape(n, -1).bool()
    if allowed.shape[1] >= vocab:
        allowed = allowed[:, :vocab]
    else:
        allowed = torch.cat([allowed, allowed.new_zeros((n, vocab - allowed.shape[1]))], dim=1)
    return logits.masked_fill(~allowed, float("-inf"))
