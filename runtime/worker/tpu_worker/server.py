"""The main loop: one reader thread, one locked writer, ops on a thread pool.

The reader never runs a long op itself, so `ping` is answered and `cancel` delivered while ops
run. Every frame leaves through `send`, which holds one lock for the whole frame.

`infer` takes a fast path with one thread hand-off instead of three: the reader validates the
input (`Worker.submit_infer`, the same path the `infer` op takes; `prepare` is cheap) and queues
it on its model (`Served.submit`: a torch model's batcher, an engine model's request pool), whose
thread sends the reply from the future's callback as soon as the work is done. An infer refused
there (model not loaded, bad input) is answered from the reader with the error the op would
give. Every thread hand-off waits for the GIL, which another thread may hold for a whole switch
interval (5 ms by default), so each one removed is latency a lone caller no longer pays.
Everything else (load, benchmark, ...) runs on the op pool.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import traceback
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import IO, Any

import torch

from . import logs
from .cancel import CancelToken
from .errors import Cancelled, WorkerError, is_oom
from .ops import OpContext, Worker, infer_reply
from .protocol import Cancel, FrameReader, Ping, ProtocolError, Request, encode_frame, now_us
from .spans import span_since

EXIT_OK = 0
EXIT_DESYNC = 3
# A measurement knob, read once at start (runtime/PROTOCOL.md, "Environment"):
# TPU_WORKER_SWITCH_INTERVAL_S sets sys.setswitchinterval. It is
# left at CPython's 5 ms: with the fast path a lone call has no GIL hand-off left to wait at, and
# a 0.5 ms interval measured no better for lone calls and no better (in noisy runs, worse) for 32
# concurrent callers on the shared 2-core development VM.
SWITCH_INTERVAL_S = float(os.environ.get("TPU_WORKER_SWITCH_INTERVAL_S") or 0)
_JOIN_MAX = 256 * 1024


def _finite(obj: Any) -> Any:
    """JSON has no NaN/Infinity; report them as null rather than failing the whole reply."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


