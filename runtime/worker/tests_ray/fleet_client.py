"""Test helpers: the fleet driver as a subprocess, and a TLS + token client for an actor's serve."""

from __future__ import annotations

import json
import os
import queue
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
import uuid

_PREFIX = struct.Struct(">II")


class Driver:
    def __init__(self, config: dict, tmp) -> None:
        path = tmp / f"fleet-{uuid.uuid4().hex[:8]}.json"
        path.write_text(json.dumps(config))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tpu_worker.fleet", "--config", str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(os.environ),
        )
        self.messages: queue.Queue = queue.Queue()
        self.backlog: list[dict] = []  # messages read while waiting for another type
        self.log: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._pump_err, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.messages.put(json.loads(line))
        self.messages.put(None)

    def _pump_err(self) -> None:
        for line in self.proc.stderr:
            self.log.append(line.decode("utf-8", "replace"))

    def next(self, types: tuple[str, ...] | None = None, timeout: float = 120) -> dict:
        for i, msg in enumerate(self.backlog):
            if types is None or msg["type"] in types:
                return self.backlog.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {types} message from the driver in {timeout}s; log tail: {self.log[-20:]}")
            try:
                msg = self.messages.get(timeout=left)
            except queue.Empty:
                continue
            if msg is None:
                raise AssertionError(f"the driver exited ({self.proc.wait()}); log tail: {''.join(self.log[-30:])}")
            if types is None or msg["type"] in types:
                return msg
            self.backlog.append(msg)

    def send(self, msg: dict) -> None:
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()

    def request(self, op: str, **args) -> dict:
        rid = uuid.uuid4().hex[:8]
        self.send({"op": op, "id": rid, **args})
        while True:
            msg = self.next(("reply",))
            if msg["id"] == rid:
                return msg
            self.backlog.append(msg)

    def stop(self) -> int:
        if self.proc.poll() is None:
            try:
                self.send({"op": "stop"})
                self.proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass
            try:
                return self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


def _frame(header: dict, body: bytes = b"") -> bytes:
    h = json.dumps(header).encode()
    return _PREFIX.pack(len(h), len(body)) + h + body


HANG_GUARD_S = 300


class ServeClient:
    """Connects to one actor's serve: verifies exactly the certificate the driver reported."""

    def __init__(self, endpoint: dict, channel: dict, *, token: str | None = None, client_cert: bool = True) -> None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_verify_locations(cadata=endpoint["certificate"])
        if client_cert:
            ctx.load_cert_chain(channel["cert"], channel["key"])
        # A hang guard, not a time limit: the first connection starts the actor's worker (torch
        # import, device probe), and its hello took over 60 s beside four CPU burners at load 7.
        raw = socket.create_connection((endpoint["host"], endpoint["port"]), timeout=HANG_GUARD_S)
        self.sock = ctx.wrap_socket(raw, server_hostname=endpoint["host"])
        if token is None:
            with open(channel["token_file"], encoding="utf-8") as fh:
                token = fh.read().strip()
        self.sock.sendall(_frame({"type": "auth", "token": token}))

    def _read_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("serve closed the connection")
            buf += chunk
        return bytes(buf)

    def read(self) -> tuple[dict, bytes]:
        hl, bl = _PREFIX.unpack(self._read_exact(_PREFIX.size))
        header = json.loads(self._read_exact(hl))
        return header, self._read_exact(bl) if bl else b""

    def call(self, op: str, args: dict) -> dict:
        rid = uuid.uuid4().hex
        self.sock.sendall(_frame({"type": "request", "id": rid, "op": op, "args": args}))
        while True:
            header, _ = self.read()
            if header.get("id") == rid and header["type"] in ("result", "error"):
                return header

    def close(self) -> None:
        self.sock.close()
