"""A call the server stops (its budget or time limit ran out) ends with what it has: the cancel
message carries the reason, the token keeps it, and a benchmark ends its grid at the next
iteration with its measured part marked `stopped`. Other ops answer `cancelled` (the server
turns that into budget_exceeded or timeout with the figures it knows)."""

from __future__ import annotations

import io

import pytest

from conftest import bench_args
from tpu_worker.cancel import CancelToken
from tpu_worker.errors import WorkerError
from tpu_worker.ops import OpContext
from tpu_worker.protocol import Cancel, FrameReader, encode_frame, parse_message


def frames_bytes(*frames) -> io.BytesIO:
    return io.BytesIO(b"".join(bytes(c) for f in frames for c in f))


def test_a_token_keeps_the_first_reason_it_was_cancelled_for():
    t = CancelToken()
    assert t.reason is None and t.stopped is None and not t.cancelled
    t.cancel("budget")
    t.cancel()  # a later plain cancel does not turn a budget stop into a cancellation
    assert t.cancelled and t.reason == "budget" and t.stopped == "budget"
    with pytest.raises(WorkerError) as exc:
        t.check()
    assert exc.value.code == "cancelled" and "budget" in exc.value.message
    plain = CancelToken()
    plain.cancel()
    assert plain.reason == "cancelled" and plain.stopped is None
    with pytest.raises(ValueError):
        CancelToken().cancel("nonsense")


def test_the_cancel_message_carries_an_optional_reason():
    stream = frames_bytes(
        encode_frame({"type": "cancel", "id": "a"}),
        encode_frame({"type": "cancel", "id": "b", "reason": "budget"}),
        encode_frame({"type": "cancel", "id": "c", "reason": "timeout"}),
    )
    r = FrameReader(stream)
    assert r.read() == Cancel("a", "cancelled")
    assert r.read() == Cancel("b", "budget")
    assert r.read() == Cancel("c", "timeout")


def test_a_cancel_with_an_unknown_reason_is_a_protocol_error():
    with pytest.raises(ValueError, match="reason"):
        parse_message({"type": "cancel", "id": "a", "reason": "whim"}, bytearray())


class StopAfter(CancelToken):
    """Stopped (for `reason`) at the n-th look at it: deterministic, whatever the host's speed."""

    def __init__(self, n: int, reason: str) -> None:
        super().__init__()
        self.left, self.why = n, reason

    @property
    def cancelled(self) -> bool:
        if not super().cancelled:
            self.left -= 1
            if self.left < 0:
                self.cancel(self.why)
        return super().cancelled


def bench(worker, token, **args):
    return worker.handle("benchmark", bench_args(**args), [], OpContext("b", token))[0]


@pytest.mark.parametrize("reason", ["budget", "timeout"])
def test_a_stopped_benchmark_returns_what_it_measured_marked_stopped(shared_worker, reason):
    # The first configuration runs whole; the stop arrives during the second one's window.
    looks_per_config = 1 + 20  # a warmup call, then one look per measured iteration and the end
    token = StopAfter(looks_per_config + 5, reason)
    r = bench(shared_worker, token, batch_sizes=[1, 2, 4, 8], iterations=20)
    assert r["stopped"] == reason and r["cancelled"] is False
    assert 1 <= len(r["configs"]) < 4
    first = r["configs"][0]
    assert first["iterations"] == 20 and first["error"] is None
    # A configuration cut short keeps its measured iterations: valid figures, fewer of them.
    for c in r["configs"]:
        assert c["error"] is None and c["iterations"] >= 1
        lat = c["latency_ms"]
        assert lat["min"] <= lat["p50"] <= lat["max"]
    assert any(c["iterations"] < 20 for c in r["configs"])


def test_a_cancelled_benchmark_is_still_cancelled_not_stopped(shared_worker):
    token = StopAfter(3, "cancelled")
    r = bench(shared_worker, token, batch_sizes=[1, 2], iterations=20)
    assert r["cancelled"] is True and "stopped" not in r


def test_a_stopped_load_answers_cancelled_with_the_reason(worker):
    token = CancelToken()
    token.cancel("budget")
    with pytest.raises(WorkerError) as exc:
        worker.handle("load", {"model": "mnist-cnn"}, [], OpContext("l", token))
    assert exc.value.code == "cancelled" and "budget" in exc.value.message
