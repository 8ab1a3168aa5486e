"""`python -m tpu_worker serve`: mutual TLS, the token in the first frame, then one shared worker
served to several control planes at once through the relay (ids rewritten per connection, cancels
and disconnects that reach only their own requests, the hello replayed, `fleet` frames for
models loaded through another connection). Certificates are made with openssl for the test; the
server binds 127.0.0.1 with port 0."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time

import pytest

from tpu_worker.serve import read_token, split_listen

WORKER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREFIX = struct.Struct(">II")
TOKEN = "tok_" + "0123456789abcdef" * 2

# Under CI a missing openssl is a broken runner, not a reason to pass without testing anything.
if shutil.which("openssl") is None and os.environ.get("CI") == "true":
    raise RuntimeError("openssl is needed to make the serve tests' certificates (CI=true: not skipping)")
pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is needed to make certificates")


def _openssl(*args: str, cwd: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _ca(d: str, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
        "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.crt", cwd=d,
    )  # fmt: skip


def _leaf(d: str, name: str, ca: str, ext: str | None = None) -> None:
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", f"/CN={name}",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d,
    )  # fmt: skip
    args = ["x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial"]
    args += ["-days", "2", "-out", f"{name}.crt"]
    if ext:
        args += ["-extfile", ext]
    _openssl(*args, cwd=d)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> str:
    d = str(tmp_path_factory.mktemp("certs"))
    _ca(d, "ca")
    _ca(d, "rogue-ca")
    # The README's recipe: workers' certificates serverAuth only, the control plane's clientAuth.
    with open(os.path.join(d, "w.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    with open(os.path.join(d, "c.ext"), "w") as f:
        f.write("extendedKeyUsage=clientAuth\n")
    _leaf(d, "worker", "ca", "w.ext")
    _leaf(d, "client", "ca", "c.ext")
    _leaf(d, "rogue", "rogue-ca", "c.ext")
    _leaf(d, "no-eku", "ca")  # signed by the right CA, but valid for any purpose
    tok = os.path.join(d, "token")
    with open(tok, "w") as f:
        f.write(TOKEN + "\n")
    os.chmod(tok, 0o600)
    return d


@pytest.fixture(scope="module")
def server(certs, catalog_path):
    env = {**os.environ, "PYTHONPATH": WORKER_DIR}
    p = subprocess.Popen(
        [
            sys.executable, "-m", "tpu_worker", "serve", "--listen", "127.0.0.1:0",
            "--tls-cert", f"{certs}/worker.crt", "--tls-key", f"{certs}/worker.key",
            "--client-ca", f"{certs}/ca.crt", "--token-file", f"{certs}/token",
            "--catalog", catalog_path, "--device", "cpu", "--threads", "1",
        ],
        env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    port = None
    lines: list[str] = []
    deadline = time.time() + 30
    while time.time() < deadline and port is None:
        line = p.stderr.readline()
        lines.append(line)
        m = re.search(r'"msg": "listening".*"port": (\d+)', line)
        if m:
            port = int(m.group(1))
    assert port, "".join(lines)
    yield port, p
    p.terminate()
    p.wait(timeout=15)


def _connect(certs: str, port: int, client: str | None = "client") -> ssl.SSLSocket:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(f"{certs}/ca.crt")
    if client is not None:
        ctx.load_cert_chain(f"{certs}/{client}.crt", f"{certs}/{client}.key")
    raw = socket.create_connection(("127.0.0.1", port), timeout=60)
    return ctx.wrap_socket(raw, server_hostname="127.0.0.1")


def _send(s: ssl.SSLSocket, header: dict) -> None:
    h = json.dumps(header).encode()
    s.sendall(PREFIX.pack(len(h), 0) + h)


def _recv_exact(s: ssl.SSLSocket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def _recv(s: ssl.SSLSocket) -> dict:
    hl, bl = PREFIX.unpack(_recv_exact(s, 8))
    header = json.loads(_recv_exact(s, hl))
    _recv_exact(s, bl)
    return header


def _closed_without_answer(s: ssl.SSLSocket) -> bool:
    try:
        return s.recv(1) == b""
    except (ssl.SSLError, ConnectionError, OSError):
        return True


def test_a_wrong_token_is_refused_and_the_connection_closed(server, certs):
    port, _ = server
    with _connect(certs, port) as s:
        _send(s, {"type": "auth", "token": TOKEN[:-1] + "X"})
        msg = _recv(s)
        assert msg["type"] == "error" and msg["id"] is None
        assert msg["error"]["code"] == "unauthorized" and "wrong token" in msg["error"]["message"]
        assert _closed_without_answer(s)


def test_a_first_frame_that_is_not_auth_is_refused(server, certs):
    port, _ = server
    with _connect(certs, port) as s:
        _send(s, {"type": "request", "id": "r1", "op": "status", "args": {}})
        msg = _recv(s)
        assert msg["error"]["code"] == "unauthorized"


def test_a_client_certificate_from_another_ca_gets_no_answer(server, certs):
    port, _ = server
    try:
        s = _connect(certs, port, client="rogue")
    except (ssl.SSLError, ConnectionError):
        return  # refused during the handshake (TLS 1.2 style)
    with s:
        try:
            _send(s, {"type": "auth", "token": TOKEN})
        except (ssl.SSLError, ConnectionError, OSError):
            return
        assert _closed_without_answer(s)


def _refused_without_a_frame(certs: str, port: int, client: str | None) -> None:
    """The TLS layer refuses: the handshake fails, or the connection closes before any frame."""
    try:
        s = _connect(certs, port, client=client)
    except (ssl.SSLError, ConnectionError):
        return  # refused during the handshake (TLS 1.2 style)
    with s:
        try:
            _send(s, {"type": "auth", "token": TOKEN})
        except (ssl.SSLError, ConnectionError, OSError):
            return
        assert _closed_without_answer(s), "the worker answered a peer the TLS layer should have refused"


def test_a_client_without_a_certificate_gets_no_answer_even_with_the_right_token(server, certs):
    # Fails if the worker asks for a client certificate without requiring one (ssl.CERT_OPTIONAL).
    port, _ = server
    _refused_without_a_frame(certs, port, client=None)


def test_a_workers_own_server_certificate_cannot_act_as_the_control_plane(server, certs):
    # A compromised worker host holds its own CA-signed certificate and the shared token.
    port, _ = server
    _refused_without_a_frame(certs, port, client="worker")


def test_a_certificate_without_extended_key_usage_is_told_it_is_not_a_control_plane(server, certs):
    port, _ = server
    with _connect(certs, port, client="no-eku") as s:
        _send(s, {"type": "auth", "token": TOKEN})
        msg = _recv(s)
        assert msg["type"] == "error" and msg["error"]["code"] == "unauthorized"
        assert "clientAuth" in msg["error"]["message"]
        assert _closed_without_answer(s)


def test_a_stalled_auth_frame_is_refused_and_closed_without_an_unhandled_exception(certs, catalog_path, monkeypatch):
    import asyncio

    from tpu_worker import serve

    monkeypatch.setattr(serve, "AUTH_TIMEOUT_S", 0.5)
    lines: list[str] = []

    async def run() -> dict:
        relay = serve.Relay(TOKEN, [sys.executable, "-c", "pass"])
        ctx = serve.tls_context(f"{certs}/worker.crt", f"{certs}/worker.key", f"{certs}/ca.crt")
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, c: lines.append(repr(c)))
        handled = asyncio.Event()

        async def handle(reader, writer) -> None:
            await relay.handle(reader, writer)
            handled.set()

        srv = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
        port = srv.sockets[0].getsockname()[1]

        def client() -> dict:
            with _connect(certs, port) as s:
                s.sendall(PREFIX.pack(100, 0) + b'{"type":')  # the prefix and part of the header, then silence
                msg = _recv(s)
                assert _closed_without_answer(s)
                return msg

        try:
            msg = await asyncio.to_thread(client)
            await asyncio.wait_for(handled.wait(), 5)  # the handler returned, no exception escaped
            return msg
        finally:
            srv.close()
            await srv.wait_closed()

    msg = asyncio.run(run())
    assert msg["error"]["code"] == "unauthorized" and "in time" in msg["error"]["message"]
    assert not lines, lines


def test_an_over_limit_body_closes_the_connection_instead_of_being_skipped(certs, catalog_path):
    env = {**os.environ, "PYTHONPATH": WORKER_DIR}
    p = subprocess.Popen(
        [
            sys.executable, "-m", "tpu_worker", "serve", "--listen", "127.0.0.1:0",
            "--tls-cert", f"{certs}/worker.crt", "--tls-key", f"{certs}/worker.key",
            "--client-ca", f"{certs}/ca.crt", "--token-file", f"{certs}/token",
            "--catalog", catalog_path, "--device", "cpu", "--threads", "1", "--max-body-bytes", "1024",
        ],
        env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        port = None
        while port is None:
            line = p.stderr.readline()
            assert line, "serve exited"
            m = re.search(r'"msg": "listening".*"port": (\d+)', line)
            port = int(m.group(1)) if m else None
        with _connect(certs, port) as s:
            _send(s, {"type": "auth", "token": TOKEN})
            assert _recv(s)["type"] == "auth_ok"
            assert _recv(s)["type"] == "hello"
            h = json.dumps({"type": "request", "id": "big", "op": "status", "args": {}}).encode()
            s.sendall(PREFIX.pack(len(h), 4 * 1024**3 - 1) + h + b"\0" * 4096)
            s.settimeout(20)
            # A pipe worker would answer `bad_frame` only after reading 4 GiB: here the connection
            # closes at once, with no frame for the oversized request (a timeout is a failure).
            try:
                got = s.recv(1)
            except TimeoutError:
                pytest.fail("the connection stayed open after an over-limit body (the worker is skipping it)")
            except (ssl.SSLError, ConnectionError):
                got = b""
            assert got == b"", "the worker answered instead of closing"
    finally:
        p.terminate()
        p.wait(timeout=15)


def test_listen_needs_host_and_port():
    assert split_listen("127.0.0.1:0") == ("127.0.0.1", 0)
    assert split_listen("[::1]:7900") == ("::1", 7900)
    for bad in ("7900", ":7900", "host:", "host:99999"):
        with pytest.raises(ValueError):
            split_listen(bad)


def test_a_short_token_is_rejected(tmp_path):
    p = tmp_path / "t"
    p.write_text("short\n")
    p.chmod(0o600)
    with pytest.raises(ValueError, match="at least"):
        read_token(str(p))


def test_max_body_bytes_is_read_as_the_worker_reads_it():
    from tpu_worker.serve import max_body_bytes

    assert max_body_bytes(["--catalog", "c.json"]) == 1024**3
    assert max_body_bytes(["--max-body-bytes", "1024", "--threads", "1"]) == 1024
    assert max_body_bytes(["--max-body-bytes=2048"]) == 2048


# -- the shared worker: several control planes at once ------------------------------------------


def _start_serve(certs: str, catalog_path: str, *extra: str) -> tuple[int, subprocess.Popen]:
    env = {**os.environ, "PYTHONPATH": WORKER_DIR}
    p = subprocess.Popen(
        [
            sys.executable, "-m", "tpu_worker", "serve", "--listen", "127.0.0.1:0",
            "--tls-cert", f"{certs}/worker.crt", "--tls-key", f"{certs}/worker.key",
            "--client-ca", f"{certs}/ca.crt", "--token-file", f"{certs}/token",
            "--catalog", catalog_path, "--device", "cpu", "--threads", "1", *extra,
        ],
        env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    while True:
        line = p.stderr.readline()
        assert line, "serve exited"
        m = re.search(r'"msg": "listening".*"port": (\d+)', line)
        if m:
            # The rest of its log is not read by the test: drain it so the relay never blocks on it.
            threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
            return int(m.group(1)), p


@pytest.fixture
def shared(certs, catalog_path):
    """A serve of its own per test (the worker, and what it holds, is shared by its connections)."""
    port, p = _start_serve(certs, catalog_path, "--max-control-planes", "3")
    yield port
    p.terminate()
    p.wait(timeout=30)


class Plane:
    """One control plane's connection: authenticated, its hello (and fleet frames) read."""

    def __init__(self, certs: str, port: int, max_control_planes: int = 3) -> None:
        self.s = _connect(certs, port)
        _send(self.s, {"type": "auth", "token": TOKEN})
        ok = _recv(self.s)
        assert ok == {"type": "auth_ok", "shared": True, "max_control_planes": max_control_planes}, ok
        self.hello = _recv(self.s)
        assert self.hello["type"] == "hello", self.hello
        self.pending: list[dict] = []

    def send(self, header: dict) -> None:
        _send(self.s, header)

    def next(self, pred, what: str) -> dict:
        """The first frame (already read, or next) for which pred holds; others are kept."""
        for i, h in enumerate(self.pending):
            if pred(h):
                return self.pending.pop(i)
        while True:
            h = _recv(self.s)
            if pred(h):
                return h
            self.pending.append(h)
            assert len(self.pending) < 10_000, f"no {what}"

    def answer(self, mid: str) -> dict:
        return self.next(lambda h: h.get("id") == mid and h["type"] in ("result", "error"), f"answer to {mid}")

    def call(self, mid: str, op: str, args: dict | None = None) -> dict:
        self.send({"type": "request", "id": mid, "op": op, "args": args or {}})
        return self.answer(mid)

    def fleet(self) -> dict:
        return self.next(lambda h: h["type"] == "fleet", "fleet frame")

    def benchmark(self, mid: str, **bench) -> None:
        """Starts a benchmark (conftest.bench_args) and returns at its first progress: running."""
        from conftest import bench_args

        self.send({"type": "request", "id": mid, "op": "benchmark", "args": bench_args(**bench)})
        self.next(lambda h: h["type"] == "progress" and h["id"] == mid, f"progress of {mid}")

    def close(self) -> None:
        self.s.close()


