"""The one actor class the fleet places: it runs the worker's `serve` for the chip Ray gave it.

Agents never choose code: the driver creates only this class, and its constructor takes plain
data (names, paths, PEM text, a token). The actor:

1. reads the chips Ray assigned (`TPU_VISIBLE_CHIPS`) and hands them to TorchTPU as
   `TPU_VISIBLE_DEVICES` for its worker (the worker then drives its one chip as `tpu:0` and
   reports the host chip index, as a local per-chip worker does);
2. makes a fresh key and self-signed certificate on this node (the key never leaves it);
3. starts `python -m tpu_worker serve` bound to this node's address on a free port, with the
   control plane's client CA and the channel token, and waits until it listens;
4. reports {host, port, certificate, device, chips, node} through `endpoint()`.

The folder holding the key, the client CA and the channel token lives only while `serve` starts:
`serve` reads all three before it listens, so the actor removes the folder as soon as the
`listening` record arrives, and on every other exit path (failed start, serve's death, stop(),
the interpreter's exit). An actor killed while running (SIGKILL from `ray.kill` or a node's
shutdown) thus leaves nothing on the node; only a kill inside the few seconds of start-up could,
and the next actor on the node sweeps folders whose owner process is gone.

If `serve` exits on its own, the actor process exits too, so Ray restarts it (bounded by
max_restarts) and the driver reports the new endpoint. `serve` gets SIGTERM when the actor's
process dies (PR_SET_PDEATHSIG), so a killed actor leaves no worker behind.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from .certs import self_signed

_PR_SET_PDEATHSIG = 1
DIR_PREFIX = "tpu-mcp-actor-"


def _sweep_orphans() -> None:
    """Removes actor folders on this node whose owner process is gone (killed during start-up)."""
    root = tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for name in os.listdir(root):
            if not name.startswith(DIR_PREFIX):
                continue
            pid = name[len(DIR_PREFIX) :].split("-", 1)[0]
            if not pid.isdigit() or os.path.exists(f"/proc/{pid}"):
                continue
            path = os.path.join(root, name)
            with contextlib.suppress(OSError):
                if os.stat(path).st_uid == os.getuid():
                    shutil.rmtree(path, ignore_errors=True)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _write_private(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def chips_from_env(value: str | None) -> list[int]:
    if not value:
        return []
    return [int(x) for x in value.split(",") if x.strip().isdigit()]


def worker_device(requested: str, chips: list[int]) -> str:
    """The `--device` for this actor's worker: the host chip index when Ray gave exactly one chip."""
    if requested in ("auto", "tpu") and len(chips) == 1:
        return f"tpu:{chips[0]}"
    if requested == "auto":
        return "tpu" if chips else "auto"
    return requested


class FleetWorker:
    """Runs one `serve` endpoint. Construct only through the driver (ray.remote(FleetWorker))."""

    def __init__(self, spec: dict[str, Any]) -> None:
        import ray

        self._spec = spec
        self._stopping = False
        self._exited = threading.Event()
        self._exit_code: int | None = None
        ctx = ray.get_runtime_context()
        self._node_id = ctx.get_node_id()
        self._chips = chips_from_env(os.environ.get("TPU_VISIBLE_CHIPS"))
        self._host = spec.get("listen_host") or ray.util.get_node_ip_address()
        self._device = worker_device(spec.get("device", "auto"), self._chips)
        _sweep_orphans()
        # The pid in the name lets a later actor tell an orphan from a live actor's folder.
        self._dir = tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-")
        atexit.register(self._remove_dir)
        cert, key = self_signed(self._host, f"tpu-mcp {spec['name']}")
        self._cert = cert.decode()
        paths = {n: os.path.join(self._dir, n) for n in ("worker.crt", "worker.key", "client-ca.crt", "token")}
        _write_private(paths["worker.crt"], cert)
        _write_private(paths["worker.key"], key)
        _write_private(paths["client-ca.crt"], spec["client_ca_pem"].encode())
        _write_private(paths["token"], spec["token"].encode() + b"\n")
        env = dict(os.environ)
        if self._chips:
            # TorchTPU binds a process to the chips in TPU_VISIBLE_DEVICES; Ray names them in
            # TPU_VISIBLE_CHIPS. Hand the worker exactly the chips Ray gave this actor.
            env["TPU_VISIBLE_DEVICES"] = ",".join(str(c) for c in self._chips)
        cmd = [
            sys.executable,
            "-m",
            "tpu_worker",
            "serve",
            "--listen",
            f"{self._host}:0",
            "--tls-cert",
            paths["worker.crt"],
            "--tls-key",
            paths["worker.key"],
            "--client-ca",
            paths["client-ca.crt"],
            "--token-file",
            paths["token"],
            "--catalog",
            spec["catalog"],
            "--device",
            self._device,
        ]
        if spec.get("threads"):
            cmd += ["--threads", str(spec["threads"])]
        cmd += list(spec.get("worker_args", ()))
        self._proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - only a prctl call, no Python state touched
        )
        self._port: int | None = None
        self._listening = threading.Event()
        threading.Thread(target=self._pump, name="serve-log", daemon=True).start()
        deadline = time.monotonic() + float(spec.get("start_timeout_s", 120))
        while not self._listening.wait(0.1):
            if self._exited.is_set() or time.monotonic() > deadline:
                self._cleanup()
                raise RuntimeError(
                    f"worker serve did not start (exit code {self._proc.poll()}); see this actor's log for its stderr"
                )

    def _pump(self) -> None:
        """Forwards serve's log to the actor's stderr and learns its port from the `listening` record."""
        assert self._proc.stderr is not None
        for raw in self._proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            sys.stderr.write(line + "\n")
            if not self._listening.is_set():
                with contextlib.suppress(ValueError, TypeError):
                    rec = json.loads(line)
                    if isinstance(rec, dict) and rec.get("msg") == "listening" and isinstance(rec.get("port"), int):
                        self._port = rec["port"]
                        # serve has read the key, CA and token: nothing on disk is needed any more.
                        self._remove_dir()
                        self._listening.set()
        self._exit_code = self._proc.wait()
        self._exited.set()
        if not self._stopping:
            # serve died under us: end this actor process so Ray restarts it and the driver
            # reports the new endpoint. A restart is counted against max_restarts.
            sys.stderr.write(f"worker serve exited with {self._exit_code}; ending the actor for Ray to restart\n")
            sys.stderr.flush()
            self._cleanup()
            os._exit(1)

    def _remove_dir(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)

    def _cleanup(self) -> None:
        self._stopping = True
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._remove_dir()

    def endpoint(self) -> dict[str, Any]:
        return {
            "name": self._spec["name"],
            "host": self._host,
            "port": self._port,
            "certificate": self._cert,
            "device": self._device,
            "chips": self._chips,
            "node": self._node_id,
            "pid": os.getpid(),
            "serve_pid": self._proc.pid,
        }

    def wait_exit(self) -> int | None:
        """Returns when serve has exited; the driver keeps one call in flight to learn of a death."""
        self._exited.wait()
        return self._exit_code

    def stop(self) -> None:
        """Stops serve on purpose (scale-down, shutdown); the driver then kills the actor."""
        self._cleanup()
