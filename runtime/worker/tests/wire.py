"""A minimal client for the worker protocol, used by the subprocess tests."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import struct
import subprocess
import sys
import threading
from typing import Any

import torch

from tpu_worker.protocol import FrameReader, decode_tensors, encode_frame, parse_tensor_specs

WORKER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def raw_frame(header: bytes, body: bytes = b"", *, header_len: int | None = None, body_len: int | None = None) -> bytes:
    hl = len(header) if header_len is None else header_len
    bl = len(body) if body_len is None else body_len
    return struct.pack(">II", hl, bl) + header + body


class _RawReader(FrameReader):
    """Reads worker->client frames (whose types differ from client->worker ones)."""

    def read_any(self) -> tuple[dict, list[torch.Tensor]] | None:
        prefix = self._read_exact(8)
        if prefix is None:
            return None
        hl, bl = struct.unpack(">II", prefix)
        header = json.loads(self._read_exact(hl))
        body = self._read_into(bl) if bl else bytearray()
        specs = parse_tensor_specs(header.get("tensors"), bl)
        return header, decode_tensors(specs, body)


class WorkerProcess:
    def __init__(
        self, catalog: str, *extra: str, env: dict | None = None, python: str | None = None, start_timeout: float = 60
    ) -> None:
        full_env = {**os.environ, "PYTHONPATH": WORKER_DIR, **(env or {})}
        self.proc = subprocess.Popen(
            [python or sys.executable, "-m", "tpu_worker", "--catalog", catalog, *extra],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=full_env,
        )
        self._reader = _RawReader(self.proc.stdout)
        self.messages: queue.Queue = queue.Queue()
        self.stderr_lines: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._pump_err, daemon=True).start()
        self.hello = self.next(timeout=start_timeout)[0]

    def _pump(self) -> None:
        while True:
            try:
                msg = self._reader.read_any()
            except Exception as exc:
                self.messages.put(exc)
                return
            self.messages.put(msg)
            if msg is None:
                return

    def _pump_err(self) -> None:
        for line in self.proc.stderr:
            self.stderr_lines.append(line.decode("utf-8", "replace"))

    def write(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, header: dict, tensors: list[torch.Tensor] | None = None) -> None:
        for c in encode_frame(header, tensors):
            self.proc.stdin.write(c)
        self.proc.stdin.flush()

    def next(self, timeout: float = 60) -> tuple[dict, list[torch.Tensor]]:
        msg = self.messages.get(timeout=timeout)
        if msg is None or isinstance(msg, Exception):
            raise RuntimeError(f"worker stream ended: {msg!r}; stderr tail: {''.join(self.stderr_lines[-20:])}")
        return msg

    def call(self, op: str, args: dict[str, Any] | None = None, *, id: str, tensors=None, timeout: float = 120):
        """Sends a request and returns its final message (result or error), skipping progress."""
        self.send({"type": "request", "id": id, "op": op, "args": args or {}}, tensors)
        while True:
            header, tens = self.next(timeout)
            if header.get("id") == id and header["type"] in ("result", "error"):
                return header, tens

    def close(self) -> int:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            return self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