def test_two_control_planes_at_once_share_one_worker_with_colliding_ids(shared, certs):
    a, b = Plane(certs, shared), Plane(certs, shared)
    assert a.hello == b.hello  # the worker's one hello, replayed
    # Both use id "r1" at the same time: each gets its own answer back under its own id.
    a.send({"type": "request", "id": "r1", "op": "describe", "args": {}})
    b.send({"type": "request", "id": "r1", "op": "status", "args": {}})
    ra, rb = a.answer("r1"), b.answer("r1")
    assert ra["type"] == "result" and "models" in ra["result"]
    assert rb["type"] == "result" and rb["result"]["pid"] == a.hello["pid"]
    assert rb["result"]["relay"]["control_planes"] == 2
    a.send({"type": "ping", "id": "p"})
    b.send({"type": "ping", "id": "p"})
    assert a.next(lambda h: h["type"] == "pong", "pong")["id"] == "p"
    assert b.next(lambda h: h["type"] == "pong", "pong")["id"] == "p"
    a.close()
    b.close()


def test_a_cancel_reaches_only_its_own_connections_request(shared, certs):
    a, b = Plane(certs, shared), Plane(certs, shared)
    a.benchmark("x", iterations=30)
    b.send({"type": "cancel", "id": "x"})  # B has no request "x": nothing reaches the worker
    b.call("s", "status")  # B's frames are read in order: its cancel was handled before this answer
    done = a.answer("x")
    assert done["type"] == "result", done
    assert done["result"]["cancelled"] is False, "B's cancel stopped A's benchmark"
    # A's own cancel does reach it.
    a.benchmark("y", duration_s=120)
    a.send({"type": "cancel", "id": "y"})
    assert a.answer("y")["result"]["cancelled"] is True
    a.close()
    b.close()


