"""Generation over the worker's real transport (server.Server on pipes, the infer fast path):
streamed deltas are progress frames on the request's id, in order and before its result, and a
cancel answers with the partial text as a result (finish_reason "cancelled")."""

from __future__ import annotations

import pytest

from test_server_fastpath import Harness
from tpu_worker.ops import OpContext


@pytest.fixture
def wire(worker):
    worker.handle("load", {"model": "tiny-chat"}, [], OpContext("load"))
    h = Harness(worker)
    yield h
    h.close()


def _generate(h: Harness, rid: str, **args) -> None:
    h.send({"type": "request", "id": rid, "op": "infer", "args": {"model": "tiny-chat", **args}})


def test_streamed_deltas_arrive_in_order_before_the_result_and_add_up_to_it(wire):
    messages = [{"role": "user", "content": "hello"}]
    _generate(wire, "s", messages=messages, max_new_tokens=12, stream=True, temperature=0.7, seed=3)
    deltas = []
    while True:
        header, _ = wire.next()
        assert header["id"] == "s"
        if header["type"] != "progress":
            break
        assert header["total"] == 12 and header["message"] == header["delta"]["text"]
        assert header["delta"]["index"] == 0
        deltas.append((header["progress"], header["delta"]["text"]))
    assert header["type"] == "result", header
    result = header["result"]
    assert [p for p, _ in deltas] == sorted({p for p, _ in deltas})
    assert "".join(t for _, t in deltas) == result["texts"][0] == result["generations"][0]["text"]
    assert result["seed"] == 3 and result["model"] == "tiny-chat"
    _generate(wire, "again", messages=messages, max_new_tokens=12, temperature=0.7, seed=3)
    header, _ = wire.next()
    assert header["type"] == "result" and header["result"]["texts"] == result["texts"]  # no stream: no progress


def test_a_cancel_on_the_wire_answers_with_the_partial_text(wire, worker):
    adapter = worker.served["tiny-chat"].adapter
    real_step, steps = adapter.step, []

    def step_after_the_cancel(*args):
        steps.append(1)
        if len(steps) >= 2:  # the first deltas are out: decode on only once the cancel arrived
            assert wire.server._tokens["c"].wait(30)
        return real_step(*args)

    adapter.step = step_after_the_cancel
    _generate(wire, "c", texts=["a long one"], max_new_tokens=64, stream=True)
    header, _ = wire.next()
    assert header["type"] == "progress"
    wire.send({"type": "cancel", "id": "c"})
    text = header["delta"]["text"]
    while True:
        header, _ = wire.next()
        if header["type"] != "progress":
            break
        text += header["delta"]["text"]
    assert header["type"] == "result", header
    g = header["result"]["generations"][0]
    assert g["finish_reason"] == "cancelled" and g["text"] == text
    # Prefill and step 1 produce the first frames; the cancel lands before step 2 (2 tokens) or
    # during it (held until the cancel: 3 tokens), and decoding stops at that token boundary.
    assert g["usage"]["completion_tokens"] in (2, 3)
