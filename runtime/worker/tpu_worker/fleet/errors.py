"""Why the driver refused to start or an operation failed: a stable code and a message saying what to do."""

from __future__ import annotations


class StartError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
