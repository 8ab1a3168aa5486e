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
   by one frame `{"type": "auth_ok"}`, or an `error` frame (id null, code `unauthorized` or
   `busy`) and the connection closed; a peer that stalls in the middle of it is refused the same way;
3. then the ordinary worker protocol (runtime/PROTOCOL.md), byte for byte, except that a frame
   whose body is over the worker's `--max-body-bytes` closes the connection (a pipe worker skips
   such a body; over the network that means reading up to 4 GiB for nothing).

Each accepted connection gets a fresh worker process (`python -m tpu_worker ...`, the pipe worker
unchanged) whose stdin/stdout are relayed to the connection: the worker's own frame limits and
validation apply, nothing but JSON headers and raw tensor bytes is ever decoded, and a lost
connection ends that worker (its models are gone, as after a restart; the control plane reloads
them on purpose). One control plane at a time: a second connection while one is served is
told `busy` and closed. The relay is one asyncio loop, so the TLS object is never touched by two
threads at once.
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

from . import logs

AUTH_TIMEOUT_S = 10.0
AUTH_MAX_HEADER = 4096
MIN_TOKEN_CHARS = 16
RELAY_CHUNK = 1 << 20
WORKER_EXIT_GRACE_S = 5.0
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
    args, rest = p.parse_known_args(argv)
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


class FrameWatch:
    """Follows frame boundaries in the control plane's byte stream without decoding anything.

    `feed` returns the body length of the first frame over the limit, else None: the relay then
    closes the connection instead of letting the worker skip (read and drop) up to 4 GiB."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._prefix = b""
        self._skip = 0  # bytes of the current frame's header and body still to pass

    def feed(self, chunk: bytes) -> int | None:
        i = 0
        while i < len(chunk):
            if self._skip:
                step = min(self._skip, len(chunk) - i)
                self._skip -= step
                i += step
                continue
            take = min(_PREFIX.size - len(self._prefix), len(chunk) - i)
            self._prefix += chunk[i : i + take]
            i += take
            if len(self._prefix) == _PREFIX.size:
                header_len, body_len = _PREFIX.unpack(self._prefix)
                self._prefix = b""
                if body_len > self.limit:
                    return body_len
                self._skip = header_len + body_len
        return None


def tls_context(cert: str, key: str, client_ca: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    ctx.load_verify_locations(cafile=client_ca)
    ctx.verify_mode = ssl.CERT_REQUIRED  # no CA-signed client certificate, no connection
    return ctx


def error_frame(code: str, message: str) -> bytes:
    header = json.dumps(
        {"type": "error", "id": None, "error": {"code": code, "message": message, "recoverable": False}}
    ).encode()
    return _PREFIX.pack(len(header), 0) + header


def ok_frame() -> bytes:
    header = b'{"type":"auth_ok"}'
    return _PREFIX.pack(len(header), 0) + header


class Relay:
    def __init__(self, token: str, worker_cmd: list[str], body_limit: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self._token = token.encode()
        self._worker_cmd = worker_cmd
        self._body_limit = body_limit
        self._busy = False
        self.sessions = 0
        self.proc: asyncio.subprocess.Process | None = None

    def stop_worker(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        cert = writer.get_extra_info("peercert") or {}
        subject = ", ".join("=".join(x) for rdn in cert.get("subject", ()) for x in rdn)
        who = {"peer": f"{peer[0]}:{peer[1]}" if peer else "?", "client_cert": subject}
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
            if self._busy:
                logs.warn("refused a second control plane while one is connected", **who)
                writer.write(error_frame("busy", "this worker already serves a control plane; retry later"))
                await writer.drain()
                return
            writer.write(ok_frame())
            self._busy = True
            try:
                await self._serve(reader, writer, who)
            finally:
                self._busy = False
        except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError, TimeoutError) as exc:
            logs.info("connection ended", error=f"{type(exc).__name__}: {exc}", **who)
        finally:
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

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, who: dict) -> None:
        self.sessions += 1
        proc = await asyncio.create_subprocess_exec(
            *self._worker_cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=None
        )
        self.proc = proc
        logs.info("control plane connected; worker started", worker_pid=proc.pid, **who)
        assert proc.stdin is not None and proc.stdout is not None

        watch = FrameWatch(self._body_limit)

        async def upstream() -> None:  # control plane → worker
            while chunk := await reader.read(RELAY_CHUNK):
                over = watch.feed(chunk)
                if over is not None:
                    # The frame's bytes before the body may already be with the worker: it dies
                    # with the connection, so nothing half-read survives.
                    logs.warn("closed the connection: a frame body is over the limit", body_len=over,
                              limit=self._body_limit, **who)  # fmt: skip
                    return
                proc.stdin.write(chunk)
                await proc.stdin.drain()

        async def downstream() -> None:  # worker → control plane
            while chunk := await proc.stdout.read(RELAY_CHUNK):
                writer.write(chunk)
                await writer.drain()

        tasks = [asyncio.create_task(upstream()), asyncio.create_task(downstream())]
        try:
            _done, _pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Either side ended: EOF on the worker's stdin makes it finish and exit 0.
            with contextlib.suppress(Exception):
                proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), WORKER_EXIT_GRACE_S)
            except TimeoutError:
                proc.kill()
                await proc.wait()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        logs.info("control plane session ended", worker_exit=proc.returncode, **who)


async def _main(args: argparse.Namespace, worker_args: list[str]) -> int:
    host, port = split_listen(args.listen)
    token = read_token(args.token_file)
    ctx = tls_context(args.tls_cert, args.tls_key, args.client_ca)
    relay = Relay(token, [sys.executable, "-m", "tpu_worker", *worker_args], max_body_bytes(worker_args))
    server = await asyncio.start_server(relay.handle, host, port, ssl=ctx, ssl_handshake_timeout=AUTH_TIMEOUT_S)
    bound = server.sockets[0].getsockname()
    logs.info("listening", host=bound[0], port=bound[1], worker_args=" ".join(worker_args))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for s in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(s, stop.set)
    async with server:
        await stop.wait()
    logs.info("stopping")
    relay.stop_worker()
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