class Server:
    def __init__(
        self, worker: Worker, inp: IO[bytes], out: IO[bytes], *, max_body_bytes: int, max_threads: int = 128
    ) -> None:
        self.worker = worker
        # Every model's batcher groups the replies of one pass into one write (given at its
        # construction, so before any model is loaded).
        worker.reply_scope = self._batch_replies
        self.reader = FrameReader(inp, max_body_bytes)
        self._out = out
        self._write_lock = threading.Lock()
        self._tokens: dict[str, CancelToken] = {}
        # Fast-path infers waiting in a batcher: a cancel also drops them from its queue at once.
        self._futures: dict[str, Future] = {}
        self._tokens_lock = threading.Lock()
        self._outbox = threading.local()
        # Each infer holds an op thread until its batch is done, so this pool also bounds how many
        # requests a model's batcher can ever see at once: keep it above the largest max_batch.
        self._pool = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="op")
        self._stop = threading.Event()
        self.exit_code = EXIT_OK
        self._out_broken = False

    # -- output -------------------------------------------------------------------------------
    def send(self, header: dict, tensors: list[torch.Tensor] | None = None) -> None:
        try:
            chunks = encode_frame(_finite(header), tensors)
        except (TypeError, ValueError) as exc:
            logs.error("reply could not be encoded", error=str(exc), type=header.get("type"))
            chunks = encode_frame(
                {
                    "type": "error",
                    "id": header.get("id"),
                    "error": WorkerError("internal", "the result could not be encoded; see the worker log").to_wire(),
                }
            )
        held = getattr(self._outbox, "chunks", None)
        if held is not None:  # inside a batch's replies: written together at its end
            held.extend(chunks)
            return
        self._write(chunks)

    def _write(self, chunks: list) -> None:
        # The protocol stream is unbuffered: every write() is a syscall that wakes the client's
        # reader. Small frames (and a batch's replies) go out as one write, large tensors as
        # they are (joining them would copy megabytes to save a syscall).
        if sum(len(c) for c in chunks) <= _JOIN_MAX:
            chunks = [b"".join(chunks)]
        with self._write_lock:
            if self._out_broken:
                return
            try:
                for c in chunks:
                    self._out.write(c)
                self._out.flush()
            except (OSError, ValueError):
                # The client is gone; nothing can be delivered any more.
                self._out_broken = True
                self.stop(EXIT_OK)

    @contextmanager
    def _batch_replies(self):
        """Holds the replies sent by this thread (a batcher finishing a batch) for one write."""
        self._outbox.chunks = []
        try:
            yield
        finally:
            chunks, self._outbox.chunks = self._outbox.chunks, None
            if chunks:
                self._write(chunks)

    def send_error(self, msg_id: str | None, err: WorkerError) -> None:
        self.send({"type": "error", "id": msg_id, "error": err.to_wire()})

    # -- lifecycle ----------------------------------------------------------------------------
    def stop(self, code: int = EXIT_OK) -> None:
        if not self._stop.is_set():
            self.exit_code = code
            self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def serve(self) -> int:
        """Sends hello, serves until EOF / shutdown / stop(), then cleans up; returns the exit code."""
        if SWITCH_INTERVAL_S > 0:
            sys.setswitchinterval(SWITCH_INTERVAL_S)
        self.send(self.worker.hello())
        reader = threading.Thread(target=self._read_loop, name="reader", daemon=True)
        reader.start()
        while not self._stop.wait(0.5):
            pass
        self._shutdown()
        return self.exit_code

    def _shutdown(self) -> None:
        with self._tokens_lock:
            for t in self._tokens.values():
                t.cancel()
        self.worker.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- input --------------------------------------------------------------------------------
    def _read_loop(self) -> None:
        while not self._stop.is_set():
            try:
                msg = self.reader.read()
            except ProtocolError as exc:
                logs.warn("protocol error", error=exc.message, id=exc.msg_id, fatal=exc.fatal)
                self.send_error(exc.msg_id, WorkerError("protocol_error", exc.message, recoverable=not exc.fatal))
                if exc.fatal:
                    self.stop(EXIT_DESYNC)
                    return
                continue
            except Exception as exc:  # noqa: BLE001 - a reader crash must still end the worker cleanly
                logs.error("reader failed", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
                self.stop(EXIT_DESYNC)
                return
            if msg is None:
                logs.info("stdin closed; exiting")
                self.stop(EXIT_OK)
                return
            self.dispatch(msg)

    def dispatch(self, msg: Request | Cancel | Ping) -> None:
        if isinstance(msg, Ping):
            import time

            self.send({"type": "pong", "id": msg.id, "time_s": time.time()})
        elif isinstance(msg, Cancel):
            with self._tokens_lock:
                token = self._tokens.get(msg.id)
                future = self._futures.get(msg.id)
            if token is not None:
                token.cancel(msg.reason)
                if future is not None:
                    future.cancel()  # still queued: answered `cancelled` now (see _infer_done)
                logs.info("cancel requested", id=msg.id, reason=msg.reason)
            else:
                logs.debug("cancel for a request that is not running", id=msg.id)
        else:
            with self._tokens_lock:
                if msg.id in self._tokens:
                    dup = True
                else:
                    dup = False
                    token = self._tokens[msg.id] = CancelToken()
            if dup:
                self.send_error(msg.id, WorkerError("protocol_error", f"request id {msg.id!r} is already in flight"))
                return
            if msg.op == "infer":
                self._fast_infer(msg, token)
                return
            try:
                self._pool.submit(self._run, msg, token)
            except RuntimeError:  # pool shut down: we are exiting
                self._forget(msg.id)

    def _forget(self, msg_id: str) -> None:
        with self._tokens_lock:
            self._tokens.pop(msg_id, None)
            self._futures.pop(msg_id, None)

    # -- the infer fast path (see the module docstring) ------------------------------------------
    def _fast_infer(self, req: Request, token: CancelToken) -> None:
        """Queues an infer on its model's batcher from the reader (the worker's one infer path)."""
        try:
            future, model = self.worker.submit_infer(req.args, req.tensors, token, req.trace, self._progress(req.id))
        except Exception as exc:  # noqa: BLE001 - not loaded, a refused input, the model being unloaded
            self._forget(req.id)
            self._fail(req, exc)
            return
        with self._tokens_lock:
            self._futures[req.id] = future
        # Runs on the batcher thread when the forward is done (or here, if it already is; or on
        # the reader when a cancel drops it from the queue).
        future.add_done_callback(lambda f: self._infer_done(req, model, f))
        if token.cancelled:  # a cancel that arrived between submit and registration
            future.cancel()

    def _infer_done(self, req: Request, model: str, future: Future) -> None:
        self._forget(req.id)
        if future.cancelled():
            self.send_error(req.id, Cancelled())
            return
        exc = future.exception()
        if exc is not None:
            self._fail(req, exc)
            return
        self._reply(req, *infer_reply(future.result(), model))

    def _progress(self, msg_id: str):
        def report(
            progress: float, total: float | None = None, message: str | None = None, delta: dict | None = None
        ) -> None:
            header: dict[str, Any] = {"type": "progress", "id": msg_id, "progress": progress}
            if total is not None:
                header["total"] = total
            if message:
                header["message"] = message
            if delta is not None:  # a generation's new text: {"index": prompt, "text": ...}
                header["delta"] = delta
            self.send(header)

        return report

    def _run(self, req: Request, token: CancelToken) -> None:
        if req.trace is not None:
            req.trace.append(["w.op_thread", now_us()])
        ctx = OpContext(req.id, token, self._progress(req.id), req.trace)
        try:
            result, tensors = self.worker.handle(req.op, req.args, req.tensors, ctx)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a safe error reply
            self._forget(req.id)
            self._fail(req, exc)
            return
        self._forget(req.id)
        self._reply(req, result, tensors)
        if req.op == "shutdown":
            logs.info("shutdown requested")
            self.stop(EXIT_OK)

    def _reply(self, req: Request, result: dict, tensors: list[torch.Tensor]) -> None:
        reply: dict[str, Any] = {"type": "result", "id": req.id, "result": result}
        if req.trace is not None:
            req.trace.append(["w.reply", now_us()])
            span_since(req.trace, "request", "w.arrived", op=req.op)
            reply["trace"] = req.trace
        self.send(reply, tensors)

    def _fail(self, req: Request, exc: BaseException) -> None:
        """Answers a failed request with a safe error (no paths or tracebacks on the wire)."""
        if isinstance(exc, WorkerError):
            self.send_error(req.id, exc)
        elif isinstance(exc, CancelledError):
            self.send_error(req.id, Cancelled())
        elif is_oom(exc):
            logs.error("out of memory", op=req.op, id=req.id, error=str(exc)[:500], **_trace_of(req))
            self.send_error(
                req.id,
                WorkerError(
                    "out_of_memory",
                    f"{req.op} ran out of memory on {self.worker.device}; use a smaller batch or dtype, "
                    "or unload other models",
                ),
            )
        else:
            logs.error(
                "op failed",
                op=req.op,
                id=req.id,
                error=f"{type(exc).__name__}: {exc}",
                traceback="".join(traceback.format_exception(exc)),
                **_trace_of(req),
            )
            self.send_error(
                req.id,
                WorkerError(
                    "internal", f"{req.op} failed with an internal error ({type(exc).__name__}); see the worker log"
                ),
            )


def _trace_of(req: Request) -> dict[str, str]:
    """The trace id of a traced request (from its traceparent), for its log lines."""
    parts = (req.traceparent or "").split("-")
    return {"trace_id": parts[1]} if len(parts) == 4 and len(parts[1]) == 32 else {}
