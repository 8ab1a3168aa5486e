from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import struct

import pytest
import torch

from conftest import REPO, bench_args
from tpu_worker.bench.args import Bounds
from tpu_worker.errors import WorkerError
from tpu_worker.ops import OpContext
from tpu_worker.protocol import (
    DTYPES,
    MAX_HEADER_BYTES,
    TENSOR_ALIGN,
    Cancel,
    FrameReader,
    Ping,
    ProtocolError,
    Request,
    encode_frame,
)
from wire import WorkerProcess, raw_frame


def frames_bytes(*frames) -> io.BytesIO:
    return io.BytesIO(b"".join(bytes(c) for f in frames for c in f))


def test_round_trip_every_dtype_including_bfloat16():
    tensors = [
        torch.arange(6, dtype=torch.float32).reshape(2, 3) / 7,
        torch.tensor([1.5, -2.25, 3e-3], dtype=torch.bfloat16),
        torch.tensor([[0.5, 1.0]], dtype=torch.float16),
        torch.tensor([1e300], dtype=torch.float64),
        torch.tensor([-(2**40), 2**40], dtype=torch.int64),
        torch.tensor([7, -7], dtype=torch.int32),
        torch.tensor([300], dtype=torch.int16),
        torch.tensor([-3], dtype=torch.int8),
        torch.tensor([255, 0, 1], dtype=torch.uint8),
        torch.tensor([True, False, True]),
        torch.zeros((0, 4)),
        torch.tensor(3.25),  # 0-d
    ]
    frame = encode_frame({"type": "request", "id": "r1", "op": "infer", "args": {"x": 1}}, tensors)
    header = json.loads(bytes(frame[1]))
    assert all(t["offset"] % TENSOR_ALIGN == 0 for t in header["tensors"])
    msg = FrameReader(frames_bytes(frame)).read()
    assert isinstance(msg, Request) and msg.op == "infer" and msg.args == {"x": 1}
    assert len(msg.tensors) == len(tensors)
    for got, want in zip(msg.tensors, tensors, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got, want)


def test_bfloat16_bytes_are_little_endian_raw_bits():
    t = torch.tensor([1.0], dtype=torch.bfloat16)  # 0x3F80
    frame = encode_frame({"type": "result", "id": "x"}, [t])
    assert bytes(frame[-1]) == b"\x80\x3f"


def test_ping_and_cancel_parse():
    stream = frames_bytes(encode_frame({"type": "ping", "id": "p"}), encode_frame({"type": "cancel", "id": "c"}))
    r = FrameReader(stream)
    assert r.read() == Ping("p")
    assert r.read() == Cancel("c")
    assert r.read() is None


@pytest.mark.parametrize(
    ("header", "body", "fragment"),
    [
        (b"{not json", b"", "not valid JSON"),
        (b"[1,2]", b"", "JSON object"),
        (json.dumps({"type": "frobnicate", "id": "a"}).encode(), b"", "unknown message type"),
        (json.dumps({"type": "request", "id": "a"}).encode(), b"", "request.op"),
        (json.dumps({"type": "request", "op": "x"}).encode(), b"", "id must be"),
        (json.dumps({"type": "request", "id": "a", "op": "x", "args": []}).encode(), b"", "args must be"),
        (
            json.dumps(
                {
                    "type": "request",
                    "id": "a",
                    "op": "x",
                    "tensors": [{"dtype": "float32", "shape": [4], "offset": 8, "nbytes": 16}],
                }
            ).encode(),
            b"\0" * 16,
            "outside the body",
        ),
        (
            json.dumps(
                {
                    "type": "request",
                    "id": "a",
                    "op": "x",
                    "tensors": [{"dtype": "float32", "shape": [4], "offset": 0, "nbytes": 12}],
                }
            ).encode(),
            b"\0" * 16,
            "needs 16",
        ),
        (
            json.dumps(
                {
                    "type": "request",
                    "id": "a",
                    "op": "x",
                    "tensors": [{"dtype": "complex64", "shape": [1], "offset": 0, "nbytes": 8}],
                }
            ).encode(),
            b"\0" * 8,
            "dtype must be",
        ),
    ],
)
def test_malformed_frames_raise_recoverable_protocol_errors(header, body, fragment):
    good = encode_frame({"type": "ping", "id": "after"})
    reader = FrameReader(frames_bytes([raw_frame(header, body)], good))
    with pytest.raises(ProtocolError) as info:
        reader.read()
    assert fragment in info.value.message
    assert not info.value.fatal
    assert reader.read() == Ping("after")  # the stream stays in sync


def test_oversized_body_is_skipped_and_reported_with_the_id():
    header = json.dumps({"type": "request", "id": "big", "op": "infer"}).encode()
    reader = FrameReader(
        frames_bytes([raw_frame(header, b"\0" * 64)], encode_frame({"type": "ping", "id": "p"})), max_body_bytes=32
    )
    with pytest.raises(ProtocolError) as info:
        reader.read()
    assert info.value.msg_id == "big" and not info.value.fatal
    assert reader.read() == Ping("p")


