"""JSON-lines logging on stderr. stdout belongs to the protocol and is never written here."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from typing import IO, Any

_lock = threading.Lock()
_stream: IO[str] = sys.stderr


def set_stream(stream: IO[str]) -> None:
    global _stream
    _stream = stream


def log(level: str, msg: str, **fields: Any) -> None:
    record = {"time": round(time.time(), 3), "level": level, "msg": msg, **fields}
    try:
        line = json.dumps(record, default=str)
    except (TypeError, ValueError):
        line = json.dumps({"time": record["time"], "level": level, "msg": msg})
    with _lock:
        try:
            _stream.write(line + "\n")
            _stream.flush()
        except (OSError, ValueError):
            pass  # stderr gone (parent died); nothing useful left to do


def info(msg: str, **fields: Any) -> None:
    log("info", msg, **fields)


def warn(msg: str, **fields: Any) -> None:
    log("warn", msg, **fields)


def error(msg: str, **fields: Any) -> None:
    log("error", msg, **fields)


def debug(msg: str, **fields: Any) -> None:
    log("debug", msg, **fields)


class _JsonHandler(logging.Handler):
    """Routes library `logging` records (transformers, torch) into the same JSON stream."""

    def emit(self, record: logging.LogRecord) -> None:
        level = {"WARNING": "warn", "CRITICAL": "error"}.get(record.levelname, record.levelname.lower())
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad log call must not break the worker
            msg = str(record.msg)
        log(level, msg, logger=record.name)


def install_logging_bridge(level: int = logging.WARNING) -> None:
    root = logging.getLogger()
    root.handlers[:] = [_JsonHandler()]
    root.setLevel(level)
    logging.captureWarnings(True)
