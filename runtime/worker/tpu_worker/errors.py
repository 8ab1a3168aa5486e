"""One catalogue of worker error codes (mirrors runtime/PROTOCOL.md)."""

from __future__ import annotations

# Code -> whether calling again (after waiting, or after the fix the message names) can succeed.
# The same answer as the server's catalogue (policies/errors.ts); test/unit/errors.test.ts compares.
RECOVERABLE = {
    "protocol_error": True,
    "invalid_argument": True,
    "response_format_refused": True,
    "recompile_after_load": False,  # the same shape again is refused again: shapes.strict is the fix
    "unknown_model": True,
    "model_not_loaded": True,
    "model_already_loaded": True,
    "insufficient_memory": True,
    "out_of_memory": True,
    "unsafe_weights": False,
    "path_outside_roots": False,
    "weights_missing": False,
    "weights_too_large": False,
    "unsupported_device": True,
    "unsupported_dtype": True,
    "cancelled": True,
    "engine_unavailable": True,
    "internal": True,
}
ERROR_CODES = frozenset(RECOVERABLE)


class WorkerError(Exception):
    """An error whose message is safe to send to the client.

    Messages say what to do next and never contain absolute paths or tracebacks;
    `recoverable` tells the caller whether calling again (after waiting, or with the fix the
    message names) can succeed; it defaults to the code's entry in RECOVERABLE.
    """

    def __init__(self, code: str, message: str, *, recoverable: bool | None = None) -> None:
        if code not in ERROR_CODES:
            raise ValueError(f"unknown error code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message
        # A raise site may know better (a fatal frame, a device the worker can never use).
        self.recoverable = RECOVERABLE[code] if recoverable is None else recoverable

    def to_wire(self) -> dict:
        return {"code": self.code, "message": self.message, "recoverable": self.recoverable}


class Cancelled(WorkerError):
    def __init__(self, message: str = "the request was cancelled") -> None:
        super().__init__("cancelled", message)

    @classmethod
    def because(cls, reason: str) -> Cancelled:
        """The cancellation for a token's reason; the server answers the caller with its own
        budget_exceeded or timeout (what was used, the limit, what to do)."""
        if reason == "budget":
            return cls("the request was stopped: its device-time budget ran out")
        if reason == "timeout":
            return cls("the request was stopped: it ran past its time limit")
        if reason == "approval":
            return cls("the request was stopped: it ran past the estimate it was approved for")
        return cls()


def invalid(message: str) -> WorkerError:
    return WorkerError("invalid_argument", message)


def is_oom(exc: BaseException) -> bool:
    """True for device/host out-of-memory failures from any backend."""
    oom_type = getattr(__import__("torch"), "OutOfMemoryError", None)
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    if isinstance(exc, MemoryError):
        return True
    text = str(exc)
    lowered = text.lower()
    # CPU allocations fail with "DefaultCPUAllocator: can't allocate memory".
    return isinstance(exc, RuntimeError) and (
        "out of memory" in lowered or "can't allocate memory" in lowered or "RESOURCE_EXHAUSTED" in text
    )
