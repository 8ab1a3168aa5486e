"""From generated token ids to final text, incrementally: what can be streamed, and where a
stop sequence cuts.

Text is decoded in a window of the last tokens (so WordPiece "##" pieces and byte-level pieces
join their predecessor), and the final text is the concatenation of what was produced, so
streamed text always equals the final text. Text that a stop sequence might still cut (the
longest suffix that is a proper prefix of a stop string) and an incomplete UTF-8 character
("\\ufffd" at the end) are held back until they are settled.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"


class TextStream:
    def __init__(self, decode, stop: tuple[str, ...]) -> None:
        self._decode = decode  # list[int] -> str (special tokens skipped)
        self._stop = stop
        self._ids: list[int] = []
        self._prefix = 0  # window start: tokens before it are settled text
        self._read = 0  # tokens before it are in `text`
        self.text = ""  # all text produced so far (uncut)
        self._sent = 0  # characters of `text` handed out as final
        self.stopped = False  # a stop sequence matched; `text` is cut before it

    def push(self, token: int) -> str:
        """Adds one token; returns the newly final text (may be empty)."""
        if self.stopped:
            return ""
        self._ids.append(token)
        before = self._decode(self._ids[self._prefix : self._read])
        now = self._decode(self._ids[self._prefix :])
        if len(now) > len(before) and not now.endswith(REPLACEMENT):
            self.text += now[len(before) :]
            self._prefix, self._read = self._read, len(self._ids)
        return self._release(final=False)

    def finish(self) -> str:
        """Ends the stream (EOS, length, cancel): flushes what was held back."""
        if not self.stopped and self._read < len(self._ids):
            before = self._decode(self._ids[self._prefix : self._read])
            now = self._decode(self._ids[self._prefix :])
            if now.startswith(before):
                self.text += now[len(before) :]
            self._read = len(self._ids)
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        if self._stop and not self.stopped:
            # Only a match that ends in text not yet released can be new.
            start = max(0, self._sent - max(len(s) for s in self._stop) + 1)
            hits = [i for i in (self.text.find(s, start) for s in self._stop) if i >= 0]
            if hits:
                self.text = self.text[: min(hits)]
                self.stopped = True
                final = True
        safe = len(self.text) if final or self.stopped else len(self.text) - self._held()
        out = self.text[self._sent : safe]
        self._sent = max(self._sent, safe)
        return out

    def _held(self) -> int:
        """Length of the longest suffix of `text` that could still grow into a stop string."""
        best = 0
        for s in self._stop:
            for k in range(min(len(s) - 1, len(self.text)), best, -1):
                if self.text.endswith(s[:k]):
                    best = k
                    break
        return best