def test_a_disconnect_cancels_only_that_connections_requests_and_the_worker_lives_on(shared, certs):
    from conftest import bench_args

    a, b = Plane(certs, shared), Plane(certs, shared)
    a.benchmark("long", duration_s=300)
    b.send({"type": "request", "id": "mine", "op": "benchmark", "args": bench_args(iterations=20)})
    assert b.call("s1", "status")["result"]["relay"]["requests_in_flight"] == 2
    a.close()
    # B's benchmark runs to its end, not cancelled; A's 300 s one was cancelled when A left, so
    # nothing is left in the worker well before its 300 s.
    done = b.answer("mine")
    assert done["type"] == "result" and done["result"]["cancelled"] is False, done
    deadline = time.time() + 120
    while b.call("s2", "status")["result"]["relay"]["requests_in_flight"] > 0:
        assert time.time() < deadline, "A's request was not cancelled when A disconnected"
        time.sleep(0.2)
    # EOF and `shutdown` from one control plane end its connection, not the shared worker.
    b.send({"type": "request", "id": "bye", "op": "shutdown", "args": {}})
    assert b.answer("bye") == {"type": "result", "id": "bye", "result": {}}
    assert _closed_without_answer(b.s)
    c = Plane(certs, shared)
    assert c.hello["pid"] == a.hello["pid"]  # the same worker process, its hello replayed
    assert c.call("s", "status")["result"]["relay"]["control_planes"] == 1
    c.close()


