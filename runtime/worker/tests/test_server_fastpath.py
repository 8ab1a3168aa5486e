"""The infer fast path of server.Server (reader -> batcher -> reply), in process over real pipes.

A forward is held on an Event so that the order of events is certain: what is queued behind it,
what a cancel does to a queued request, and that the batcher still coalesces concurrent callers.
"""

from __future__ import annotations

import os
import queue
import threading
import time

import pytest
import torch

from tpu_worker.ops import OpContext, Worker
from tpu_worker.protocol import encode_frame
from tpu_worker.server import Server
from wire import _RawReader


class Harness:
    def __init__(self, worker: Worker) -> None:
        to_worker_r, self._to_worker_w = os.pipe()
        from_worker_r, from_worker_w = os.pipe()
        self.server = Server(
            worker, os.fdopen(to_worker_r, "rb", buffering=0), os.fdopen(from_worker_w, "wb"), max_body_bytes=1 << 24
        )
        self._inp = os.fdopen(self._to_worker_w, "wb")
        self._reader = _RawReader(os.fdopen(from_worker_r, "rb"))
        self.messages: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self._serve = threading.Thread(target=self.server.serve, daemon=True)
        self._serve.start()
        assert self.next()[0]["type"] == "hello"

    def _pump(self) -> None:
        while True:
            try:
                msg = self._reader.read_any()
            except Exception:
                return
            self.messages.put(msg)
            if msg is None:
                return

    def send(self, header: dict, tensors=None) -> None:
        for c in encode_frame(header, tensors):
            self._inp.write(c)
        self._inp.flush()

    def next(self, timeout: float = 30):
        return self.messages.get(timeout=timeout)

    def close(self) -> None:
        self._inp.close()  # EOF: the server stops
        self._serve.join(timeout=10)


@pytest.fixture
def held(worker):
    """mnist-cnn loaded with batching on; its forwards wait until `release` is set. Loaded once
    the server exists: a batcher takes the transport's reply grouping when it is built."""
    h = Harness(worker)
    worker.handle("load", {"model": "mnist-cnn"}, [], OpContext("load"))
    loaded = worker.served["mnist-cnn"]
    assert loaded.batcher.reply_scope == h.server._batch_replies
    release, entered = threading.Event(), threading.Event()
    batches: list[int] = []
    real = loaded.batcher._run

    def gated(batch, should_stop):
        batches.append(len(batch))
        entered.set()
        assert release.wait(30)
        return real(batch, should_stop)

    loaded.batcher._run = gated
    yield h, release, entered, batches
    release.set()
    h.close()


def _infer(h: Harness, rid: str, **extra) -> None:
    header = {"type": "request", "id": rid, "op": "infer", "args": {"model": "mnist-cnn"}, **extra}
    h.send(header, [torch.rand(1, 1, 28, 28)])


def test_a_queued_infer_is_cancelled_at_once_while_the_forward_ahead_of_it_runs(held):
    h, release, entered, _ = held
    _infer(h, "a")
    assert entered.wait(10)  # a is inside its forward, holding the batcher
    _infer(h, "b")
    h.send({"type": "cancel", "id": "b"})
    header, _ = h.next()
    assert (header["type"], header["id"], header["error"]["code"]) == ("error", "b", "cancelled")
    release.set()
    header, tensors = h.next()
    assert (header["type"], header["id"]) == ("result", "a")
    assert header["result"]["model"] == "mnist-cnn" and tensors[0].shape == (1, 10)


def test_concurrent_infers_on_the_fast_path_are_batched_and_each_answered(held):
    h, release, entered, batches = held
    _infer(h, "first")
    assert entered.wait(10)
    for i in range(5):  # queued behind the held forward: they must share the next one
        _infer(h, f"q{i}")
    # All five in the batcher's queue before the forward ahead ends: the server reads frames on
    # its own thread, and one still unread at the release would make a batch of its own.
    batcher = h.server.worker.served["mnist-cnn"].batcher
    deadline = time.monotonic() + 10
    while batcher.queue_depth < 5 and time.monotonic() < deadline:
        time.sleep(0.005)
    release.set()
    answers = {}
    for _ in range(6):
        header, tensors = h.next()
        assert header["type"] == "result", header
        answers[header["id"]] = header["result"]["batched_with"]
        assert tensors[0].shape == (1, 10)
    assert answers["first"] == 1
    assert all(answers[f"q{i}"] == 5 for i in range(5)) and batches == [1, 5]


def test_a_traced_infer_returns_the_workers_stamps_in_order_and_an_untraced_one_none(held):
    h, release, _, _ = held
    release.set()
    _infer(h, "plain")
    header, _ = h.next()
    assert header["type"] == "result" and "trace" not in header
    _infer(h, "traced", trace=True)
    header, _ = h.next()
    # [stage, µs] entries are stamps; [name, start, end(, attributes)] ones are spans (spans.py).
    stamps = [e for e in header["trace"] if len(e) == 2]
    stages = [s for s, _ in stamps]
    assert stages == ["w.arrived", "w.parsed", "w.queued", "w.taken", "w.forward_done", "w.reply"]
    times = [t for _, t in stamps]
    assert times == sorted(times)
    spans = {e[0] for e in header["trace"] if len(e) >= 3}
    assert {"queue", "forward"} <= spans, spans


def test_an_infer_the_fast_path_refuses_still_gets_the_op_paths_error(held):
    h, release, _, _ = held
    release.set()
    h.send({"type": "request", "id": "bad", "op": "infer", "args": {"model": "mnist-cnn"}}, [torch.rand(1, 3, 3)])
    header, _ = h.next()
    assert (header["type"], header["error"]["code"]) == ("error", "invalid_argument")
    assert "expected [N, 1, 28, 28]" in header["error"]["message"]
