from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from tpu_worker.adapters import Output, Prepared
from tpu_worker.batching import Batcher, wait_result
from tpu_worker.cancel import CancelToken
from tpu_worker.errors import WorkerError
from tpu_worker.ops import OpContext


class Recorder:
    """A fake model: records batch compositions; items equal to 'bad' make the batch fail."""

    def __init__(self, delay: float = 0.0) -> None:
        self.batches: list[list] = []
        self.delay = delay
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, batch: list[Prepared], should_stop) -> list[Output]:
        self.gate.wait(10)
        self.batches.append([p.payload for p in batch])
        if any(p.payload == "bad" for p in batch):
            raise ValueError("bad item in batch")
        time.sleep(self.delay)
        return [Output({"echo": p.payload}, []) for p in batch]


def submit_many(b: Batcher, payloads, key=("k",)):
    tokens = [CancelToken() for _ in payloads]
    futures = [b.submit(Prepared(key, 1, p), t) for p, t in zip(payloads, tokens, strict=True)]
    return futures, tokens


def test_concurrent_requests_are_coalesced_up_to_max_batch():
    rec = Recorder()
    rec.gate.clear()  # hold the first batch so the rest queue up
    b = Batcher("m", rec, max_batch=4, max_wait_ms=50)
    try:
        futures, tokens = submit_many(b, list(range(9)))
        rec.gate.set()
        results = [wait_result(f, t).result for f, t in zip(futures, tokens, strict=True)]
        assert [r["echo"] for r in results] == list(range(9))
        assert max(len(x) for x in rec.batches) == 4
        assert len(rec.batches) <= 4
        assert results[0]["batched_with"] >= 1 and any(r["batched_with"] == 4 for r in results)
        assert b.stats.requests == 9
    finally:
        b.close("test over")


def test_a_bad_request_fails_alone():
    rec = Recorder()
    rec.gate.clear()
    b = Batcher("m", rec, max_batch=8, max_wait_ms=50)
    try:
        futures, tokens = submit_many(b, ["a", "bad", "c"])
        rec.gate.set()
        assert wait_result(futures[0], tokens[0]).result["echo"] == "a"
        assert wait_result(futures[2], tokens[2]).result["echo"] == "c"
        with pytest.raises(ValueError):
            wait_result(futures[1], tokens[1])
    finally:
        b.close("test over")


def test_cancelled_request_is_dropped_before_running():
    rec = Recorder()
    rec.gate.clear()
    b = Batcher("m", rec, max_batch=1, max_wait_ms=0)  # one at a time
    try:
        futures, tokens = submit_many(b, ["first", "second", "third"])
        tokens[1].cancel()
        rec.gate.set()
        assert wait_result(futures[0], tokens[0]).result["echo"] == "first"
        with pytest.raises(WorkerError) as info:
            wait_result(futures[1], tokens[1])
        assert info.value.code == "cancelled"
        assert wait_result(futures[2], tokens[2]).result["echo"] == "third"
        assert ["second"] not in rec.batches
    finally:
        b.close("test over")


def test_batching_off_runs_one_request_per_forward():
    rec = Recorder()
    rec.gate.clear()
    b = Batcher("m", rec, max_batch=8, max_wait_ms=5, enabled=False)
    try:
        futures, tokens = submit_many(b, list(range(5)))
        rec.gate.set()
        for f, t in zip(futures, tokens, strict=True):
            wait_result(f, t)
        assert all(len(x) == 1 for x in rec.batches)
    finally:
        b.close("test over")


def test_only_requests_with_the_same_key_share_a_batch():
    rec = Recorder()
    rec.gate.clear()
    b = Batcher("m", rec, max_batch=8, max_wait_ms=20)
    try:
        t = CancelToken()
        fa = [b.submit(Prepared(("gen", 4), 1, f"a{i}"), t) for i in range(3)]
        fb = [b.submit(Prepared(("gen", 8), 1, f"b{i}"), t) for i in range(3)]
        rec.gate.set()
        for f in fa + fb:
            wait_result(f, t)
        for batch in rec.batches:
            assert len({p[0] for p in batch}) == 1
    finally:
        b.close("test over")


def test_close_fails_queued_requests_with_model_not_loaded():
    rec = Recorder()
    rec.gate.clear()
    b = Batcher("m", rec, max_batch=1, max_wait_ms=0)
    futures, tokens = submit_many(b, ["x", "y"])
    time.sleep(0.05)
    threading.Timer(0.1, rec.gate.set).start()
    b.close("model 'm' was unloaded")
    with pytest.raises(WorkerError) as info:
        wait_result(futures[1], tokens[1])
    assert info.value.code == "model_not_loaded"


def test_worker_infer_coalesces_concurrent_callers_and_isolates_bad_input(shared_worker):
    model = shared_worker.served["mnist-cnn"]
    gate = threading.Event()
    original = model.adapter.run_batch

    def slow_first(batch, should_stop):
        gate.wait(10)
        return original(batch, should_stop)

    model.batcher._run = slow_first
    try:
        xs = [torch.randn(1, 1, 28, 28) for _ in range(6)]
        with ThreadPoolExecutor(8) as pool:
            futs = [
                pool.submit(shared_worker.handle, "infer", {"model": "mnist-cnn"}, [x], OpContext(f"c{i}"))
                for i, x in enumerate(xs)
            ]
            bad = pool.submit(
                shared_worker.handle, "infer", {"model": "mnist-cnn"}, [torch.randn(2, 3)], OpContext("bad")
            )
            time.sleep(0.3)
            gate.set()
            results = [f.result(timeout=30) for f in futs]
            with pytest.raises(WorkerError) as info:
                bad.result(timeout=30)
        assert info.value.code == "invalid_argument"
        assert max(r[0]["batched_with"] for r in results) > 1
        for (_, (logits,)), x in zip(results, xs, strict=True):
            direct = model.adapter.eager_model(x)
            assert torch.allclose(logits, direct, atol=1e-5)
    finally:
        model.batcher._run = original
