"""Cancellation tokens: `cancel` messages set them; long loops check them between steps."""

from __future__ import annotations

import threading

from .errors import Cancelled


class CancelToken:
    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        if self._event.is_set():
            raise Cancelled()

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)


NEVER = CancelToken()  # a token nobody cancels, for internal calls