def test_loads_and_unloads_through_one_connection_are_told_to_the_others_and_to_newcomers(shared, certs):
    a, b = Plane(certs, shared), Plane(certs, shared)
    loaded = a.call("l", "load", {"model": "mnist-cnn", "dtype": "float32", "mode": "eager"})
    assert loaded["type"] == "result", loaded
    news = b.fleet()
    assert news == {
        "type": "fleet", "op": "load", "model": "mnist-cnn",
        "args": {"model": "mnist-cnn", "dtype": "float32", "mode": "eager"}, "result": loaded["result"],
    }  # fmt: skip
    # B runs inference on the model A loaded, without loading it.
    image = struct.pack("<784f", *([0.5] * 784))  # one 1x28x28 float32 image, as raw bytes
    spec = {"dtype": "float32", "shape": [1, 1, 28, 28], "offset": 0, "nbytes": len(image)}
    h = json.dumps({"type": "request", "id": "i", "op": "infer", "args": {"model": "mnist-cnn"}, "tensors": [spec]})
    b.s.sendall(PREFIX.pack(len(h), len(image)) + h.encode() + image)
    x = b.answer("i")
    assert x["type"] == "result" and x["result"]["model"] == "mnist-cnn", x
    assert x["tensors"][0]["shape"] == [1, 10]
    # A newcomer hears of it right after the hello.
    c = Plane(certs, shared)
    assert c.next(lambda h: True, "first frame after hello")["type"] == "fleet"
    # An unload through B is told to A and C; B gets only its answer.
    assert b.call("u", "unload", {"model": "mnist-cnn"})["type"] == "result"
    assert a.fleet() == {"type": "fleet", "op": "unload", "model": "mnist-cnn"}
    assert c.fleet() == {"type": "fleet", "op": "unload", "model": "mnist-cnn"}
    b.call("s", "status")
    assert not [h for h in b.pending if h["type"] == "fleet"], b.pending
    # A fourth control plane is over --max-control-planes 3: busy.
    d = _connect(certs, shared)
    _send(d, {"type": "auth", "token": TOKEN})
    busy = _recv(d)
    assert busy["error"]["code"] == "busy" and "3 control planes" in busy["error"]["message"]
    d.close()
    for p in (a, b, c):
        p.close()


