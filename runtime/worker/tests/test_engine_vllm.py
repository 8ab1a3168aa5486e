"""The vLLM engine adapter without vLLM: a scripted OpenAI-compatible server on loopback stands in
for it, so the mapping (prompt ids, stop sequences, held-back streaming, finish reasons,
cancellation, errors) is checked on every run; the real engine is `npm run test:vllm`."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import socketserver
import stat
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import bench_args
from tpu_worker.cancel import CancelToken
from tpu_worker.engines import VllmEngine, VllmSettings
from tpu_worker.engines.http import Endpoint
from tpu_worker.errors import WorkerError
from tpu_worker.loaders import inspect_weights
from tpu_worker.ops import OpContext

IDS = [2023, 2003, 1037, 3231, 1997, 2054, 2000, 2175]  # "this is a test of what to ..."


class Fake(BaseHTTPRequestHandler):
    requests: list = []  # noqa: RUF012 - shared by the test
    aborts: list = []  # noqa: RUF012
    abort_status = 200
    delay = 0.0
    status = 200
    cached: int | None = None  # prompt tokens vLLM's prefix cache held (usage.prompt_tokens_details)

    def log_message(self, *a):
        pass

    def do_GET(self):
        body = {"/version": {"version": "0.0-fake"}, "/v1/models": {"data": [{"id": "served"}]}}.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.end_headers()
        self.wfile.write(json.dumps(body or {}).encode())

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/inference/v1/abort_requests":  # vLLM's abort by request id
            Fake.aborts.append({"ids": req["request_ids"], "auth": self.headers.get("Authorization")})
            self.send_response(Fake.abort_status)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        Fake.requests.append(
            {
                "path": self.path,
                "body": req,
                "auth": self.headers.get("Authorization"),
                "id": self.headers.get("X-Request-Id"),
            }
        )
        if Fake.status != 200:
            self.send_response(Fake.status)
            self.end_headers()
            self.wfile.write(json.dumps({"error": {"message": "bad request"}}).encode())
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        n = req["max_tokens"]
        prompts = req.get("prompt") or [None]
        try:
            for step in range(n):
                for i in range(len(prompts)):
                    choice = {
                        "index": i,
                        "token_ids": [IDS[step % len(IDS)]],
                        "finish_reason": "length" if step == n - 1 else None,
                    }
                    self.wfile.write(b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n")
                    self.wfile.flush()
                time.sleep(Fake.delay)
            if Fake.cached is not None:  # the final usage chunk (stream_options.include_usage)
                usage = {"prompt_tokens": 8, "prompt_tokens_details": {"cached_tokens": Fake.cached}}
                self.wfile.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")
        except (BrokenPipeError, ConnectionResetError):
            Fake.requests[-1]["aborted"] = True


@pytest.fixture
def fake(tmp_path):
    Fake.requests, Fake.aborts, Fake.delay, Fake.status, Fake.abort_status = [], [], 0.0, 200, 200
    Fake.cached = None
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Fake)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    key = tmp_path / "key"
    key.write_text("secret\n")
    yield VllmSettings(url=f"http://127.0.0.1:{srv.server_address[1]}", key_file=str(key))
    srv.shutdown()


@pytest.fixture
def engine(fake, catalog):
    entry = dataclasses.replace(catalog.get("tiny-gpt2"), engine="vllm")
    info = inspect_weights(entry, catalog)
    e = VllmEngine(entry, catalog, info, fake, "float32", "eager")
    e.start(CancelToken())
    return e


def test_prompts_are_token_ids_tokenized_like_the_torch_path(engine, catalog):
    from tpu_worker.adapters import CausalLM

    out = engine.infer({"texts": ["hello world", "x"], "max_new_tokens": 4}, OpContext("1"))
    sent = Fake.requests[-1]
    assert sent["path"] == "/v1/completions"
    assert sent["auth"] == "Bearer secret"
    assert sent["body"]["model"] == "served"  # an operator-run server names its model itself
    expected = [engine.tokenizer.encode(t, add_special_tokens=False).ids for t in ["hello world", "x"]]
    assert sent["body"]["prompt"] == expected
    assert CausalLM.prepare  # the rule mirrored: no special tokens, the end of a long prompt kept
    assert out["token_ids"] == [IDS[:4], IDS[:4]]
    assert out["texts"][0] == engine.tokenizer.decode(IDS[:4], skip_special_tokens=True)
    assert [g["finish_reason"] for g in out["generations"]] == ["length", "length"]
    assert out["generations"][0]["usage"] == {"prompt_tokens": len(expected[0]), "completion_tokens": 4}


def test_a_traced_request_gets_the_engines_prefill_and_decode_spans(engine):
    trace: list = []
    out = engine.infer({"texts": ["hello world", "x"], "max_new_tokens": 4}, OpContext("1", trace=trace))
    spans = {e[0]: e for e in trace if len(e) >= 3}
    prefill, decode = spans["prefill"], spans["decode"]
    assert prefill[1] <= prefill[2] <= decode[1] <= decode[2]
    assert prefill[3] == {"engine": "vllm", "prompts": 2}
    assert decode[3] == {"engine": "vllm", "new_tokens": max(out["new_tokens"])}
    # Untraced: nothing recorded, nothing raised.
    engine.infer({"texts": ["x"], "max_new_tokens": 2}, OpContext("1"))


def test_a_stop_sequence_cuts_the_text_and_closes_the_request(engine):
    full = engine.tokenizer.decode(IDS, skip_special_tokens=True)
    stop = full.split(" ")[3]
    out = engine.infer({"texts": ["x"], "max_new_tokens": 8, "stop": [stop]}, OpContext("1"))
    assert out["texts"][0] == full[: full.index(stop)]
    assert out["generations"][0]["finish_reason"] == "stop"


def test_streamed_deltas_never_hold_text_a_stop_may_still_cut(engine):
    deltas = []
    ctx = OpContext("1", progress=lambda *a, delta=None, **k: deltas.append(delta["text"]))
    full = engine.tokenizer.decode(IDS, skip_special_tokens=True)
    stop = full.split(" ")[4] + "zz"  # never matches, but its prefix does: held back, then sent
    out = engine.infer({"texts": ["x"], "max_new_tokens": 8, "stop": [stop], "stream": True}, ctx)
    assert "".join(deltas) == out["texts"][0] == full


def test_cancel_mid_stream_returns_the_partial_text_as_cancelled_and_aborts_the_request(engine):
    Fake.delay = 0.05
    token = CancelToken()
    threading.Timer(0.2, token.cancel).start()
    t0 = time.perf_counter()
    out = engine.infer({"texts": ["x"], "max_new_tokens": 64}, OpContext("1", token=token))
    assert time.perf_counter() - t0 < 2.0
    assert out["generations"][0]["finish_reason"] == "cancelled"
    assert 0 < out["new_tokens"][0] < 64
    for _ in range(50):
        if Fake.requests[-1].get("aborted"):
            break
        time.sleep(0.05)
    assert Fake.requests[-1].get("aborted")
    assert engine.counters.in_flight == 0


def test_a_cancel_aborts_every_prompt_of_the_request_in_vllm_by_its_id(engine):
    # Closing the socket does not always reach vLLM's request (a disconnect while it waits for
    # the socket to drain leaves every prompt running): the worker aborts them by id as well.
    Fake.delay = 0.05
    token = CancelToken()
    threading.Timer(0.2, token.cancel).start()
    out = engine.infer({"texts": ["a", "b", "c"], "max_new_tokens": 64}, OpContext("1", token=token))
    assert [g["finish_reason"] for g in out["generations"]] == ["cancelled"] * 3
    rid = Fake.requests[-1]["id"]
    assert rid and rid.startswith("tpu-mcp-")
    assert Fake.aborts == [{"ids": [f"cmpl-{rid}-{i}" for i in range(3)], "auth": "Bearer secret"}]
    assert engine.status()["aborts"] == 1


def test_a_chat_or_a_stop_sequence_ended_here_is_aborted_too_and_a_finished_one_is_not(engine):
    engine.chat_template = True
    engine.infer({"texts": ["x"], "max_new_tokens": 4}, OpContext("1"))
    assert Fake.aborts == []  # vLLM finished it ([DONE]): nothing to abort
    full = engine.tokenizer.decode(IDS, skip_special_tokens=True)
    engine.infer({"texts": ["x"], "max_new_tokens": 8, "stop": [full.split(" ")[3]]}, OpContext("1"))
    assert Fake.aborts[-1]["ids"] == [f"cmpl-{Fake.requests[-1]['id']}-0"]
    Fake.delay = 0.05
    token = CancelToken()
    threading.Timer(0.2, token.cancel).start()
    engine.infer({"messages": [{"role": "user", "content": "hi"}], "max_new_tokens": 64}, OpContext("1", token=token))
    assert Fake.aborts[-1]["ids"] == [f"chatcmpl-{Fake.requests[-1]['id']}"]


def test_the_abort_leaves_from_the_cancels_watcher_while_the_reader_is_held_up(engine):
    # The thread that reads the stream may be stuck elsewhere (here: sending a progress message
    # that does not return) when the cancel arrives; the abort by id must not wait for it.
    Fake.delay = 0.05
    token = CancelToken()
    released = threading.Event()
    seen_while_held: list[bool] = []

    def progress(*_a, **_k):
        if seen_while_held:
            return
        token.cancel()
        for _ in range(400):  # up to 20 s; with the abort on the watcher, a few ms
            if Fake.aborts:
                break
            time.sleep(0.05)
        seen_while_held.append(bool(Fake.aborts))
        released.set()

    out = engine.infer(
        {"texts": ["x"], "max_new_tokens": 64, "stream": True}, OpContext("1", token=token, progress=progress)
    )
    assert released.is_set()
    assert seen_while_held == [True]  # vLLM was told while the reader was still held up
    assert len(Fake.aborts) == 1 and out["generations"][0]["finish_reason"] == "cancelled"


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def test_the_endpoint_speaks_http_over_a_unix_socket_streams_and_aborts_there(engine):
    # The server the worker starts listens on a Unix socket only (isolation.py): the same calls,
    # the same stream, the same cancel and abort over it.
    d = tempfile.mkdtemp(dir="/tmp")
    path = os.path.join(d, "engine.sock")
    srv = _UnixHTTPServer(path, Fake)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        engine._endpoint = Endpoint("http://localhost", "secret", uds=path)
        assert engine.endpoint.get_json("/version") == {"version": "0.0-fake"}
        out = engine.infer({"texts": ["x"], "max_new_tokens": 4}, OpContext("1"))
        assert out["token_ids"] == [IDS[:4]] and Fake.requests[-1]["auth"] == "Bearer secret"
        Fake.delay = 0.05
        token = CancelToken()
        threading.Timer(0.2, token.cancel).start()
        cut = engine.infer({"texts": ["x"], "max_new_tokens": 64}, OpContext("1", token=token))
        assert cut["generations"][0]["finish_reason"] == "cancelled"
        assert Fake.aborts[-1]["ids"] == [f"cmpl-{Fake.requests[-1]['id']}-0"]
    finally:
        srv.shutdown()
        srv.server_close()
        shutil.rmtree(d, ignore_errors=True)


def test_a_started_server_listens_on_a_unix_socket_in_a_private_directory_and_no_tcp_port():
    from tpu_worker.engines.vllm_process import VllmProcess

    p = VllmProcess(VllmSettings(python=sys.executable), "/x", "m", "float32", 64, True)
    try:
        cmd = p.command()
        assert "--host" not in cmd and "--port" not in cmd
        sock = cmd[cmd.index("--uds") + 1]
        assert sock == p.socket_path == p.endpoint.uds
        d = os.path.dirname(sock)
        st = os.lstat(d)
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()
        assert stat.S_IMODE(st.st_mode) == 0o700  # nobody else may enter it, so nor reach the socket
        assert len(sock.encode()) + 1 + 36 < 108  # vLLM's ZMQ sockets beside it fit sun_path too
        assert p.environment()["VLLM_RPC_BASE_PATH"] == d  # its internal sockets: not in /tmp
    finally:
        p.stop()
    assert not os.path.exists(d)


def test_the_server_is_spawned_in_its_own_network_namespace_with_umask_077(tmp_path):
    # A stand-in for vLLM's Python: says where it runs, then waits to be stopped.
    from tpu_worker.engines.vllm_process import VllmProcess

    out = tmp_path / "where"
    fake = tmp_path / "python"
    fake.write_text(
        f"#!/bin/sh\necho $(readlink /proc/self/ns/net) $(umask) > {out}.tmp && mv {out}.tmp {out}\nexec sleep 60\n"
    )
    fake.chmod(0o755)
    p = VllmProcess(VllmSettings(python=str(fake)), "/x", "m", "float32", 64, True)
    proc = p._spawn()
    try:
        for _ in range(200):
            if out.exists():
                break
            time.sleep(0.05)
        ns, umask = out.read_text().split()
        if p.network == "host":
            pytest.skip("this system refuses network namespaces")
        assert p.network == "private" and ns != os.readlink("/proc/self/ns/net")
        assert umask == "0077"
    finally:
        proc.kill()
        proc.wait()
        p.stop()


@pytest.mark.parametrize("user", ["self", "unprivileged"])
def test_the_servers_processes_get_a_network_namespace_of_their_own(user):
    # The server's worker listens on TCP ports of its own (torch.distributed: a store and gloo)
    # on 127.0.0.1: in the server's own namespace, out of the host's reach. A worker without
    # CAP_SYS_ADMIN (the deployment's own user) gets it through a user namespace of its own.
    from tpu_worker.engines.vllm_process import _child_setup

    python, setup = sys.executable, _child_setup(True)
    if user == "unprivileged":
        if os.geteuid() != 0 or not os.access("/usr/bin/python3", os.X_OK):
            pytest.skip("needs root (to become nobody) and /usr/bin/python3")
        python, inner = "/usr/bin/python3", setup

        def setup():
            import ctypes

            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            # A uid change leaves the process undumpable (its /proc files root's): a worker
            # started as its user, as a service starts it, is not.
            ctypes.CDLL(None).prctl(4, 1)  # PR_SET_DUMPABLE
            inner()

    probe = (
        "import os, socket, sys\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
        "print(os.readlink('/proc/self/ns/net'), s.getsockname()[1], oct(os.umask(0)), flush=True)\n"
        "sys.stdin.read()\n"
    )
    try:
        child = subprocess.Popen(
            [python, "-c", probe],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd="/",
            preexec_fn=setup,  # noqa: PLW1509
        )
    except subprocess.SubprocessError as exc:
        pytest.skip(f"this system refuses network namespaces: {exc}")
    try:
        ns, port, umask = child.stdout.readline().split()
        assert ns != os.readlink("/proc/self/ns/net")
        assert umask == "0o77"
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", int(port)), timeout=5).close()
    finally:
        child.kill()
        child.wait()


def test_a_server_without_the_abort_endpoint_still_ends_the_call_as_cancelled(engine):
    Fake.delay, Fake.abort_status = 0.05, 403  # vLLM without --enable-scale-out
    token = CancelToken()
    threading.Timer(0.2, token.cancel).start()
    out = engine.infer({"texts": ["x"], "max_new_tokens": 64}, OpContext("1", token=token))
    assert out["generations"][0]["finish_reason"] == "cancelled"
    assert engine.status()["abort_refused"] == 1


def test_a_call_cancelled_before_it_starts_sends_nothing(engine):
    token = CancelToken()
    token.cancel()
    out = engine.infer({"texts": ["x"], "max_new_tokens": 8}, OpContext("1", token=token))
    assert out["generations"][0]["finish_reason"] == "cancelled"
    assert Fake.requests == [] and Fake.aborts == []


def test_arguments_are_checked_before_any_request(engine):
    n = len(Fake.requests)
    for bad in (
        {"texts": ["x"], "temperature": 3},
        {"texts": ["x"], "top_p": 0},
        {"texts": ["x"], "logprobs": 6},
        {"texts": ["x"], "stop": ["a"] * 5},
        {"texts": ["x"], "messages": [{"role": "user", "content": "x"}]},
        {"messages": [{"role": "robot", "content": "x"}]},
        {"messages": [{"role": "user", "content": "hi"}]},  # tiny-gpt2 has no chat template
    ):
        with pytest.raises(WorkerError) as exc:
            engine.infer(bad, OpContext("1"))
        assert exc.value.code == "invalid_argument", bad
    assert len(Fake.requests) == n


def test_sampling_arguments_and_a_picked_seed_reach_the_engine(engine):
    out = engine.infer({"texts": ["x"], "max_new_tokens": 2, "temperature": 0.7, "top_k": 5}, OpContext("1"))
    body = Fake.requests[-1]["body"]
    assert body["temperature"] == 0.7 and body["top_k"] == 5 and body["seed"] == out["seed"]
    engine.infer({"texts": ["x"], "max_new_tokens": 2}, OpContext("1"))
    assert "seed" not in Fake.requests[-1]["body"] and Fake.requests[-1]["body"]["top_k"] == -1


def test_the_callers_prefix_key_salts_vllms_prefix_cache_and_its_cached_count_is_reported(engine):
    Fake.cached = 48
    out = engine.infer({"texts": ["x"], "max_new_tokens": 2, "prefix_key": "k" * 32}, OpContext("1"))
    assert Fake.requests[-1]["body"]["cache_salt"] == "k" * 32
    assert out["prefix_cached_tokens"] == 48 and out["generations"][0]["prefix_cached_tokens"] == 48
    Fake.cached = 0
    engine.infer({"texts": ["x"], "max_new_tokens": 2}, OpContext("1"))
    assert "cache_salt" not in Fake.requests[-1]["body"]  # no key: vLLM's own partition
    report = engine.prefix_report()
    assert report["enabled"] and report["lookups"] == 2 and report["hits"] == 1 and report["hit_rate"] == 0.5
    assert report["cached_tokens"] == 48


def test_vllm_is_started_with_prefix_caching_unless_the_operator_turns_it_off():
    from tpu_worker.engines.vllm_process import PREFIX_CACHING, VllmProcess

    p = VllmProcess(VllmSettings(python=sys.executable), "/x", "m", "float32", 64, True)
    assert all(p.command().count(flag) == 1 for flag in PREFIX_CACHING)
    off = VllmProcess(
        VllmSettings(python=sys.executable, args=("--no-enable-prefix-caching",)), "/x", "m", "float32", 64, True
    )
    assert not any(flag in off.command() for flag in PREFIX_CACHING)
    p.stop()
    off.stop()


def test_engine_refusals_map_to_stable_codes(engine):
    Fake.status = 400
    with pytest.raises(WorkerError) as exc:
        engine.infer({"texts": ["x"], "max_new_tokens": 2}, OpContext("1"))
    assert exc.value.code == "invalid_argument"
    Fake.status = 500
    with pytest.raises(WorkerError) as exc:
        engine.infer({"texts": ["x"], "max_new_tokens": 2}, OpContext("1"))
    assert exc.value.code == "engine_unavailable" and exc.value.recoverable


def test_a_missing_vllm_environment_is_a_clear_refusal(catalog, tmp_path):
    from tpu_worker.engines.vllm_process import VllmProcess

    p = VllmProcess(VllmSettings(python=str(tmp_path / "nope")), "/x", "m", "float32", 64, True)
    with pytest.raises(WorkerError) as exc:
        p.start(CancelToken())
    assert exc.value.code == "engine_unavailable" and "setup-vllm.sh" in exc.value.message
    assert "--api-key" not in p.command()  # the key travels in the environment only
    assert p.environment()["VLLM_API_KEY"] == p.key
    p.stop()


def test_the_abort_endpoint_is_turned_on_only_for_a_vllm_that_has_it():
    from tpu_worker.engines.vllm_process import SCALE_OUT, VllmProcess

    p = VllmProcess(VllmSettings(python=sys.executable), "/x", "m", "float32", 64, True)
    assert not p.has_abort_endpoint()  # no vLLM here: an unknown flag would stop it starting
    assert SCALE_OUT not in p.command()
    p.abort_endpoint = True
    assert p.command().count(SCALE_OUT) == 1
    q = VllmProcess(VllmSettings(python=sys.executable, args=(SCALE_OUT,)), "/x", "m", "float32", 64, True)
    q.abort_endpoint = True
    assert q.command().count(SCALE_OUT) == 1
    p.stop()
    q.stop()


def test_a_benchmark_of_an_engine_model_reports_its_engine_figures(engine):
    from tpu_worker.engines.served import EngineModel

    model = EngineModel(engine.entry, engine, "cpu", "float32", "eager", "now", {"load_s": 1.5})
    args = bench_args(
        model="tiny-gpt2", work="generate", seq_lens=[8], iterations=2, warmup=0, max_new_tokens=4, temperature=0
    )
    out = model.benchmark(None, args, OpContext("1"))
    (c,) = out["configs"]
    assert c["error"] is None and c["engine"] == "vllm" and c["iterations"] == 2
    assert c["load_s"] == 1.5 and c["tokens_per_s"] > 0 and c["ttft_ms"]["p50"] > 0
    assert out["manifest"]["engine"] == "vllm"


def test_the_catalog_takes_engine_vllm_for_causal_lms_only(catalog):
    from tpu_worker.catalog import CatalogError, parse_entry

    raw = {
        "id": "m",
        "task": "tensor",
        "architecture": "mnist-cnn",
        "source": {"path": "m"},
        "format": "safetensors",
        "input": {"shape": [1]},
        "engine": "vllm",
    }
    with pytest.raises(CatalogError, match="engine"):
        parse_entry(raw, "models[0]")
    with pytest.raises(CatalogError, match="engine"):
        parse_entry({**raw, "engine": "tgi"}, "models[0]")
    assert catalog.get("tiny-gpt2").engine == "torch"
