"""One catalogue of worker error codes (mirrors runtime/PROTOCOL.md)."""

from __future__ import annotations

ERROR_CODES = frozenset(
    {
        "protocol_error",
        "invalid_argument",
        "unknown_model",
        "model_not_loaded",
        "model_already_loaded",
        "insufficient_memory",
        "out_of_memory",
        "unsafe_weights",
        "path_outside_roots",
        "weights_missing",
        "weights_too_large",
        "unsupported_device",
        "unsupported_dtype",
        "cancelled",
        "internal",
    }
)


class WorkerError(Exception):
    """An error whose message is safe to send to the client.

    Messages say what to do next and never contain absolute paths or tracebacks;
    `recoverable` tells the caller whether retrying (possibly with other arguments) can work
    without restarting the worker.
    """

    def __init__(self, code: str, message: str, *, recoverable: bool = True) -> None:
        if code not in ERROR_CODES:
            raise ValueError(f"unknown error code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message
        self.recoverable = recoverable

    def to_wire(self) -> dict:
        return {"code": self.code, "message": self.message, "recoverable": self.recoverable}


class Cancelled(WorkerError):
    def __init__(self, message: str = "the request was cancelled") -> None:
        super().__init__("cancelled", message)


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
