"""The same contract across the real process boundary: a worker subprocess and raw pipes."""

from __future__ import annotations

import signal

import pytest
import torch

from conftest import bench_args
from wire import WorkerProcess


@pytest.fixture(scope="module")
def proc(catalog_path):
    w = WorkerProcess(catalog_path, "--device", "cpu")
    yield w
    w.close()


def test_ping_is_answered_while_a_benchmark_runs_and_cancel_stops_it(proc):
    h, _ = proc.call("load", {"model": "mnist-cnn", "batching": False}, id="load-m")
    assert h["type"] == "result" and h["result"]["batching"]["enabled"] is False
    proc.send(
        {
            "type": "request",
            "id": "bench",
            "op": "benchmark",
            "args": bench_args(batch_sizes=[1, 2], duration_s=600, warmup=0),
        }
    )
    h, _ = proc.next()
    assert (h["type"], h["id"]) == ("progress", "bench") and h["total"] == 2
    proc.send({"type": "ping", "id": "hb"})
    h, _ = proc.next()
    assert (h["type"], h["id"]) == ("pong", "hb")  # answered before the benchmark finished
    proc.send({"type": "cancel", "id": "bench"})
    h, _ = proc.next()
    assert (h["type"], h["id"]) == ("result", "bench")
    assert h["result"]["cancelled"] is True and h["result"]["configs"] == []


def test_infer_tensors_travel_both_ways(proc):
    x = torch.randn(4, 1, 28, 28)
    h, tensors = proc.call("infer", {"model": "mnist-cnn"}, id="inf", tensors=[x])
    assert h["type"] == "result" and h["result"]["task"] == "tensor"
    (logits,) = tensors
    assert logits.shape == (4, 10) and logits.dtype == torch.float32 and torch.isfinite(logits).all()


def test_errors_carry_codes_and_no_paths(proc):
    h, _ = proc.call("load", {"model": "does-not-exist"}, id="bad-model")
    assert h["error"]["code"] == "unknown_model" and h["error"]["recoverable"] is True
    h, _ = proc.call("infer", {"model": "tiny-gpt2", "texts": ["x"]}, id="not-loaded")
    assert h["error"]["code"] == "model_not_loaded"
    assert "/" not in h["error"]["message"]


def test_duplicate_request_ids_in_flight_are_refused(proc):
    args = bench_args(batch_sizes=[1], duration_s=600, warmup=0)
    proc.send({"type": "request", "id": "dup", "op": "benchmark", "args": args})
    proc.send({"type": "request", "id": "dup", "op": "status", "args": {}})
    seen = []
    while len(seen) < 1 or seen[-1]["type"] == "progress":
        h, _ = proc.next()
        seen.append(h)
    assert seen[-1]["type"] == "error" and seen[-1]["error"]["code"] == "protocol_error"
    proc.send({"type": "cancel", "id": "dup"})
    while True:  # cancelled before it started -> error "cancelled"; while running -> cancelled result
        h, _ = proc.next()
        if h["type"] == "result":
            assert h["result"]["cancelled"] is True
            break
        if h["type"] == "error":
            assert h["error"]["code"] == "cancelled"
            break


def test_sigterm_exits_cleanly(catalog_path):
    w = WorkerProcess(catalog_path, "--device", "cpu")
    w.proc.send_signal(signal.SIGTERM)
    assert w.proc.wait(timeout=30) == 0


def test_forcing_an_absent_device_reports_why_and_exits_4(catalog_path):
    import subprocess
    import sys

    from wire import WORKER_DIR, _RawReader

    p = subprocess.run(
        [sys.executable, "-m", "tpu_worker", "--catalog", catalog_path, "--device", "tpu"],
        capture_output=True,
        env={"PYTHONPATH": WORKER_DIR, "PATH": "/usr/bin:/bin"},
        timeout=120,
        check=False,
    )
    assert p.returncode == 4
    import io

    header, _ = _RawReader(io.BytesIO(p.stdout)).read_any()
    assert header["type"] == "error" and header["error"]["code"] == "unsupported_device"
    assert "torch_tpu" in header["error"]["message"]


def test_stray_prints_and_native_writes_go_to_stderr_not_the_protocol():
    import subprocess
    import sys

    from wire import WORKER_DIR

    code = (
        "import os, sys\n"
        "from tpu_worker.launch import take_stdout\n"
        "proto = take_stdout()\n"
        "print('stray python print')\n"
        "os.write(1, b'native write to fd 1\\n')\n"
        "proto.write(b'FRAME')\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, env={"PYTHONPATH": WORKER_DIR}, timeout=60, check=False
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout == b"FRAME"
    assert b"stray python print" in p.stderr and b"native write to fd 1" in p.stderr


def test_status_names_the_model_libraries_imported_so_far(catalog_path):
    """A fresh worker has not imported transformers (its first text-model load pays that, which
    the server's load estimate prices); after that load its status says so."""
    w = WorkerProcess(catalog_path, "--device", "cpu")
    try:
        h, _ = w.call("status", {}, id="st0")
        assert h["result"]["libraries"] == []
        # No model built yet: the next load is this worker's first (a cold load for any model).
        assert h["result"]["models_built"] == 0
        h, _ = w.call("load", {"model": "mnist-cnn"}, id="ld0")
        assert h["type"] == "result"
        st = w.call("status", {}, id="st1")[0]["result"]
        assert st["libraries"] == [] and st["models_built"] == 1  # plain torch
        h, _ = w.call("load", {"model": "tiny-gpt2"}, id="ld1")
        assert h["type"] == "result", h
        assert w.call("status", {}, id="st2")[0]["result"]["libraries"] == ["transformers"]
    finally:
        w.close()
