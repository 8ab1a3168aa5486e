"""check_model's fallback and failed-op accounting, with a placement that can be simulated.

On the CPU every op counts as on device, so the CPU tests cannot catch a wrong count. Here the
target is the `meta` device: ops whose results stay on it count as on device, ops that come back
on the host count as fallbacks, ops that raise count as failed."""

from __future__ import annotations

import pytest
import torch

from tpu_worker.check import OpRecorder


class _Op:
    """Stands in for an OpOverload: a name and a call."""

    def __init__(self, name, fn):
        self._name = name
        self._fn = fn

    def name(self):
        return self._name

    def __call__(self, *args, **kwargs):
        return self._fn(*args, **kwargs)


def _row(rec: OpRecorder, op: str) -> dict:
    return next(r for r in rec.table() if r["op"] == op)


def test_counts_device_host_and_failed_calls_per_op():
    rec = OpRecorder(torch.device("meta"))
    x = torch.ones(4, 4, device="meta")
    stays = _Op("sim::stays", lambda t: t * 2)
    host = _Op("sim::host", lambda t: torch.zeros(t.shape))  # result comes back on the CPU
    broken = _Op("sim::broken", lambda t: (_ for _ in ()).throw(RuntimeError("no kernel")))

    for _ in range(3):
        rec.__torch_dispatch__(stays, (), (x,))
    for _ in range(2):
        rec.__torch_dispatch__(host, (), (x,))
    rec.__torch_dispatch__(stays, (), (x,))
    with pytest.raises(RuntimeError):
        rec.__torch_dispatch__(broken, (), (x,))

    s = _row(rec, "sim::stays")
    assert (s["count"], s["on_device"], s["fell_back"], s["failed"]) == (4, 4, 0, 0)
    h = _row(rec, "sim::host")
    assert (h["count"], h["on_device"], h["fell_back"], h["failed"]) == (2, 0, 2, 0)
    b = _row(rec, "sim::broken")
    assert (b["count"], b["on_device"], b["fell_back"], b["failed"]) == (1, 0, 0, 1)
    # Failed first, then fallbacks: the table puts what needs attention on top.
    assert [r["op"] for r in rec.table()][:2] == ["sim::broken", "sim::host"]


def test_real_dispatch_on_a_simulated_device():
    """The recorder as a real dispatch mode: meta ops count on device, host ops as fallbacks."""
    with OpRecorder(torch.device("meta")) as rec:
        x = torch.ones(2, 3, device="meta")
        y = (x * 2).sum()
        z = torch.ones(3)  # created on the host while the target is meta
        _ = z + 1
    assert y.device.type == "meta"
    rows = {r["op"]: r for r in rec.table()}
    on_meta = [r for op, r in rows.items() if op.startswith(("aten::mul", "aten::sum"))]
    assert on_meta and all(r["on_device"] == r["count"] and r["fell_back"] == 0 for r in on_meta)
    add = rows["aten::add.Tensor"]
    assert (add["count"], add["on_device"], add["fell_back"]) == (1, 0, 1)
    assert sum(r["fell_back"] for r in rows.values()) >= 2  # the host ones(3) and the host add


def test_a_cancelled_check_stops_at_the_next_op():
    """The server stops a check when the caller's read allowance runs out: the forward must end
    at the next op, not run to its end (a float16 forward on a CPU can take minutes)."""
    from tpu_worker.cancel import CancelToken
    from tpu_worker.errors import Cancelled

    token = CancelToken()
    ran = []
    with OpRecorder(torch.device("cpu"), token) as rec:
        x = torch.ones(2, 3)
        ran.append(x * 2)
        token.cancel()
        with pytest.raises(Cancelled):
            _ = x + 1
    assert len(ran) == 1
    assert "aten::add.Tensor" not in {r["op"] for r in rec.table()}