def test_when_the_worker_dies_every_connection_closes_and_the_next_one_gets_a_fresh_worker(shared, certs):
    a, b = Plane(certs, shared), Plane(certs, shared)
    assert a.call("l", "load", {"model": "mnist-cnn"})["type"] == "result"
    b.fleet()
    os.kill(a.hello["pid"], 9)
    for p in (a, b):
        with pytest.raises((ConnectionError, ssl.SSLError, OSError)):
            while True:
                p.next(lambda h: False, "end of stream")
    c = Plane(certs, shared)
    assert c.hello["pid"] != a.hello["pid"]
    status = c.call("s", "status")["result"]
    assert status["loaded"] == [] and status["relay"]["models"] == []
    c.close()


FAKE_WORKER = r"""
import json, os, struct, sys, time
P = struct.Struct(">II")
out, inp = sys.stdout.buffer, sys.stdin.buffer
def send(h, body=b""):
    raw = json.dumps(h, separators=(",", ":")).encode()
    out.write(P.pack(len(raw), len(body)) + raw + body)
    out.flush()
time.sleep(float(sys.argv[1]))  # a slow start: the connections wait for the hello
send({"type": "hello", "protocol": 1, "pid": os.getpid()})
handled = 0  # requests answered in order, one at a time, like a worker whose op threads are all busy
while (pre := inp.read(8)) and len(pre) == 8:
    hl, bl = P.unpack(pre)
    h, body = json.loads(inp.read(hl)), inp.read(bl)
    if h.get("op") in ("slow", "status"):  # `n`: how many requests the worker handled up to this one
        time.sleep(h["args"].get("s", 0))
        handled += 1
        send({"type": "result", "id": h["id"], "result": {"n": handled}})
    elif h.get("op") == "stream":
        send({"type": "progress", "id": h["id"], "progress": 0, "delta": {"index": 0, "text": "he"}})
        send({"type": "result", "id": h["id"], "result": {"seen_id": h["id"]}}, body)
    elif h.get("op") == "flood":  # many large progress frames, for a caller that does not read
        for i in range(h["args"]["frames"]):
            send({"type": "progress", "id": h["id"], "progress": i, "message": "x" * 65536})
        send({"type": "result", "id": h["id"], "result": {}})
    elif h.get("op") == "fill":  # a result whose header is 100 bytes under 16 MiB with the relay's id
        base = len(json.dumps({"type": "result", "id": h["id"], "result": {"pad": ""}}, separators=(",", ":")))
        send({"type": "result", "id": h["id"], "result": {"pad": "x" * (16 * 1024 * 1024 - base - 100)}})
    elif h.get("op") == "boom":  # an error that answers nobody's frame
        send({"type": "error", "id": None, "error": {"code": "protocol_error", "message": "boom", "recoverable": True}})
"""


