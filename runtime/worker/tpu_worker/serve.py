"""`python -m tpu_worker serve`: the worker over TCP with mutual TLS, for a control plane elsewhere.

    python -m tpu_worker serve --listen 10.0.0.5:7900 --tls-cert worker.crt --tls-key worker.key \
        --client-ca ca.crt --token-file token --catalog catalog.json [--device tpu:0] [--threads N]

What it accepts, in order:
1. a TLS handshake whose client certificate is signed by `--client-ca` (anything else fails the
   handshake: no byte of ours is read from such a peer) and carries the extended key usage
   clientAuth (see `is_control_plane_cert`: a worker's own serverAuth certificate is refused with
   an `unauthorized` error frame before any token is read);
2. exactly one first frame `{"type": "auth", "token": "..."}` with an empty body, within
   AUTH_TIMEOUT_S, the token compared in constant time with the token file's content; answered
   by one frame `{"type": "auth_ok", "shared": true, "max_control_planes": N}`, or an `error`
   frame (id null, code `unauthorized`, or `busy` when N control planes are connected) and the
   connection closed; a peer that stalls in the middle of it is refused the same way;
3. then the worker protocol (runtime/PROTOCOL.md) with the shared worker, as below.

One worker process (`python -m tpu_worker ...`, the pipe worker unchanged) serves every
connection: it starts with the first control plane to connect and lives on when they leave, so
what is loaded stays loaded for the next one. Up to `--max-control-planes` (default 8)
authenticated control planes (tpu-mcp replicas) are served at once; one more is told `busy` and
closed. The relay (`Relay`) reads every frame whole, decodes only JSON headers (tensor bodies stay
raw bytes) and keeps the protocol per connection:
- request ids are rewritten to the relay's own on the way in and restored on every answer
  (progress and its deltas, result, error, pong), so replicas may reuse each other's ids; a
  `cancel` reaches only its sender's request; pings go through to the worker (a hung worker still
  misses its heartbeats);
- each connection gets the worker's hello (cached, replayed) first, then a `fleet` frame per model
  loaded through the relay; a load or unload that succeeds is told to every other connection;
- a control plane's `shutdown` is answered here and ends its own connection; its EOF or
  disconnect cancels its own requests in flight, never the others', and never ends the worker;
- an `error` frame with id null that answers nobody goes to every connection;
- a frame whose body is over the worker's `--max-body-bytes` closes that connection (a pipe
  worker skips such a body; over the network that means reading up to 4 GiB for nothing); so does
  a header over MAX_HEADER_BYTES as the worker would read it (re-encoded), with an error frame;
- requests wait in the relay, a queue per connection, and go to the worker one connection at a
  time in turn within WORKER_WINDOW (PLANE_WINDOW per connection), so one connection's backlog
  does not hold another's next call; over `--max-queued` waiting, the connection is closed;
- a connection with nothing in flight that sends nothing for `--idle-timeout-s` is closed, so a
  silent control plane gives its slot back;
- a control plane that stops reading (SLOW_PEER_BYTES queued for it) is disconnected rather than
  let it hold the worker's answers to the others.
When the worker exits, every connection is closed (the control planes see a worker exit and
reconnect), and the next connection starts a fresh worker with nothing loaded. The relay is one
asyncio loop, so the TLS objects are never touched by two threads at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import json
import os
import signal
import ssl
import stat
import struct
import sys
from collections import deque

from . import logs

AUTH_TIMEOUT_S = 10.0
AUTH_MAX_HEADER = 4096
MIN_TOKEN_CHARS = 16
MAX_HEADER_BYTES = 16 * 1024 * 1024  # the worker's own bound (protocol.py)
MAX_ID_CHARS = 256
DEFAULT_MAX_CONTROL_PLANES = 8
# Unsent bytes queued for one control plane past which it is disconnected: a peer that stops
# reading must not hold the worker's answers to the others (they are not waited for).
SLOW_PEER_BYTES = 256 * 1024 * 1024
WORKER_EXIT_GRACE_S = 5.0
# Requests of the relay in the worker at once: its op pool's threads (server.py), so none waits in
# the worker's own first-come queue, where one control plane's backlog would hold the others'.
WORKER_WINDOW = 128
# One control plane's share of them (enough for a batcher's 32 and more): its long calls never
# take every thread.
PLANE_WINDOW = 64
# Requests one control plane may have waiting in the relay; one more and it is disconnected.
DEFAULT_MAX_QUEUED = 1024
# A control plane with nothing in flight that sends nothing (not even a heartbeat ping) for this
# long gives its slot back.
DEFAULT_IDLE_TIMEOUT_S = 300.0
_PREFIX = struct.Struct(">II")
DEFAULT_MAX_BODY_BYTES = 1024**3  # the worker's default --max-body-bytes

# DER encodings (with tag and length) of the OIDs the control-plane check needs.
_OID_EXT_KEY_USAGE = bytes.fromhex("0603551d25")  # 2.5.29.37
_OID_CLIENT_AUTH = bytes.fromhex("06082b06010505070302")  # 1.3.6.1.5.5.7.3.2


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(
        prog="python -m tpu_worker serve",
        description="serve the tpu-mcp worker over TCP with mutual TLS and a token",
        epilog="Other options (--catalog, --device, --threads, --max-body-bytes, ...) go to the worker.",
    )
    p.add_argument("--listen", required=True, help="HOST:PORT to bind (a specific address; port 0 picks one)")
    p.add_argument("--tls-cert", required=True, help="this worker's certificate (PEM)")
    p.add_argument("--tls-key", required=True, help="this worker's private key (PEM)")
    p.add_argument("--client-ca", required=True, help="CA (PEM) that must have signed the control plane's certificate")
    p.add_argument("--token-file", required=True, help="file holding the shared token (first line)")
    p.add_argument(
        "--max-control-planes",
        type=int,
        default=DEFAULT_MAX_CONTROL_PLANES,
        help=f"control planes served at once; one more is told busy (default {DEFAULT_MAX_CONTROL_PLANES})",
    )
    p.add_argument(
        "--max-queued",
        type=int,
        default=DEFAULT_MAX_QUEUED,
        help=f"requests one control plane may have waiting for the worker; one more disconnects it "
        f"(default {DEFAULT_MAX_QUEUED})",
    )
    p.add_argument(
        "--idle-timeout-s",
        type=float,
        default=DEFAULT_IDLE_TIMEOUT_S,
        help="a control plane silent this long with nothing in flight is disconnected "
        f"(default {DEFAULT_IDLE_TIMEOUT_S:g})",
    )
    args, rest = p.parse_known_args(argv)
    if args.max_control_planes < 1:
        p.error("--max-control-planes must be at least 1")
    if args.max_queued < 1:
        p.error("--max-queued must be at least 1")
    if not args.idle_timeout_s > 0:
        p.error("--idle-timeout-s must be above 0 (heartbeats come every few seconds)")
    if "--catalog" not in rest:
        p.error("--catalog FILE is required (it is passed to the worker)")
    return args, rest


def split_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"--listen {listen!r}: use HOST:PORT, e.g. 10.0.0.5:7900 or 127.0.0.1:0")
    return host, int(port)


def read_token(path: str) -> str:
    st = os.stat(path)
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        logs.warn("token file is readable by group or others; chmod 600 it", path=path)
    with open(path, encoding="utf-8") as f:
        token = f.readline().strip()
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(f"token file {path}: the token must be at least {MIN_TOKEN_CHARS} characters")
    return token


def _der_items(data: bytes) -> list[tuple[int, bytes, bytes]]:
    """Splits DER content into (tag, whole TLV, value); raises ValueError on malformed input."""
    out, i = [], 0
    while i < len(data):
        if i + 2 > len(data):
            raise ValueError("truncated DER")
        tag, n, j = data[i], data[i + 1], i + 2
        if n & 0x80:
            k = n & 0x7F
            if not 0 < k <= 4 or j + k > len(data):
                raise ValueError("bad DER length")
            n, j = int.from_bytes(data[j : j + k], "big"), j + k
        if j + n > len(data):
            raise ValueError("truncated DER")
        out.append((tag, data[i : j + n], data[j : j + n]))
        i = j + n
    return out


def is_control_plane_cert(der: bytes) -> bool:
    """True when the certificate's extended key usage is present and includes clientAuth.

    Why EKU and not a pinned certificate: every worker of a fleet shares one CA with the control
    plane, so "signed by --client-ca" alone lets any worker's own certificate (whose key sits on
    that worker's host) act as the control plane of every other worker, or lock it out with
    `busy`. Requiring clientAuth separates the two roles with the standard X.509 mechanism and
    needs no per-worker setting to change when the control plane's certificate is renewed;
    workers' certificates carry serverAuth only (README: "Certificates"). A certificate without
    any EKU is valid for every purpose, so it is refused too. OpenSSL already refuses, in the
    handshake, a client certificate whose EKU lacks clientAuth; this check closes the no-EKU case.
    """
    try:
        (_, _, cert), *_ = _der_items(der)
        (_, _, tbs), *_ = _der_items(cert)
        for tag, _, value in _der_items(tbs):
            if tag != 0xA3:  # [3] extensions
                continue
            (_, _, exts), *_ = _der_items(value)
            for _, _, ext in _der_items(exts):
                parts = _der_items(ext)
                if parts[0][1] == _OID_EXT_KEY_USAGE:
                    (_, _, usages), *_ = _der_items(parts[-1][2])
                    return any(whole == _OID_CLIENT_AUTH for _, whole, _ in _der_items(usages))
    except (ValueError, IndexError):
        return False
    return False


def max_body_bytes(worker_args: list[str]) -> int:
    """The worker's --max-body-bytes as the worker will parse it (last one wins)."""
    limit = DEFAULT_MAX_BODY_BYTES
    for i, a in enumerate(worker_args):
        if a == "--max-body-bytes" and i + 1 < len(worker_args) and worker_args[i + 1].isdigit():
            limit = int(worker_args[i + 1])
        elif a.startswith("--max-body-bytes=") and a.split("=", 1)[1].isdigit():
            limit = int(a.split("=", 1)[1])
    return limit


