"""The request queue in front of a model's serving thread: the dynamic batcher (batching.py) and
the decode loop (generation/loop.py) both take `infer` requests through one of these, so how a
request is queued (the trace stamp, the refusal once the model is unloading) is one piece of code."""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from .errors import WorkerError
from .protocol import now_us


class Inbox:
    def __init__(self, reply_scope: Callable[[], contextlib.AbstractContextManager] | None = None) -> None:
        self._queue: deque[Any] = deque()
        self._cond = threading.Condition()
        self._closed: str | None = None  # why, once closed: callers are refused with it
        # The transport's (served.ReplyScope): a context around setting results, so the replies
        # (and progress) one pass of the serving thread sends leave in one write.
        self.reply_scope = reply_scope

    def replies(self) -> contextlib.AbstractContextManager:
        return self.reply_scope() if self.reply_scope else contextlib.nullcontext()

    @property
    def queue_depth(self) -> int:
        with self._cond:
            return len(self._queue)

    def _enqueue(self, item: Any, trace: list | None) -> None:
        if trace is not None:
            trace.append(["w.queued", now_us()])
        with self._cond:
            if self._closed:
                raise WorkerError("model_not_loaded", self._closed)
            self._queue.append(item)
            self._cond.notify()