def test_header_length_over_limit_is_fatal():
    reader = FrameReader(io.BytesIO(struct.pack(">II", MAX_HEADER_BYTES + 1, 0)))
    with pytest.raises(ProtocolError) as info:
        reader.read()
    assert info.value.fatal


def test_truncated_frame_is_eof():
    frame = b"".join(bytes(c) for c in encode_frame({"type": "ping", "id": "p"}))
    assert FrameReader(io.BytesIO(frame[:-3])).read() is None


def test_every_protocol_dtype_is_known():
    assert set(DTYPES) == {
        "float32",
        "float16",
        "bfloat16",
        "float64",
        "int64",
        "int32",
        "int16",
        "int8",
        "uint8",
        "bool",
    }


# -- across a real process boundary -------------------------------------------------------------


def test_worker_process_answers_malformed_frames_and_keeps_serving(catalog_path):
    w = WorkerProcess(catalog_path, "--device", "cpu", "--max-body-bytes", "4096")
    try:
        hello = w.hello
        assert hello["type"] == "hello" and hello["protocol"] == 1
        assert hello["device"]["kind"] == "cpu"
        assert [s["backend"] for s in hello["probe"]] == ["torch_tpu", "torch_xla", "cuda", "cpu"]

        w.write(raw_frame(b"{oops"))
        h, _ = w.next()
        assert h["type"] == "error" and h["id"] is None and h["error"]["code"] == "protocol_error"

        w.write(raw_frame(json.dumps({"type": "teleport", "id": "t1"}).encode()))
        h, _ = w.next()
        assert (h["id"], h["error"]["code"]) == ("t1", "protocol_error")

        bad_tensor = {
            "type": "request",
            "id": "t2",
            "op": "infer",
            "tensors": [{"dtype": "float32", "shape": [8], "offset": 0, "nbytes": 32}],
        }
        w.write(raw_frame(json.dumps(bad_tensor).encode(), b"\0" * 8))
        h, _ = w.next()
        assert (h["id"], h["error"]["code"]) == ("t2", "protocol_error")

        w.write(raw_frame(json.dumps({"type": "request", "id": "t3", "op": "status"}).encode(), b"\0" * 5000))
        h, _ = w.next()
        assert (h["id"], h["error"]["code"]) == ("t3", "protocol_error")
        assert "limit" in h["error"]["message"]

        h, _ = w.call("frobnicate", id="t4")
        assert h["error"]["code"] == "invalid_argument"

        w.send({"type": "ping", "id": "p1"})
        h, _ = w.next()
        assert h == {"type": "pong", "id": "p1", "time_s": h["time_s"]}

        h, _ = w.call("status", id="s1")
        assert h["type"] == "result" and h["result"]["device"]["kind"] == "cpu"
        h, _ = w.call("shutdown", id="bye")
        assert h == {"type": "result", "id": "bye", "result": {}}
        assert w.close() == 0
    finally:
        w.close()
    # stdout carried only frames: every stray line went to stderr as JSON
    assert any('"worker ready"' in line for line in w.stderr_lines)


def test_worker_exits_3_when_framing_is_lost(catalog_path):
    w = WorkerProcess(catalog_path, "--device", "cpu")
    w.write(struct.pack(">II", 0, 0))
    h, _ = w.next()
    assert h["error"]["code"] == "protocol_error" and h["error"]["recoverable"] is False
    assert w.proc.wait(timeout=30) == 3


def test_worker_exits_cleanly_on_eof(catalog_path):
    w = WorkerProcess(catalog_path, "--device", "cpu")
    assert w.close() == 0


def _benchmark_spec() -> tuple[list[str], set[str]]:
    """The `benchmark` op's argument names and its `limits` fields, as runtime/PROTOCOL.md lists them."""
    with open(os.path.join(REPO, "runtime", "PROTOCOL.md"), encoding="utf-8") as fh:
        text = fh.read()
    args = re.search(r"- `benchmark` args `\{([^}]*)\}`", text)
    limits = re.search(r"`limits` `\{([^}]*)\}`", text)
    assert args and limits, "PROTOCOL.md no longer describes the benchmark op's args and limits"
    return [a.strip() for a in args.group(1).split(",")], {n.strip() for n in limits.group(1).split(",")}


def test_the_benchmark_bounds_are_the_ones_protocol_md_lists():
    _, limits = _benchmark_spec()
    assert limits == {f.name for f in dataclasses.fields(Bounds)}


def test_every_benchmark_arg_protocol_md_requires_is_refused_when_missing(shared_worker):
    """The server sends the request fully resolved; the worker fills in nothing (PROTOCOL.md)."""
    names, _ = _benchmark_spec()
    required = [n for n in names if not n.endswith("?") and n != "model"]
    assert {"batch_sizes", "dtypes", "modes", "scenario", "work", "warmup", "limits"} <= set(required)
    for name in required:
        with pytest.raises(WorkerError, match=rf"args\.{name} is required") as info:
            shared_worker.handle("benchmark", bench_args(**{name: None}), [], OpContext(name))
        assert info.value.code == "invalid_argument"