def tls_context(cert: str, key: str, client_ca: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    ctx.load_verify_locations(cafile=client_ca)
    ctx.verify_mode = ssl.CERT_REQUIRED  # no CA-signed client certificate, no connection
    return ctx


def encode_header(header: dict) -> bytes:
    """A header as the worker writes one (ASCII JSON: a non-ASCII character takes up to 6 bytes)."""
    return json.dumps(header, separators=(",", ":")).encode()


def frame(header: dict, body: bytes = b"") -> bytes:
    raw = encode_header(header)
    return _PREFIX.pack(len(raw), len(body)) + raw + body


def error_frame(code: str, message: str, msg_id: str | None = None) -> bytes:
    return frame({"type": "error", "id": msg_id, "error": {"code": code, "message": message, "recoverable": False}})


def ok_frame(max_control_planes: int) -> bytes:
    return frame({"type": "auth_ok", "shared": True, "max_control_planes": max_control_planes})


class Conn:
    """One authenticated control plane: its number, its stream, and its requests in flight."""

    def __init__(self, no: int, writer: asyncio.StreamWriter, who: dict) -> None:
        self.no = no
        self.writer = writer
        self.who = who
        self.live = False  # hello and the fleet's models were sent: frames for it flow
        self.inflight: dict[str, str] = {}  # its request id -> the relay's id for the worker
        self.done = asyncio.Event()  # set when the relay ends this connection
        # Its requests waiting for the worker, in order: (relay id, header, body).
        self.queue: deque[tuple[str, bytes, bytes]] = deque()
        self.queued_bytes = 0
        self.room = asyncio.Event()  # set when its queue shrinks (the reader waits on it)
        self.running = 0  # its requests in the worker
        self.last_active = asyncio.get_running_loop().time()  # its last frame, or its last answer


class Route:
    """Where the worker's answers to one relay id go, and what the request was (for loads)."""

    __slots__ = ("args", "conn", "counted", "op", "orig")

    def __init__(self, conn: int, orig: str, op: str, args: dict) -> None:
        self.conn, self.orig, self.op, self.args = conn, orig, op, args
        self.counted = False  # sent to the worker through the window (WORKER_WINDOW, PLANE_WINDOW)


class Worker:
    """The one worker process every connection shares, with its hello once it has sent it."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.hello: bytes | None = None
        self.startup_error: bytes | None = None  # an `error` frame with id null before hello
        self.gone = False
        self.stdin_lock = asyncio.Lock()
        self.pump: asyncio.Task | None = None


class Relay:
    """Serves one shared worker process to up to `max_control_planes` control planes at once.

    Every frame is read whole (header decoded, body kept as raw bytes) and written whole, so
    frames of different connections never interleave. A request's id is replaced by one of the
    relay's own (`<connection>.<n>`) on its way to the worker and restored on every answer
    (progress, result, error, pong), so two control planes may use the same ids; a cancel
    reaches only the sender's own request. What a control plane may not do to the others: its
    `shutdown` is answered here and ends only its connection; its EOF or disconnect cancels its
    own requests in flight. The relay remembers the models loaded and unloaded through it and
    tells every other connection (`fleet` frames), and each new one after the replayed hello."""

    def __init__(
        self,
        token: str,
        worker_cmd: list[str],
        body_limit: int = DEFAULT_MAX_BODY_BYTES,
        max_control_planes: int = DEFAULT_MAX_CONTROL_PLANES,
        max_queued: int = DEFAULT_MAX_QUEUED,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
    ) -> None:
        self._token = token.encode()
        self._worker_cmd = worker_cmd
        self._body_limit = body_limit
        self.max_control_planes = max_control_planes
        self.max_queued = max_queued
        self.idle_timeout_s = idle_timeout_s
        # Connections with requests waiting, in turn: each is served one request, then goes last.
        self._turns: deque[int] = deque()
        self._in_worker = 0  # requests (not pings) the relay has in the worker
        self.conns: dict[int, Conn] = {}
        self.routes: dict[str, Route] = {}
        # Models loaded through this relay in the current worker process: {model: {args, result}}.
        self.models: dict[str, dict] = {}
        self.sessions = 0  # connections served since start
        self.worker: Worker | None = None
        self.worker_starts = 0
        self._seq = 0
        self._spawn_lock = asyncio.Lock()

    # -- connections --------------------------------------------------------------------------
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        cert = writer.get_extra_info("peercert") or {}
        subject = ", ".join("=".join(x) for rdn in cert.get("subject", ()) for x in rdn)
        who = {"peer": f"{peer[0]}:{peer[1]}" if peer else "?", "client_cert": subject}
        conn: Conn | None = None
        try:
            ssl_object = writer.get_extra_info("ssl_object")
            der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
            if not der or not is_control_plane_cert(der):
                logs.warn("refused a client certificate without extended key usage clientAuth", **who)
                writer.write(
                    error_frame(
                        "unauthorized",
                        "the worker refused the connection: the client certificate is not a control-plane "
                        "certificate (it needs extended key usage clientAuth; workers' certificates have serverAuth)",
                    )
                )
                await asyncio.wait_for(writer.drain(), AUTH_TIMEOUT_S)
                return
            # Authenticate first: an unauthenticated peer learns nothing, not even that we are busy.
            if not await self._authenticate(reader, writer, who):
                return
            if len(self.conns) >= self.max_control_planes:
                logs.warn("refused a control plane: every slot is taken", max_control_planes=self.max_control_planes,
                          **who)  # fmt: skip
                writer.write(
                    error_frame(
                        "busy",
                        f"this worker already serves {self.max_control_planes} control planes (--max-control-planes); "
                        "retry later",
                    )
                )
                await asyncio.wait_for(writer.drain(), AUTH_TIMEOUT_S)
                return
            self.sessions += 1
            conn = Conn(self.sessions, writer, who)
            self.conns[conn.no] = conn
            writer.write(ok_frame(self.max_control_planes))
            await self._serve(conn, reader)
        except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError, TimeoutError) as exc:
            logs.info("connection ended", error=f"{type(exc).__name__}: {exc}", **who)
        finally:
            if conn is not None:
                self._drop(conn)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _authenticate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, who: dict) -> bool:
        async def refuse(reason: str) -> bool:
            logs.warn("refused a client", reason=reason, **who)
            writer.write(error_frame("unauthorized", f"the worker refused the connection: {reason}"))
            # A peer that does not read its refusal must not hold the handler either.
            await asyncio.wait_for(writer.drain(), AUTH_TIMEOUT_S)
            return False

        async def read_frame() -> tuple[int, int, bytes | None]:
            header_len, body_len = _PREFIX.unpack(await reader.readexactly(_PREFIX.size))
            if not 0 < header_len <= AUTH_MAX_HEADER or body_len != 0:
                return header_len, body_len, None
            return header_len, body_len, await reader.readexactly(header_len)

        # One deadline for the whole frame: a peer that stalls after the prefix (or mid-header)
        # is refused and closed like one that sends nothing.
        try:
            _, _, raw = await asyncio.wait_for(read_frame(), AUTH_TIMEOUT_S)
        except TimeoutError:
            return await refuse("no complete auth frame in time")
        if raw is None:
            return await refuse("the first frame must be a small auth frame without body")
        try:
            header = json.loads(raw)
        except ValueError:
            return await refuse("the auth frame is not JSON")
        if not isinstance(header, dict) or header.get("type") != "auth" or not isinstance(header.get("token"), str):
            return await refuse("the first frame must be {type: auth, token}")
        if not hmac.compare_digest(header["token"].encode(), self._token):
            return await refuse("wrong token")
        return True

    async def _serve(self, conn: Conn, reader: asyncio.StreamReader) -> None:
        try:
            w = await self._ensure_worker()
        except OSError as exc:
            logs.error("could not start the worker", error=str(exc), **conn.who)
            conn.writer.write(error_frame("internal", "the worker process could not be started; see the worker log"))
            return
        logs.info("control plane connected", connection=conn.no, control_planes=len(self.conns),
                  worker_pid=w.proc.pid, **conn.who)  # fmt: skip
        if w.hello is not None:
            self._go_live(conn, w)  # else the pump does it when the hello arrives
        upstream = asyncio.create_task(self._upstream(conn, reader))
        ended = asyncio.create_task(conn.done.wait())
        idle = asyncio.create_task(self._idle_watch(conn))
        try:
            await asyncio.wait((upstream, ended, idle), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (upstream, ended, idle):
                t.cancel()
            await asyncio.gather(upstream, ended, idle, return_exceptions=True)
            if not upstream.cancelled() and upstream.exception() is not None:
                exc = upstream.exception()
                logs.info("connection ended", error=f"{type(exc).__name__}: {exc}", **conn.who)
        logs.info("control plane disconnected", connection=conn.no, requests_cancelled=len(conn.inflight), **conn.who)

    def _go_live(self, conn: Conn, w: Worker) -> None:
        """The worker's hello, then one `fleet` load frame per model it holds: the connection's
        first frames, written in one turn so that nothing of the worker's comes in between."""
        assert w.hello is not None
        conn.writer.write(w.hello)
        for model, m in self.models.items():
            conn.writer.write(frame({"type": "fleet", "op": "load", "model": model, **m}))
        conn.live = True
        conn.last_active = asyncio.get_running_loop().time()  # idle from here, not from the worker's start

    async def _idle_watch(self, conn: Conn) -> None:
        """Ends a connection that is live, has nothing in flight and sent nothing for
        `idle_timeout_s`: a silent control plane must not keep one of the slots forever."""
        loop = asyncio.get_running_loop()
        while True:
            left = conn.last_active + self.idle_timeout_s - loop.time()
            if left <= 0 and conn.live and not conn.inflight:
                logs.warn("disconnected an idle control plane", connection=conn.no, idle_timeout_s=self.idle_timeout_s,
                          **conn.who)  # fmt: skip
                why = f"no frame for {self.idle_timeout_s:g} s and nothing in flight"
                self._send(conn, error_frame("idle", f"{why}: the relay gave this control plane's slot back; "
                                             "reconnect to go on"))  # fmt: skip
                conn.done.set()
                return
            await asyncio.sleep(left if left > 0 else self.idle_timeout_s)

    async def _upstream(self, conn: Conn, reader: asyncio.StreamReader) -> None:
        """Frames from one control plane: each read whole, then relayed (or answered here)."""
        while True:
            try:
                prefix = await reader.readexactly(_PREFIX.size)
            except asyncio.IncompleteReadError as exc:
                if exc.partial:
                    logs.warn("connection closed mid-frame", **conn.who)
                return  # EOF: the control plane is done
            header_len, body_len = _PREFIX.unpack(prefix)
            if body_len > self._body_limit:
                # A pipe worker would skip (read) the body; over the network that is up to 4 GiB.
                logs.warn("closed the connection: a frame body is over the limit", body_len=body_len,
                          limit=self._body_limit, **conn.who)  # fmt: skip
                return
            if not 0 < header_len <= MAX_HEADER_BYTES:
                # The stream cannot be followed past a header length it refuses.
                logs.warn("closed the connection: a header length is out of range", header_len=header_len, **conn.who)
                conn.writer.write(
                    error_frame("protocol_error", f"header length {header_len} is outside 1..{MAX_HEADER_BYTES}")
                )
                return
            raw = await reader.readexactly(header_len)
            body = await reader.readexactly(body_len) if body_len else b""
            conn.last_active = asyncio.get_running_loop().time()
            w = self.worker
            if w is None or w.gone:
                return  # the worker died: _worker_gone ends this connection
            if self._from_conn(conn, w, raw, body):
                async with w.stdin_lock:  # one drain at a time on the shared pipe
                    with contextlib.suppress(ConnectionError):
                        await w.proc.stdin.drain()
            # What waits for the worker stays bounded: past a body's limit, this connection is not
            # read until its queue shrinks (its own sends wait; the others' do not).
            while conn.queued_bytes > self._body_limit and not conn.done.is_set():
                conn.room.clear()
                await conn.room.wait()
            if conn.done.is_set():
                return

    def _from_conn(self, conn: Conn, w: Worker, raw: bytes, body: bytes) -> bool:
        """Relays (or answers) one frame of a control plane; True when something went to the worker."""
        try:
            header = json.loads(raw)
        except (UnicodeDecodeError, ValueError):
            header = None
        if not isinstance(header, dict):
            self._send(conn, error_frame("protocol_error", "header is not a JSON object"))
            return False
        kind, mid = header.get("type"), header.get("id")
        if kind not in ("request", "cancel", "ping"):
            self._send(conn, error_frame("protocol_error", f"unknown message type {kind!r}; expected request, "
                                         "cancel or ping", mid if isinstance(mid, str) else None))  # fmt: skip
            return False
        if not isinstance(mid, str) or not mid or len(mid) > MAX_ID_CHARS:
            self._send(conn, error_frame("protocol_error", f"{kind}.id must be a non-empty string of at most "
                                         f"{MAX_ID_CHARS} characters"))  # fmt: skip
            return False
        if kind == "cancel":
            rid = conn.inflight.get(mid)
            if rid is None:
                return False  # not one of this connection's requests (or already over): no reply
            header["id"] = rid
            # One still waiting here goes to the worker now, its cancel right behind it: the worker
            # answers it as it answers any cancelled request (a benchmark's partial result included).
            sent = self._send_queued(conn, w, rid)
            return self._to_worker(w, encode_header(header), body) or sent
        if kind == "request" and mid in conn.inflight:
            self._send(conn, error_frame("protocol_error", f"request id {mid!r} is already in flight", mid))
            return False
        op = header.get("op")
        if kind == "request" and op == "shutdown":
            # The worker is shared: a control plane's shutdown ends its own connection only.
            self._send(conn, frame({"type": "result", "id": mid, "result": {}}))
            conn.done.set()
            return False
        self._seq += 1
        rid = f"{conn.no}.{self._seq}"
        header["id"] = rid
        out = encode_header(header)
        # Measured as the worker will read it: re-encoded, a header of non-ASCII text grows up to
        # threefold, and one over the worker's bound would end the worker every plane shares.
        if len(out) > MAX_HEADER_BYTES:
            return self._misbehaved(conn, mid, f"the header is {len(out)} bytes as the worker reads it (JSON with "
                                    f"\\u escapes), over {MAX_HEADER_BYTES}; send smaller headers")  # fmt: skip
        if kind == "request" and len(conn.queue) >= self.max_queued:
            return self._misbehaved(conn, mid, f"over {self.max_queued} requests wait for the worker on this "
                                    "connection (--max-queued); wait for answers before sending more")  # fmt: skip
        args = header.get("args")
        self.routes[rid] = Route(conn.no, mid, op if kind == "request" else "ping",
                                 args if op in ("load", "unload") and isinstance(args, dict) else {})  # fmt: skip
        if kind == "ping":
            return self._to_worker(w, out, body)  # heartbeats are not queued: a hung worker still misses them
        conn.inflight[mid] = rid
        conn.queue.append((rid, out, body))
        conn.queued_bytes += len(out) + len(body)
        if conn.no not in self._turns:
            self._turns.append(conn.no)
        return self._dispatch(w)

    def _misbehaved(self, conn: Conn, mid: str, why: str) -> bool:
        """A control plane that breaks a bound the others rely on is told why and disconnected;
        nothing of the frame reaches the worker."""
        logs.warn("disconnected a control plane", reason=why, connection=conn.no, **conn.who)
        self._send(conn, error_frame("protocol_error", f"the relay closed this connection: {why}", mid))
        conn.done.set()
        return False

    def _dispatch(self, w: Worker) -> bool:
        """Sends waiting requests to the worker, one per connection in turn, while the window has
        room: one connection's backlog waits behind the others' next request, not in front of it."""
        sent = False
        while self._turns and self._in_worker < WORKER_WINDOW:
            no = self._turns.popleft()
            conn = self.conns.get(no)
            if conn is None or not conn.queue or conn.running >= PLANE_WINDOW:
                continue  # one at its share takes its turn again when one of its calls ends
            sent = self._send_queued(conn, w, conn.queue[0][0]) or sent
            if conn.queue:
                self._turns.append(no)
        return sent

    def _send_queued(self, conn: Conn, w: Worker, rid: str) -> bool:
        """Moves one of `conn`'s waiting requests to the worker, counted in the window."""
        for i, (qid, raw, body) in enumerate(conn.queue):
            if qid == rid:
                del conn.queue[i]
                conn.queued_bytes -= len(raw) + len(body)
                conn.room.set()
                route = self.routes.get(rid)
                if route is None or not self._to_worker(w, raw, body):
                    return False
                route.counted = True
                conn.running += 1
                self._in_worker += 1
                return True
        return False

    def _release(self, route: Route) -> None:
        """A counted request ended: its place in the window goes to the next in turn."""
        route.counted = False
        self._in_worker -= 1
        conn = self.conns.get(route.conn)
        if conn is not None:
            conn.running -= 1
            if conn.queue and conn.no not in self._turns:
                self._turns.append(conn.no)
        w = self.worker
        if w is not None and not w.gone:
            self._dispatch(w)

    def _to_worker(self, w: Worker, raw: bytes, body: bytes) -> bool:
        if w.gone or w.proc.stdin is None or w.proc.stdin.is_closing():
            return False
        w.proc.stdin.write(_PREFIX.pack(len(raw), len(body)) + raw)
        if body:
            w.proc.stdin.write(body)
        return True

    def _send(self, conn: Conn, data: bytes, body: bytes = b"") -> None:
        """Queues a frame for one control plane without waiting: one that stops reading is
        disconnected (SLOW_PEER_BYTES unsent) rather than let it stall the worker's answers to
        every other control plane."""
        if conn.done.is_set():
            return
        transport = conn.writer.transport
        if transport is None or transport.is_closing():
            conn.done.set()
            return
        if transport.get_write_buffer_size() > SLOW_PEER_BYTES:
            logs.warn("disconnected a control plane that stopped reading", connection=conn.no,
                      unsent_bytes=transport.get_write_buffer_size(), **conn.who)  # fmt: skip
            conn.done.set()
            return
        conn.writer.write(data)
        if body:
            conn.writer.write(body)

    def _drop(self, conn: Conn) -> None:
        """Ends a connection: its requests still running in the worker are cancelled."""
        if self.conns.pop(conn.no, None) is None:
            return
        conn.done.set()
        conn.live = False
        conn.room.set()
        # What never reached the worker is forgotten; what did is cancelled.
        for rid, _, _ in conn.queue:
            self.routes.pop(rid, None)
        conn.queue.clear()
        conn.queued_bytes = 0
        with contextlib.suppress(ValueError):
            self._turns.remove(conn.no)
        w = self.worker
        if w is not None and not w.gone:
            for rid in conn.inflight.values():
                if rid in self.routes:
                    self._to_worker(w, encode_header({"type": "cancel", "id": rid}), b"")
        # Their answers (and a load's outcome) still come back; the routes are kept until then.

    # -- the worker ---------------------------------------------------------------------------
    async def _ensure_worker(self) -> Worker:
        async with self._spawn_lock:
            if self.worker is not None and not self.worker.gone:
                return self.worker
            proc = await asyncio.create_subprocess_exec(
                *self._worker_cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=None
            )
            self.worker_starts += 1
            w = self.worker = Worker(proc)
            w.pump = asyncio.create_task(self._pump(w))
            logs.info("worker started", worker_pid=proc.pid, worker_starts=self.worker_starts)
            return w

    async def _pump(self, w: Worker) -> None:
        """The worker's frames, each to whom it belongs; when its stdout ends, it is gone."""
        stdout = w.proc.stdout
        assert stdout is not None
        try:
            while True:
                header_len, body_len = _PREFIX.unpack(await stdout.readexactly(_PREFIX.size))
                raw = await stdout.readexactly(header_len)
                body = await stdout.readexactly(body_len) if body_len else b""
                self._from_worker(w, raw, body)
        except asyncio.IncompleteReadError:
            pass
        except (ValueError, TypeError) as exc:  # a header we cannot read: the stream is lost
            logs.error("unreadable frame from the worker; stopping it", error=str(exc))
            with contextlib.suppress(ProcessLookupError):
                w.proc.kill()
        await w.proc.wait()
        self._worker_gone(w)

    def _from_worker(self, w: Worker, raw: bytes, body: bytes) -> None:
        header = json.loads(raw)
        if not isinstance(header, dict):
            raise ValueError("a worker header is not a JSON object")
        kind, mid = header.get("type"), header.get("id")
        if w.hello is None:
            if kind == "hello":
                w.hello = _PREFIX.pack(len(raw), len(body)) + raw + body
                for conn in list(self.conns.values()):
                    if not conn.live and not conn.done.is_set():
                        self._go_live(conn, w)
                return
            if kind == "error" and mid is None:  # the worker cannot start (device, catalog)
                w.startup_error = _PREFIX.pack(len(raw), len(body)) + raw + body
                return
        route = self.routes.get(mid) if isinstance(mid, str) else None
        if route is None:
            if mid is None:  # not an answer to anyone: every control plane hears it
                for conn in list(self.conns.values()):
                    if conn.live:
                        self._send(conn, _PREFIX.pack(len(raw), len(body)) + raw, body)
            else:
                logs.debug("worker frame for a request nobody waits for; dropped", id=mid, type=kind)
            return
        final = kind in ("result", "error", "pong")
        conn = self.conns.get(route.conn)
        if final:
            del self.routes[mid]
            if conn is not None and conn.inflight.get(route.orig) == mid:
                del conn.inflight[route.orig]
            if route.op in ("load", "unload") and kind in ("result", "error"):
                self._track(route, header)
            if route.counted:
                self._release(route)
        if conn is None or not conn.live:
            return  # its control plane left; a load's outcome was still tracked above
        conn.last_active = asyncio.get_running_loop().time()
        header["id"] = route.orig
        if kind == "result" and route.op == "status" and isinstance(header.get("result"), dict):
            header["result"]["relay"] = self.summary()
        out = encode_header(header)
        if len(out) > MAX_HEADER_BYTES:
            # The caller's id (up to 256 characters, escaped) may push a full header over the bound.
            if not final:
                return
            why = f"the worker's answer has a header over {MAX_HEADER_BYTES} bytes"
            out = encode_header({"type": "error", "id": route.orig,
                                 "error": {"code": "internal", "message": why, "recoverable": False}})  # fmt: skip
            body = b""
        self._send(conn, _PREFIX.pack(len(out), len(body)) + out, body)

    def _track(self, route: Route, header: dict) -> None:
        """A load or unload ended: remember what the worker holds and tell the other connections."""
        result = header.get("result") if header.get("type") == "result" else None
        code = (header.get("error") or {}).get("code") if result is None else None
        model = (result or {}).get("model", route.args.get("model"))
        if not isinstance(model, str):
            return
        if route.op == "load" and isinstance(result, dict):
            self.models[model] = {"args": route.args, "result": result}
            news = {"type": "fleet", "op": "load", "model": model, "args": route.args, "result": result}
        elif route.op == "unload" and (result is not None or code == "model_not_loaded"):
            if self.models.pop(model, None) is None and result is None:
                return
            news = {"type": "fleet", "op": "unload", "model": model}
        else:
            return
        data = frame(news)
        for conn in list(self.conns.values()):
            if conn.live and conn.no != route.conn:
                self._send(conn, data)

    def summary(self) -> dict:
        """What a `status` result adds about the relay: the worker's queues are every control plane's."""
        return {
            "control_planes": len(self.conns),
            "max_control_planes": self.max_control_planes,
            "requests_in_flight": sum(1 for r in self.routes.values() if r.op != "ping"),
            "requests_queued": sum(len(c.queue) for c in self.conns.values()),
            "models": sorted(self.models),
        }

    def _worker_gone(self, w: Worker) -> None:
        """The worker exited: every connection is closed (a worker exit, as the control planes
        see it), so each reconnects and a fresh worker starts with nothing loaded."""
        w.gone = True
        if self.worker is w:
            self.worker = None
        self.routes.clear()
        self.models.clear()
        self._in_worker = 0
        self._turns.clear()
        for conn in self.conns.values():
            conn.queue.clear()
            conn.queued_bytes = 0
            conn.running = 0
            conn.room.set()
        for conn in list(self.conns.values()):
            if not conn.live and w.startup_error is not None:
                self._send(conn, w.startup_error)
            conn.done.set()
        logs.info("worker exited; its control planes were disconnected", worker_exit=w.proc.returncode,
                  control_planes=len(self.conns))  # fmt: skip

    async def close(self) -> None:
        """Ends every connection, then the worker (EOF on its stdin, then a signal)."""
        for conn in list(self.conns.values()):
            conn.done.set()
        w = self.worker
        if w is None or w.gone:
            return
        with contextlib.suppress(Exception):
            w.proc.stdin.close()
        try:
            await asyncio.wait_for(w.proc.wait(), WORKER_EXIT_GRACE_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                w.proc.kill()
            await w.proc.wait()


async def _main(args: argparse.Namespace, worker_args: list[str]) -> int:
    host, port = split_listen(args.listen)
    token = read_token(args.token_file)
    ctx = tls_context(args.tls_cert, args.tls_key, args.client_ca)
    relay = Relay(
        token,
        [sys.executable, "-m", "tpu_worker", *worker_args],
        max_body_bytes(worker_args),
        args.max_control_planes,
        args.max_queued,
        args.idle_timeout_s,
    )
    server = await asyncio.start_server(relay.handle, host, port, ssl=ctx, ssl_handshake_timeout=AUTH_TIMEOUT_S)
    bound = server.sockets[0].getsockname()
    logs.info("listening", host=bound[0], port=bound[1], max_control_planes=args.max_control_planes,
              worker_args=" ".join(worker_args))  # fmt: skip
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for s in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(s, stop.set)
    await stop.wait()
    logs.info("stopping")
    server.close()  # no new connections; then the relay ends the ones it serves and the worker
    await relay.close()
    await server.wait_closed()
    return 0


def main(argv: list[str]) -> int:
    args, worker_args = parse_args(argv)
    logs.install_logging_bridge()
    try:
        return asyncio.run(_main(args, worker_args))
    except (ValueError, OSError, ssl.SSLError) as exc:
        logs.error("serve could not start", error=str(exc))
        print(f"tpu-mcp-worker serve: {exc}", file=sys.stderr)
        return 2
