"""Dynamic batching: one thread per loaded model coalesces concurrent infer requests.

Requests wait at most `max_wait_ms` (measured from the oldest queued request) for company, up
to `max_batch` items, and only while callers are concurrent: an idle model runs a lone request
at once, and requests arriving during a forward are coalesced into the next one. Only requests
with the same key (e.g. the same max_new_tokens) share a batch. A cancelled request is dropped
before its batch runs; if a batch fails, its requests are retried one by one so a single bad
request fails alone. The batcher thread is also the only place a model's forward runs for
`infer`, which keeps the module single-threaded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from . import logs
from .adapters import Output, Prepared
from .cancel import CancelToken
from .errors import Cancelled, WorkerError
from .inbox import Inbox
from .protocol import now_us
from .spans import span_since

RunBatch = Callable[[list[Prepared], Callable[[], bool]], list[Output]]


@dataclass
class _Pending:
    prepared: Prepared
    token: CancelToken
    future: Future = field(default_factory=Future)
    enqueued: float = field(default_factory=time.monotonic)
    trace: list | None = None


@dataclass
class BatchStats:
    batches: int = 0
    requests: int = 0
    items: int = 0
    largest: int = 0


class Batcher(Inbox):
    def __init__(
        self,
        name: str,
        run_batch: RunBatch,
        *,
        max_batch: int,
        max_wait_ms: float,
        enabled: bool = True,
        reply_scope=None,
        warm=None,
    ) -> None:
        super().__init__(reply_scope)
        self.name = name
        self._run = run_batch
        self._warm = warm
        # Batching off (or zero wait) means one request per forward, for honest on/off comparisons.
        self.enabled = enabled and max_wait_ms > 0 and max_batch > 1
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000.0
        self.stats = BatchStats()
        self._concurrent = False
        self._thread = threading.Thread(target=self._loop, name=f"batcher-{name}", daemon=True)
        self._thread.start()

    def describe(self) -> dict:
        return {
            "kind": "dynamic",
            "enabled": self.enabled,
            "max_batch": self.max_batch,
            "max_wait_ms": self.max_wait_s * 1000,
        }

    def submit(self, prepared: Prepared, token: CancelToken, trace: list | None = None, progress=None) -> Future:
        """Queues one request (`progress` is the decode loop's; a forward here reports none)."""
        p = _Pending(prepared, token, trace=trace)
        self._enqueue(p, trace)
        return p.future

    def warm(self, progress, token) -> int:
        """Before the first request: every shape of the adapter's plan once."""
        return self._warm(progress, token) if self._warm is not None else 0

    def close(self, reason: str) -> None:
        with self._cond:
            self._closed = reason
            pending = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for p in pending:
            if p.future.set_running_or_notify_cancel():
                p.future.set_exception(WorkerError("model_not_loaded", reason))
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)  # a running forward sees its cancelled tokens and stops

    # -- internals ----------------------------------------------------------------------------
    def _compatible(self, key: tuple) -> tuple[list[_Pending], int]:
        chosen, items = [], 0
        for p in self._queue:
            if p.prepared.key != key:
                continue
            if chosen and items + p.prepared.items > self.max_batch:
                break
            chosen.append(p)
            items += p.prepared.items
            if not self.enabled or items >= self.max_batch:
                break
        return chosen, items

    def _take(self) -> list[_Pending] | None:
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            key = self._queue[0].prepared.key
            # Wait for company only when callers are concurrent (the last forward served several
            # requests, or more were already queued): a lone caller never pays max_wait.
            if self.enabled and self._concurrent:
                deadline = self._queue[0].enqueued + self.max_wait_s
                while not self._closed:
                    _, items = self._compatible(key)
                    remaining = deadline - time.monotonic()
                    if items >= self.max_batch or remaining <= 0:
                        break
                    self._cond.wait(remaining)
                if self._closed:
                    return None
            chosen, _ = self._compatible(key)
            for p in chosen:
                self._queue.remove(p)
            self._concurrent = len(chosen) > 1 or bool(self._queue)
            return chosen

    def _loop(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            live = []
            for p in batch:
                if not p.future.set_running_or_notify_cancel():
                    continue
                if p.token.cancelled:
                    p.future.set_exception(Cancelled())
                else:
                    live.append(p)
            if live:
                self._execute(live)

    def _execute(self, live: list[_Pending]) -> None:
        def should_stop() -> bool:
            return all(p.token.cancelled for p in live)

        _stamp(live, "w.taken")
        for p in live:
            span_since(p.trace, "queue", "w.queued")
        try:
            outputs = self._run([p.prepared for p in live], should_stop)
        except Exception as exc:  # noqa: BLE001 - isolate below, report per request
            if len(live) > 1 and not isinstance(exc, Cancelled):
                logs.warn(
                    "batch failed; retrying its requests one by one",
                    model=self.name,
                    requests=len(live),
                    error=f"{type(exc).__name__}: {exc}",
                )
                for p in live:
                    if p.token.cancelled:
                        p.future.set_exception(Cancelled())
                    else:
                        self._execute_one(p)
                return
            for p in live:
                p.future.set_exception(exc)
            return
        self._record(live)
        _stamp(live, "w.forward_done")
        for p in live:
            span_since(p.trace, "forward", "w.taken", batched_with=len(live))
        with self.replies():
            for p, out in zip(live, outputs, strict=True):
                if p.token.cancelled:
                    p.future.set_exception(Cancelled())
                else:
                    out.result["batched_with"] = len(live)
                    out.result["batch_items"] = sum(q.prepared.items for q in live)
                    p.future.set_result(out)

    def _execute_one(self, p: _Pending) -> None:
        try:
            (out,) = self._run([p.prepared], lambda: p.token.cancelled)
        except Exception as exc:  # noqa: BLE001
            p.future.set_exception(exc)
            return
        self._record([p])
        out.result["batched_with"] = 1
        out.result["batch_items"] = p.prepared.items
        p.future.set_result(out)

    def _record(self, live: list[_Pending]) -> None:
        s = self.stats
        items = sum(p.prepared.items for p in live)
        s.batches += 1
        s.requests += len(live)
        s.items += items
        s.largest = max(s.largest, items)


def _stamp(live: list[_Pending], stage: str) -> None:
    t = None
    for p in live:
        if p.trace is not None:
            t = t or now_us()
            p.trace.append([stage, t])


def wait_result(future: Future, token: CancelToken, poll_s: float = 0.05, *, early_cancel: bool = True) -> Output:
    """Blocks for a batcher result, giving up promptly when the request is cancelled (unless
    `early_cancel` is off: the work answers a cancel itself, as generation does)."""
    while True:
        if early_cancel and token.cancelled and not future.done():
            raise Cancelled()
        try:
            return future.result(timeout=poll_s)
        except TimeoutError:
            continue
