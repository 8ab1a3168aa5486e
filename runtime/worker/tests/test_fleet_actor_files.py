"""The fleet actor's private files (its key, the control plane's CA, the channel token) never
outlive the actor on its node, whatever ends it. The actor runs in a process of its own with a
stand-in for the `ray` module (only the two calls the constructor makes) and a real `serve`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

WORKER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ACTOR = textwrap.dedent(
    """
    import json, os, signal, sys, types
    ray = types.ModuleType("ray")
    ray.get_runtime_context = lambda: types.SimpleNamespace(get_node_id=lambda: "node-1")
    ray.util = types.SimpleNamespace(get_node_ip_address=lambda: "127.0.0.1")
    sys.modules["ray"] = ray
    from tpu_worker.fleet.actor import FleetWorker
    from tpu_worker.fleet.certs import self_signed
    ca, _ = self_signed("127.0.0.1", "control-plane CA")
    spec = {"name": "a0", "catalog": sys.argv[1], "client_ca_pem": ca.decode(), "token": "t" * 32,
            "device": "cpu", "listen_host": "127.0.0.1", "start_timeout_s": 60}
    w = FleetWorker(spec)
    print(json.dumps({"dir": w._dir, "exists": os.path.exists(w._dir), **w.endpoint()}), flush=True)
    how = sys.argv[2]
    if how == "stop":
        w.stop()
        print(json.dumps({"stopped": True}), flush=True)
    elif how == "exit":
        sys.exit(0)
    signal.pause()
    """
)


def _start(tmp_path, catalog_path, how: str) -> tuple[subprocess.Popen, dict]:
    import json

    env = {**os.environ, "PYTHONPATH": WORKER_DIR, "TMPDIR": str(tmp_path)}
    p = subprocess.Popen(
        [sys.executable, "-c", ACTOR, catalog_path, how],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    line = p.stdout.readline()
    assert line, "the actor did not start"
    return p, json.loads(line)


def _actor_dirs(tmp_path) -> list[str]:
    return [n for n in os.listdir(tmp_path) if n.startswith("tpu-mcp-actor-")]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("how", ["sigkill", "sigterm", "exit", "stop"])
def test_no_key_or_token_is_left_on_the_node(tmp_path, catalog_path, how):
    p, ep = _start(tmp_path, catalog_path, how)
    try:
        assert ep["dir"].startswith(str(tmp_path)) and ep["port"]
        # The folder is gone as soon as serve listens: serve holds what it needs in memory.
        assert not ep["exists"], "the key and token stayed on disk while the actor ran"
        if how == "sigkill":
            p.send_signal(signal.SIGKILL)  # ray.kill, or the node shutting down
        elif how == "sigterm":
            p.send_signal(signal.SIGTERM)
        elif how == "stop":
            assert p.stdout.readline()
            p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert _actor_dirs(tmp_path) == []


def test_a_folder_orphaned_during_start_up_is_swept_by_the_next_actor(tmp_path, catalog_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = tmp_path / f"tpu-mcp-actor-{dead.pid}-xyz"
    orphan.mkdir()
    (orphan / "worker.key").write_text("secret")
    live = tmp_path / f"tpu-mcp-actor-{os.getpid()}-abc"  # a live process's folder stays
    live.mkdir()
    p, _ = _start(tmp_path, catalog_path, "sigkill")
    p.kill()
    p.wait()
    assert _actor_dirs(tmp_path) == [live.name]
