"""check_model's shape-stability verdict: dynamo's trace of the forward at the plan's bucket, a
graph break named with its reason, the trace bounded in time and cancellable, and never run
while a compiled model is served (its reset would drop that model's graphs)."""

from __future__ import annotations

import threading

import pytest
import torch

from tpu_worker.adapters.tensor import MnistCNN
from tpu_worker.cancel import CancelToken
from tpu_worker.ops import OpContext
from tpu_worker.shape_audit import audit


class ItemCNN(MnistCNN):
    """The built-in CNN with a host read of a tensor's value in its forward."""

    def forward(self, x):
        scale = float(x.abs().max().item())
        return super().forward(x / max(scale, 1.0))


class Branchy(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # a Python branch on the data
            return x * 2
        return x - 1


class NonZero(torch.nn.Module):
    def forward(self, x):
        return torch.nonzero(x > 0).float().sum()


class LongTrace(torch.nn.Module):
    """Many small ops: dynamo takes seconds to trace it."""

    def forward(self, x):
        for _ in range(20_000):
            x = x + 1
        return x


def test_a_plain_forward_is_shape_stable():
    r = audit(MnistCNN().eval(), torch.randn(2, 1, 28, 28))
    assert r["shape_stable"] is True and r["graphs"] == 1 and r["graph_breaks"] == 0 and r["breaks"] == []


@pytest.mark.parametrize(
    "module,kind",
    [(ItemCNN(), "item_call"), (Branchy(), "data_dependent_branch"), (NonZero(), "data_dependent_shape")],
)
def test_a_graph_break_is_not_shape_stable_and_says_why(module, kind):
    x = torch.randn(2, 1, 28, 28) if isinstance(module, ItemCNN) else torch.randn(4, 8)
    r = audit(module.eval(), x)
    assert r["shape_stable"] is False and r["graph_breaks"] >= 1 and r["graphs"] >= 2
    first = r["breaks"][0]
    assert first["kind"] == kind and first["reason"] and first["where"].startswith("test_shape_audit.py:")


def test_the_trace_is_bounded_in_time():
    r = audit(LongTrace(), torch.zeros(2), limit_s=0.3)
    assert r["shape_stable"] is None and "ran past 0.3 s" in r["unaudited"]
    assert r["audit_s"] < 30  # stopped, not run to its end (a generous bound for a loaded host)
    assert audit(MnistCNN().eval(), torch.randn(1, 1, 28, 28))["shape_stable"] is True  # dynamo still works


def test_a_cancel_stops_the_trace():
    token = CancelToken()
    threading.Timer(0.3, token.cancel).start()
    r = audit(LongTrace(), torch.zeros(2), token=token)
    assert r["shape_stable"] is None and r["unaudited"] == "cancelled"


def test_check_model_traces_only_when_asked(shared_worker):
    rep = shared_worker.handle("check", {"model": "mnist-cnn"}, [], OpContext("c"))[0]["shape_report"]
    assert rep["shape_stable"] is None and rep["unaudited"].startswith("not asked (shape_audit: true")
    with pytest.raises(Exception, match="shape_audit must be true or false"):
        shared_worker.handle("check", {"model": "mnist-cnn", "shape_audit": "yes"}, [], OpContext("c"))
    traced = shared_worker.handle("check", {"model": "tiny-gpt2", "shape_audit": True}, [], OpContext("c"))[0]
    assert traced["shape_report"]["shape_stable"] is True and traced["shape_report"]["graphs"] == 1


def test_check_model_says_a_forward_with_item_is_not_shape_stable(worker):
    worker.handle("load", {"model": "mnist-cnn"}, [], OpContext("l"))
    a = worker.served["mnist-cnn"].adapter
    model = ItemCNN()
    model.load_state_dict(a.eager_model.state_dict())
    a.eager_model = a.model = model.eval()
    r = worker.handle("check", {"model": "mnist-cnn", "batch": 3, "shape_audit": True}, [], OpContext("c"))[0]
    rep = r["shape_report"]
    assert r["verdict"] == "supported" and rep["shape_stable"] is False  # runs everywhere, but not as one graph
    assert rep["shapes"] == [[4, 0]] and rep["graphs"] == 2
    (b,) = rep["breaks"]
    assert b["kind"] == "item_call" and "item()" in b["reason"] and "in forward" in b["where"]


def test_no_trace_while_a_compiled_model_is_served(worker, monkeypatch):
    # (A trace would reset dynamo: mnist-cnn's next request would compile again.)
    monkeypatch.setenv("TPU_WORKER_COMPILE_BACKEND", "eager")  # dynamo without a C++ toolchain
    worker.handle("load", {"model": "mnist-cnn", "mode": "compile"}, [], OpContext("l"))
    r = worker.handle("check", {"model": "tiny-gpt2", "shape_audit": True}, [], OpContext("c"))[0]
    rep = r["shape_report"]
    assert rep["shape_stable"] is None and "mnist-cnn is served compiled" in rep["unaudited"]
    # The compiled model kept its graphs: a request at a warmed shape compiles nothing.
    worker.handle("infer", {"model": "mnist-cnn"}, [torch.randn(2, 1, 28, 28)], OpContext("i"))
    status = worker.handle("status", {}, [], OpContext("s"))[0]
    assert next(m for m in status["loaded"] if m["model"] == "mnist-cnn")["compiles"]["recompiles_since_load"] == 0
