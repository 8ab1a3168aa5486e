"""Cancellation tokens: `cancel` messages set them; long loops check them between steps.

A token carries why it was cancelled: "cancelled" (the caller), or "budget" / "timeout" (the
server's gate stopped the call: its device-time budget or its time limit ran out). A loop that
can end with a partial result (a benchmark's grid, a generation's tokens) reads `reason` to mark
it; everything else raises `Cancelled`, whose message says why.
"""

from __future__ import annotations

import threading

from .errors import Cancelled

REASONS = ("cancelled", "budget", "timeout")


class CancelToken:
    def __init__(self) -> None:
        self._event = threading.Event()
        self._reason: str | None = None

    def cancel(self, reason: str = "cancelled") -> None:
        # The first reason wins: a call stopped by its budget stays stopped by its budget.
        if reason not in REASONS:
            reason = "cancelled"
        if self._reason is None:
            self._reason = reason
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    @property
    def reason(self) -> str | None:
        """Why the token was cancelled ("cancelled", "budget", "timeout"); None while it is not."""
        return self._reason if self._event.is_set() else None

    @property
    def stopped(self) -> str | None:
        """The server's stop ("budget" or "timeout"); None otherwise (not cancelled, or by the caller)."""
        r = self.reason
        return r if r in ("budget", "timeout") else None

    def check(self) -> None:
        if self._event.is_set():
            raise Cancelled.because(self._reason or "cancelled")

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)


NEVER = CancelToken()  # a token nobody cancels, for internal calls
