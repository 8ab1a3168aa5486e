"""Cancellation tokens: `cancel` messages set them; long loops check them between steps.

A token carries why it was stopped: "cancelled" (the caller's cancel), "budget", "timeout" or
"approval" (the server's cap; "approval": the call ran past what was approved). A generation
finishes its sequences with that reason as finish_reason; a benchmark ends its grid with what it
measured, marked `stopped`; everything else raises `Cancelled`, whose message says why.
"""

from __future__ import annotations

import threading

from .errors import Cancelled

REASONS = ("cancelled", "budget", "timeout", "approval")
STOPS = ("budget", "timeout", "approval")


class CancelToken:
    def __init__(self) -> None:
        self._event = threading.Event()
        self._reason: str | None = None

    def cancel(self, reason: str = "cancelled") -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown cancel reason {reason!r}")
        if self._reason is None:  # the first reason wins
            self._reason = reason
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    @property
    def reason(self) -> str | None:
        """Why the token was cancelled, or None while it is not."""
        return self._reason if self._event.is_set() else None

    @property
    def stopped(self) -> str | None:
        """The server's stop ("budget", "timeout" or "approval"); None otherwise (not cancelled, or
        by the caller)."""
        r = self.reason
        return r if r in STOPS else None

    def check(self) -> None:
        if self._event.is_set():
            raise Cancelled.because(self._reason or "cancelled")

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)


NEVER = CancelToken()  # a token nobody cancels, for internal calls
