"""Closing a constrained answer before max_new_tokens cuts it (issue 44): the shortest way from a
grammar matcher's state to a complete sentence, and the order in which it is found.

A small model asked for JSON can loop inside a value (a number of hundreds of digits, one array
item again and again) until its token budget runs out, and leave text that does not parse. The
decode loop (generation/loop.py, through `Constraint.fit` in grammar.py) therefore keeps, for
every constrained sequence, the closing of its text: after each token it checks that the closing
from the state that token leads to still fits in the tokens left, and where it does not, emits the
closing's next token instead. The closing always fits once it fitted at the start, so an answer
ends a complete sentence of its grammar whenever `max_new_tokens` holds the shortest one.

The closing is found greedily: the tokens the grammar forces are taken as they are (llguidance's
fast-forward tokens: the rest of a key, a `":"`), and elsewhere the first allowed token in a fixed
order: a quote (it ends a string, or opens an empty one), `}`, `]`, then `,` and `:` (a required
property or item still to come), the digits (1 and 0 first), then every other token, longest first (an
enum value or a `minLength` in few tokens). Single-character structure tokens, never merged ones
like `"}`: inside a string a merged token is text, not an end. The order is one per tokenizer.
"""

from __future__ import annotations

import numpy as np
import torch

# The structure characters first, in the order that ends a JSON value soonest.
# A 1 before a 0: after "-" or "0." a zero leads nowhere (a negative number is not -0.000…).
_FIRST = [b'"', b"}", b"]", b",", b":", *(bytes([c]) for c in b"1023456789")]


class Closer:
    """One tokenizer's closing order, and the shortest closing of a matcher's state in it."""

    def __init__(self, tokenizer, vocab: int, eos: int | None = None) -> None:
        self.vocab = vocab
        self.eos = eos  # what ends a sequence whose text is complete
        self.token_bytes: list[bytes] = [tokenizer.decode_bytes([t]) for t in range(vocab)]
        index: dict[bytes, int] = {}
        for t, data in enumerate(self.token_bytes):
            index.setdefault(data, t)
        self._first = [index[b] for b in _FIRST if b in index]
        # Every other token, longest first; llguidance marks special tokens with a 0xff byte.
        rest = [t for t, data in enumerate(self.token_bytes) if data and data[:1] != b"\xff"]
        rest.sort(key=lambda t: -len(self.token_bytes[t]))
        self._rest = np.array(rest, dtype=np.int64)
        # Tokens that begin with a digit: what a number's fraction bound forbids (repetition.py).
        self.digit_start = torch.tensor([data[:1].isdigit() for data in self.token_bytes], dtype=torch.bool)
        self._bits = np.zeros((vocab + 31) // 32, dtype=np.int32)

    def plan(self, matcher, limit: int) -> list[int] | None:
        """The closing of `matcher`'s state (left as it is): the tokens to a complete sentence
        (none when it is complete already), or None when it needs more than `limit` tokens."""
        m = matcher.deep_copy()
        out: list[int] = []
        while not (m.is_accepting() or m.is_stopped()):
            if m.is_error() or len(out) >= limit:
                return None
            forced = m.compute_ff_tokens()
            if forced:
                m.consume_tokens(forced)
                out.extend(forced)
                continue
            token = self._next(m)
            if token is None or not m.consume_token(token):
                return None
            out.append(token)
        return out if len(out) <= limit else None

    def _next(self, m) -> int | None:
        """The first token of the closing order that `m` allows."""
        bits = self._bits
        m.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        for t in self._first:
            if (int(bits[t >> 5]) >> (t & 31)) & 1:
                return t
        allowed = np.unpackbits(bits.view(np.uint8), bitorder="little")[: self.vocab].astype(bool)
        found = self._rest[allowed[self._rest]]
        return int(found[0]) if found.size else None
