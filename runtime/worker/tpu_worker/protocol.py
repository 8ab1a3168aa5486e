"""Framing and message validation for the Node <-> Python pipe (runtime/PROTOCOL.md).

A frame is: u32 BE header_len, u32 BE body_len, a UTF-8 JSON header, then raw tensor bytes
described by header.tensors. Tensors are little-endian and C-contiguous. Nothing is pickled.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import struct
import sys
import time
from dataclasses import dataclass, field
from typing import IO, Any

import torch

MAX_HEADER_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_BODY_BYTES = 1024 * 1024 * 1024
# Tensors the worker writes start at multiples of this, so the client can view them as typed
# arrays without copying; readers must not assume tensors are adjacent.
TENSOR_ALIGN = 8
_PREFIX = struct.Struct(">II")
_SKIP_CHUNK = 1 << 20

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}
MESSAGE_TYPES = ("request", "cancel", "ping")
CANCEL_REASONS = ("cancelled", "budget", "timeout", "approval")
_LITTLE = sys.byteorder == "little"


class ProtocolError(Exception):
    """A frame that cannot be accepted. `fatal` means the byte stream is no longer in sync."""

    def __init__(self, message: str, *, msg_id: str | None = None, fatal: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.msg_id = msg_id
        self.fatal = fatal


@dataclass(frozen=True)
class TensorSpec:
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass
class Request:
    id: str
    op: str
    args: dict[str, Any]
    tensors: list[torch.Tensor] = field(default_factory=list)
    # Per-request timestamps ([stage, monotonic µs]) when the client asked with `trace: true`;
    # returned in the reply header so a bench can decompose a call (off by default: no cost).
    trace: list | None = None
    # The W3C traceparent of the server's worker-call span, when the call is traced: the trace id
    # goes into this request's error log lines, so a log and its trace join up.
    traceparent: str | None = None


@dataclass(frozen=True)
class Cancel:
    id: str
    # "cancelled" (the caller), or "budget" / "timeout" / "approval" (past what was approved):
    # the server stopped the call.
    reason: str = "cancelled"


@dataclass(frozen=True)
class Ping:
    id: str


Message = Request | Cancel | Ping


# ---------------------------------------------------------------------------------------------
# Tensor (de)serialisation


_ITEMSIZE: dict[str, int] = {name: torch.empty((), dtype=dt).element_size() for name, dt in DTYPES.items()}


def _itemsize(dtype: str) -> int:
    return _ITEMSIZE[dtype]


def parse_tensor_specs(raw: Any, body_len: int) -> list[TensorSpec]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ValueError("header.tensors must be a list")
    specs = []
    for i, t in enumerate(raw):
        where = f"tensors[{i}]"
        if not isinstance(t, dict):
            raise ValueError(f"{where} must be an object")
        dtype = t.get("dtype")
        if dtype not in DTYPES:
            raise ValueError(f"{where}.dtype must be one of {', '.join(DTYPES)}")
        shape = t.get("shape")
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise ValueError(f"{where}.shape must be a list of non-negative integers")
        if len(shape) > 8:
            raise ValueError(f"{where}.shape has more than 8 dimensions")
        offset, nbytes = t.get("offset"), t.get("nbytes")
        if not _is_int(offset) or offset < 0 or not _is_int(nbytes) or nbytes < 0:
            raise ValueError(f"{where}.offset and .nbytes must be non-negative integers")
        expected = math.prod(shape) * _itemsize(dtype)
        if nbytes != expected:
            raise ValueError(f"{where}.nbytes is {nbytes} but shape {shape} of {dtype} needs {expected}")
        if offset + nbytes > body_len:
            raise ValueError(f"{where} lies outside the body ({offset}+{nbytes} > {body_len})")
        specs.append(TensorSpec(dtype, tuple(shape), offset, nbytes))
    return specs


def decode_tensors(specs: list[TensorSpec], body: bytearray | memoryview) -> list[torch.Tensor]:
    """Views the body as tensors. The body must be writable and not reused by the caller."""
    out = []
    for spec in specs:
        dtype = DTYPES[spec.dtype]
        if spec.nbytes == 0:
            out.append(torch.empty(spec.shape, dtype=dtype))
            continue
        raw = torch.frombuffer(body, dtype=torch.uint8, count=spec.nbytes, offset=spec.offset)
        if dtype == torch.bool:
            tensor = raw != 0  # any non-zero byte is true; never trust raw bool bit patterns
        else:
            if spec.offset % raw.element_size() == 0:
                tensor = raw.view(dtype)
            else:  # unaligned offset: copy so the typed view is legal
                tensor = raw.clone().view(dtype)
            if not _LITTLE and tensor.element_size() > 1:
                tensor = _byteswap(tensor)
        out.append(tensor.reshape(spec.shape))
    return out


def _byteswap(t: torch.Tensor) -> torch.Tensor:
    size = t.element_size()
    as_bytes = t.reshape(-1).view(torch.uint8).reshape(-1, size).flip(1).contiguous()
    return as_bytes.view(t.dtype).reshape(-1)


def encode_tensors(tensors: list[torch.Tensor]) -> tuple[list[dict], list[memoryview], int]:
    """Returns (specs, chunks, body_len); chunks include alignment padding."""
    specs: list[dict] = []
    chunks: list[memoryview] = []
    pos = 0
    for t in tensors:
        if t.dtype not in DTYPE_NAMES:
            raise ValueError(f"cannot send tensors of dtype {t.dtype}")
        pad = (-pos) % TENSOR_ALIGN
        if pad:
            chunks.append(memoryview(bytes(pad)))
            pos += pad
        cpu = t.detach().to("cpu").contiguous().reshape(-1)
        if not _LITTLE and cpu.element_size() > 1:
            cpu = _byteswap(cpu)
        data = cpu.view(torch.uint8).numpy() if cpu.numel() else None
        nbytes = cpu.numel() * cpu.element_size()
        specs.append({"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape), "offset": pos, "nbytes": nbytes})
        if data is not None:
            chunks.append(memoryview(data).cast("B"))
        pos += nbytes
    return specs, chunks, pos


def encode_frame(header: dict, tensors: list[torch.Tensor] | None = None) -> list[memoryview | bytes]:
    chunks: list[memoryview] = []
    body_len = 0
    if tensors:
        specs, chunks, body_len = encode_tensors(tensors)
        header = {**header, "tensors": specs}
    raw = json.dumps(header, separators=(",", ":"), allow_nan=False).encode("utf-8")
    if len(raw) > MAX_HEADER_BYTES:
        raise ValueError("header too large")
    return [_PREFIX.pack(len(raw), body_len), raw, *chunks]


# ---------------------------------------------------------------------------------------------
# Reading


def now_us() -> int:
    """CLOCK_MONOTONIC in µs: the same clock as Node's process.hrtime on Linux, so stamps from
    both processes can be subtracted."""
    return time.monotonic_ns() // 1000


def now_iso() -> str:
    """Wall-clock UTC to the millisecond, as every timestamp the worker reports is written."""
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class FrameReader:
    """Reads frames from a binary stream; `read()` returns None at a clean EOF."""

    def __init__(self, stream: IO[bytes], max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self._stream = stream
        self.max_body_bytes = max_body_bytes
        # When the last frame's first bytes arrived (monotonic µs), for traced requests.
        self.arrived_us = 0

    def _read_exact(self, n: int) -> bytes | None:
        buf = bytearray()
        while len(buf) < n:
            chunk = self._stream.read(n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)

    def _read_into(self, n: int) -> bytearray | None:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        readinto = getattr(self._stream, "readinto", None)
        while got < n:
            if readinto is not None:
                k = readinto(view[got:])
            else:
                chunk = self._stream.read(n - got)
                k = len(chunk) if chunk else 0
                view[got : got + k] = chunk or b""
            if not k:
                return None
            got += k
        return buf

    def _skip(self, n: int) -> bool:
        while n > 0:
            chunk = self._stream.read(min(n, _SKIP_CHUNK))
            if not chunk:
                return False
            n -= len(chunk)
        return True

    def read(self) -> Message | None:
        """Returns the next message, None at EOF, or raises ProtocolError."""
        prefix = self._read_exact(_PREFIX.size)
        if prefix is None:
            return None
        self.arrived_us = now_us()
        header_len, body_len = _PREFIX.unpack(prefix)
        if header_len == 0 or header_len > MAX_HEADER_BYTES:
            # Without a trustworthy header length the stream cannot be resynchronised.
            raise ProtocolError(f"header length {header_len} is outside 1..{MAX_HEADER_BYTES}", fatal=True)
        raw_header = self._read_exact(header_len)
        if raw_header is None:
            return None
        header, header_problem = _parse_header_json(raw_header)
        msg_id = _peek_id(header)
        if body_len > self.max_body_bytes:
            if header is None:
                # Garbage header plus an oversized body: the prefix is probably not a frame.
                raise ProtocolError(
                    f"body length {body_len} exceeds the limit of {self.max_body_bytes} bytes",
                    fatal=True,
                )
            if not self._skip(body_len):
                return None
            raise ProtocolError(
                f"body length {body_len} exceeds the limit of {self.max_body_bytes} bytes; send smaller tensors",
                msg_id=msg_id,
            )
        body = self._read_into(body_len) if body_len else bytearray()
        if body is None:
            return None
        if header is None:
            raise ProtocolError(header_problem or "bad header", msg_id=None)
        try:
            msg = parse_message(header, body)
        except ValueError as exc:
            raise ProtocolError(str(exc), msg_id=msg_id) from None
        if isinstance(msg, Request) and header.get("trace") is True:
            msg.trace = [["w.arrived", self.arrived_us], ["w.parsed", now_us()]]
            tp = header.get("traceparent")
            if isinstance(tp, str) and len(tp) <= 64:
                msg.traceparent = tp
        return msg


def _parse_header_json(raw: bytes) -> tuple[dict | None, str | None]:
    try:
        header = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return None, "header is not valid UTF-8"
    except json.JSONDecodeError as exc:
        return None, f"header is not valid JSON ({exc.msg} at position {exc.pos})"
    if not isinstance(header, dict):
        return None, "header must be a JSON object"
    return header, None


def _peek_id(header: dict | None) -> str | None:
    if header is None:
        return None
    v = header.get("id")
    return v if isinstance(v, str) else None


def parse_message(header: dict, body: bytearray) -> Message:
    """Validates a decoded header (and its body) into a typed message; raises ValueError."""
    kind = header.get("type")
    if not isinstance(kind, str):
        raise ValueError("header.type is missing; expected one of " + ", ".join(MESSAGE_TYPES))
    if kind not in MESSAGE_TYPES:
        raise ValueError(f"unknown message type {kind!r}; expected one of {', '.join(MESSAGE_TYPES)}")
    msg_id = header.get("id")
    if not isinstance(msg_id, str) or not msg_id or len(msg_id) > 256:
        raise ValueError(f"{kind}.id must be a non-empty string of at most 256 characters")
    if kind == "ping":
        return Ping(msg_id)
    if kind == "cancel":
        reason = header.get("reason", "cancelled")
        if reason not in CANCEL_REASONS:
            raise ValueError(f"cancel.reason must be one of {', '.join(CANCEL_REASONS)}")
        return Cancel(msg_id, reason)
    op = header.get("op")
    if not isinstance(op, str) or not op:
        raise ValueError("request.op must be a non-empty string")
    args = header.get("args", {})
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise ValueError("request.args must be an object")
    specs = parse_tensor_specs(header.get("tensors"), len(body))
    return Request(msg_id, op, args, decode_tensors(specs, body))
