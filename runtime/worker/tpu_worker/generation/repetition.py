"""Breaking repetition inside a JSON value while it is written (issue 44): a small model caught in
a loop writes `"LIMA-LIMA-LIMA-…"` or `0.333333…` until its budget runs out.

For JSON output (`json_schema`, `json_object`) each sequence follows which value it is writing (a
string, a number or a literal; structure characters end one) and which tokens it has written
inside the string it is in. Before the next token is chosen, those tokens' logits are divided by
PENALTY when positive and multiplied by it when negative (the usual repetition penalty, confined
to the current string: keys and structure repeat legitimately from one value to the next, and a
number's digits do, as in 10001), and a number that has MAX_FRACTION_DIGITS digits after its point
may take no more digits where the grammar allows anything else (its digits before the point are
bounded by the schema, bounds.py). Regex and choice output have no values: nothing applies there.
"""

from __future__ import annotations

import numpy as np
import torch

PENALTY = 1.3
MAX_FRACTION_DIGITS = 6
JSON_KINDS = ("json_schema", "json_object")

_QUOTE, _BACKSLASH, _POINT = 0x22, 0x5C, 0x2E
_STRUCTURE = frozenset(b"{}[],: \t\r\n")


class ValueTokens:
    """The tokens written inside the JSON string being written, and the digits after the point of
    the number being written, from the text as it grows."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self._in_string = False
        self._escape = False
        self._fraction = -1  # digits after the point of the number being written; -1: no point

    def push(self, token: int, data: bytes) -> None:
        """`token` (whose text is `data`) was written."""
        boundary = False
        for b in data:
            if self._in_string:
                if self._escape:
                    self._escape = False
                elif b == _BACKSLASH:
                    self._escape = True
                elif b == _QUOTE:
                    self._in_string, boundary = False, True
                    self._end()
            elif b == _QUOTE:
                self._end()
                self._in_string = boundary = True
            elif b in _STRUCTURE:
                boundary = True
                self._end()
            elif b == _POINT:
                self._fraction = 0
            elif b in b"eE":  # an exponent's digits are not the fraction's
                self._fraction = -1
            elif self._fraction >= 0 and 0x30 <= b <= 0x39:
                self._fraction += 1
        # Only a token wholly inside the string counts: never the quote that opens or ends it.
        if not boundary and self._in_string:
            self.seen.add(token)

    @property
    def fraction_full(self) -> bool:
        """The number being written has its most digits after the point."""
        return self._fraction >= MAX_FRACTION_DIGITS

    def _end(self) -> None:
        self.seen.clear()
        self._fraction = -1


def penalize(logits: torch.Tensor, rows: list[tuple[int, ValueTokens]], digits: torch.Tensor | None) -> torch.Tensor:
    """`logits` [B, V] (already masked) with each row's value tokens penalized, and digits
    forbidden in a row whose number has its fraction digits, unless nothing else is allowed. The
    rows' state goes to the device as [B, V] and [B, 1] flags, so the ops keep the batch's shape
    whichever rows and tokens are concerned (no host read)."""
    n, v = logits.shape
    seen = np.zeros((n, v), dtype=np.bool_)
    full = np.zeros((n, 1), dtype=np.bool_)
    for i, values in rows:
        seen[i, [t for t in values.seen if t < v]] = True
        full[i, 0] = values.fraction_full
    at = torch.from_numpy(seen).to(logits.device)
    logits = torch.where(at, torch.where(logits > 0, logits / PENALTY, logits * PENALTY), logits)
    if digits is not None:
        blocked = logits.masked_fill(digits[None, :] & torch.from_numpy(full).to(logits.device), float("-inf"))
        logits = torch.where(torch.isfinite(blocked).any(-1, keepdim=True), blocked, logits)
    return logits