def _with_fake_relay(certs: str, start_delay: str, clients, **relay) -> None:
    """Serves FAKE_WORKER (its hello after `start_delay` seconds) through a Relay on 127.0.0.1
    (`relay`: its settings over max_control_planes=3), runs `clients(port)` in a thread against
    it, then closes the relay and its server."""
    import asyncio

    from tpu_worker import serve

    async def run() -> None:
        settings = {"max_control_planes": 3, **relay}
        relay_ = serve.Relay(TOKEN, [sys.executable, "-c", FAKE_WORKER, start_delay], **settings)
        ctx = serve.tls_context(f"{certs}/worker.crt", f"{certs}/worker.key", f"{certs}/ca.crt")
        srv = await asyncio.start_server(relay_.handle, "127.0.0.1", 0, ssl=ctx)
        try:
            await asyncio.to_thread(clients, srv.sockets[0].getsockname()[1])
        finally:
            srv.close()
            await relay_.close()
            await srv.wait_closed()

    asyncio.run(run())


def test_the_relay_routes_progress_deltas_and_bodies_by_connection_and_broadcasts_errors_with_id_null(certs):
    """Against a stand-in worker (the frames a worker sends, no torch): two connections made
    while the worker is still starting both get its hello; a streamed answer's progress (with its
    delta) and its result with a body come back under the caller's id, while the worker saw the
    relay's; an error frame with id null goes to every connection."""

    def recv_with_body(s: ssl.SSLSocket) -> tuple[dict, bytes]:
        hl, bl = PREFIX.unpack(_recv_exact(s, 8))
        return json.loads(_recv_exact(s, hl)), _recv_exact(s, bl)

    def clients(port: int) -> None:
        planes: list[Plane] = []
        threads = [threading.Thread(target=lambda: planes.append(Plane(certs, port))) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        a, b = planes
        assert a.hello == b.hello and a.hello["type"] == "hello"
        body = b"\x01\x02\x03raw tensor bytes"
        h = json.dumps({"type": "request", "id": "s", "op": "stream", "args": {}}).encode()
        a.s.sendall(PREFIX.pack(len(h), len(body)) + h + body)
        progress = _recv(a.s)
        assert progress == {"type": "progress", "id": "s", "progress": 0, "delta": {"index": 0, "text": "he"}}
        result, back = recv_with_body(a.s)
        assert result["id"] == "s" and back == body
        assert result["result"]["seen_id"] != "s"  # the worker saw the relay's id, not A's
        b.send({"type": "request", "id": "x", "op": "boom", "args": {}})
        for p in (a, b):
            err = _recv(p.s)
            assert err["type"] == "error" and err["id"] is None and err["error"]["message"] == "boom"
        a.close()
        b.close()

    _with_fake_relay(certs, "1.0", clients)


def test_a_control_plane_that_stops_reading_is_disconnected_and_the_others_are_still_answered(certs, monkeypatch):
    from tpu_worker import serve

    monkeypatch.setattr(serve, "SLOW_PEER_BYTES", 1024 * 1024)
    frames = 400  # about 26 MiB of answers for A, who reads none of them

    def clients(port: int) -> None:
        a, b = Plane(certs, port), Plane(certs, port)
        a.send({"type": "request", "id": "f", "op": "flood", "args": {"frames": frames}})
        time.sleep(0.5)  # the flood is under way, queued for A
        h = json.dumps({"type": "request", "id": "s", "op": "stream", "args": {}}).encode()
        b.s.sendall(PREFIX.pack(len(h), 0) + h)
        assert b.answer("s")["type"] == "result"  # B is answered while A reads nothing
        got, ended = 0, False
        try:
            while True:
                a.next(lambda h: True, "a frame")
                got += 1
        except (ConnectionError, ssl.SSLError, OSError):
            ended = True
        assert ended and got < frames + 1, f"A got {got} frames: it was not disconnected"
        b.close()

    _with_fake_relay(certs, "0", clients)


# -- what a shared worker survives (issue 43, rows 4 and 8) ---------------------------------------


def test_one_frame_must_not_kill_a_shared_worker(shared, certs):
    """A header under 16 MiB as sent but over it once re-encoded for the worker (non-ASCII text
    becomes \\u escapes, threefold) is refused on its connection; the worker every plane shares
    never sees it, and the other plane is still answered by the same worker."""
    a, b = Plane(certs, shared), Plane(certs, shared)
    pad = "\u00e9" * (15 * 1024 * 1024 // 2)  # two bytes each in UTF-8: 15 MiB as sent, 45 MiB escaped
    h = json.dumps({"type": "request", "id": "big", "op": "status", "args": {"pad": pad}}, ensure_ascii=False)
    raw = h.encode()
    assert 15 * 1024 * 1024 <= len(raw) < 16 * 1024 * 1024
    a.s.sendall(PREFIX.pack(len(raw), 0) + raw)
    refused = a.answer("big")
    assert refused["type"] == "error" and refused["error"]["code"] == "protocol_error", refused
    assert "over 16777216" in refused["error"]["message"], refused
    assert _closed_without_answer(a.s)
    status = b.call("s", "status")
    assert status["type"] == "result", status
    assert status["result"]["pid"] == a.hello["pid"]  # the same worker, alive
    assert status["result"]["relay"]["control_planes"] == 1
    b.close()


def test_an_idle_plane_loses_its_slot(certs):
    """Both slots taken; the plane that sends nothing is told `idle` and closed, the one that keeps
    calling keeps its slot, and a newcomer gets the freed one."""
    stop = threading.Event()

    def clients(port: int) -> None:
        idle, busy = Plane(certs, port, 2), Plane(certs, port, 2)
        answers: list[dict] = []

        def keep_busy() -> None:
            i = 0
            while not stop.is_set():
                i += 1
                answers.append(busy.call(f"s{i}", "status"))
                time.sleep(0.1)

        t = threading.Thread(target=keep_busy, daemon=True)
        t.start()
        try:
            told = _recv(idle.s)
            assert told["type"] == "error" and told["id"] is None and told["error"]["code"] == "idle", told
            assert "reconnect" in told["error"]["message"]
            assert _closed_without_answer(idle.s)
            newcomer = Plane(certs, port, 2)  # the idle plane's slot was given back
        finally:
            stop.set()
            t.join(60)
        assert answers and all(a["type"] == "result" for a in answers)
        assert busy.call("last", "status")["type"] == "result"  # still connected
        newcomer.close()
        busy.close()

    _with_fake_relay(certs, "0", clients, max_control_planes=2, idle_timeout_s=2.0)


def test_one_planes_queue_does_not_hold_anothers_status(certs):
    """A floods the worker (which answers one request at a time); B's status goes in at B's turn,
    not behind A's backlog: the worker handles it before half of A's requests (first come over
    all, it came after every one of them)."""
    flood = 1000

    def clients(port: int) -> None:
        a, b = Plane(certs, port), Plane(certs, port)
        frames = b"".join(
            PREFIX.pack(len(h), 0) + h
            for h in (
                json.dumps({"type": "request", "id": f"f{i}", "op": "slow", "args": {"s": 0.01}}).encode()
                for i in range(flood)
            )
        )
        a.s.sendall(frames)
        a.answer("f0")  # the flood is under way
        status = b.call("s", "status")
        assert status["type"] == "result", status
        handled_before_b = status["result"]["n"]
        assert handled_before_b < flood // 2, f"B's status was handled after {handled_before_b} of A's {flood}"
        a.close()
        b.close()

    _with_fake_relay(certs, "0", clients)


def test_a_plane_over_its_queue_is_dropped_and_the_others_are_answered(certs):
    def clients(port: int) -> None:
        a, b = Plane(certs, port), Plane(certs, port)
        for i in range(200):
            a.send({"type": "request", "id": f"f{i}", "op": "slow", "args": {"s": 0.01}})
        told = a.next(lambda h: h["type"] == "error", "the relay's refusal")
        assert told["error"]["code"] == "protocol_error" and "--max-queued" in told["error"]["message"], told
        with pytest.raises((ConnectionError, ssl.SSLError, OSError)):
            while True:
                a.next(lambda h: False, "end of stream")
        assert b.call("s", "status")["type"] == "result"
        b.close()

    _with_fake_relay(certs, "0", clients, max_queued=16)


def test_an_answer_the_callers_id_pushes_over_16_mib_becomes_an_error_for_that_call(certs):
    """The relay restores the caller's id (up to 256 characters, 6 bytes each escaped): an answer
    that grows past the bound on the way back is replaced by an error, never sent oversize."""

    def clients(port: int) -> None:
        a = Plane(certs, port)
        mid = "\u00e9" * 256
        got = a.call(mid, "fill")
        assert got["type"] == "error" and got["error"]["code"] == "internal", {**got, "result": "…"}
        assert "over 16777216" in got["error"]["message"]
        assert a.call("s", "status")["type"] == "result"  # the connection goes on
        a.close()

    _with_fake_relay(certs, "0", clients)
