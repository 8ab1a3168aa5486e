"""The fleet driver against a real Ray cluster (token auth, loopback, simulated TPU hosts)."""

from __future__ import annotations

import os
import signal
import time

import pytest
from fleet_client import Driver, ServeClient

from conftest import CHIPS_PER_HOST, HOSTS

CHIPS = CHIPS_PER_HOST * HOSTS


def fleet_config(ray_cluster, channel, catalog_path, **over) -> dict:
    cfg = {
        "address": ray_cluster["address"],
        "token_file": ray_cluster["token_file"],
        "placement": {"mode": "per-chip", "ready_timeout_s": 60},
        "actor": {"catalog": catalog_path, "device": "cpu", "threads": 1, "max_restarts": 2, "start_timeout_s": 90},
        "channel": {"client_ca": channel["ca"], "token_file": channel["token_file"]},
        "drain_timeout_s": 30,
    }
    for k, v in over.items():
        cfg[k] = {**cfg[k], **v} if isinstance(v, dict) and isinstance(cfg.get(k), dict) else v
    return cfg


def collect_endpoints(driver: Driver, n: int) -> dict[str, dict]:
    eps: dict[str, dict] = {}
    while len(eps) < n:
        msg = driver.next(("endpoint", "dead"))
        assert msg["type"] == "endpoint", msg
        eps[msg["name"]] = msg
    return eps


@pytest.fixture
def fleet(ray_cluster, channel, catalog_path):
    started: list[Driver] = []

    def start(**over) -> Driver:
        d = Driver(fleet_config(ray_cluster, channel, catalog_path, **over), ray_cluster["tmp"])
        started.append(d)
        return d

    yield start
    for d in started:
        assert d.stop() == 0 or d.proc.returncode is not None


def test_places_one_actor_per_chip_colocated_per_host_and_serves_inference(fleet, channel):
    d = fleet()
    ready = d.next(("ready",))
    assert ready["mode"] == "per-chip" and ready["capacity"] == CHIPS and ready["tpu_chips"] == CHIPS
    eps = collect_endpoints(d, CHIPS)
    assert sorted(eps) == [f"ray-{i}" for i in range(CHIPS)]
    # one actor per chip: every host's chips 0..k-1 each held once, the chip actors of a host together
    by_node: dict[str, list[int]] = {}
    for ep in eps.values():
        assert ep["host"] == "127.0.0.1" and len(ep["chips"]) == 1
        by_node.setdefault(ep["node"], []).extend(ep["chips"])
    assert len(by_node) == HOSTS
    assert all(sorted(chips) == list(range(CHIPS_PER_HOST)) for chips in by_node.values())
    assert len({(ep["host"], ep["port"]) for ep in eps.values()}) == CHIPS

    ep = eps["ray-0"]
    c = ServeClient(ep, channel)
    ok, _ = c.read()
    assert ok["type"] == "auth_ok"  # serve answers the auth frame before the worker's hello
    hello, _ = c.read()
    assert hello["type"] == "hello" and hello["device"]["kind"] == "cpu"
    loaded = c.call("load", {"model": "all-minilm-l6-v2"})
    assert loaded["type"] == "result", loaded
    out = c.call("infer", {"model": "all-minilm-l6-v2", "texts": ["a TPU chip placed by Ray"]})
    assert out["type"] == "result" and out["result"]["shape"] == [1, 384]
    c.close()

    # the channel is the worker's own: a wrong token is refused, and no client certificate, no TLS
    bad = ServeClient(eps["ray-1"], channel, token="x" * 32)  # ray-0 may still be ending its session
    err, _ = bad.read()
    assert err["type"] == "error" and err["error"]["code"] == "unauthorized"
    bad.close()
    with pytest.raises((OSError, ConnectionError)):
        nocert = ServeClient(eps["ray-2"], channel, client_cert=False)
        nocert.read()


def test_killed_actor_is_restarted_by_ray_and_reported_with_a_new_endpoint(fleet, ray_cluster):
    d = fleet(placement={"count": 2})
    assert d.next(("ready",))["target"] == 2
    eps = collect_endpoints(d, 2)
    old = eps["ray-1"]
    os.kill(old["pid"], signal.SIGKILL)  # the actor's process dies, as on a node fault
    lost = d.next(("lost",))
    assert lost["name"] == "ray-1" and lost["restarts"] == 1
    again = d.next(("endpoint",))
    assert again["name"] == "ray-1" and again["restarts"] == 1
    assert (again["pid"] != old["pid"] and again["port"] != old["port"]) or again["certificate"] != old["certificate"]
    # the old serve died with its actor (PR_SET_PDEATHSIG)
    deadline = time.monotonic() + 15
    while os.path.exists(f"/proc/{old['serve_pid']}") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not os.path.exists(f"/proc/{old['serve_pid']}")


def _proc_strings(pid: int, what: str) -> list[str]:
    with open(f"/proc/{pid}/{what}", "rb") as fh:
        return fh.read().decode("utf-8", "replace").split("\0")


def test_the_chip_ray_gives_an_actor_reaches_its_worker_as_visible_devices_and_device(fleet):
    # Through the real actor start-up: Ray assigns a TPU chip (TPU_VISIBLE_CHIPS in the actor),
    # the actor starts serve (which starts each connection's worker with its environment and
    # arguments) with TPU_VISIBLE_DEVICES=<chip> and --device tpu:<chip>.
    # The simulated hosts have TPU resources but no chips: the node pre-check would refuse (it
    # does, in test_preflight.py), so this test, about what happens after it, turns it off.
    d = fleet(placement={"count": 2}, actor={"device": "tpu", "preflight": False})
    d.next(("ready",))
    eps = collect_endpoints(d, 2)
    held = set()
    for ep in eps.values():
        assert len(ep["chips"]) == 1, ep
        chip = ep["chips"][0]
        held.add((ep["node"], chip))
        assert ep["device"] == f"tpu:{chip}"
        env = dict(kv.split("=", 1) for kv in _proc_strings(ep["serve_pid"], "environ") if "=" in kv)
        assert env.get("TPU_VISIBLE_DEVICES") == str(chip), env.get("TPU_VISIBLE_DEVICES")
        cmd = _proc_strings(ep["serve_pid"], "cmdline")
        assert cmd[cmd.index("--device") + 1] == f"tpu:{chip}", cmd
    assert len(held) == 2  # two actors, two different chips


def test_scale_down_drains_first_and_scale_up_places_again(fleet):
    d = fleet(placement={"count": 3})
    d.next(("ready",))
    collect_endpoints(d, 3)
    reply = d.request("scale", count=1)
    assert reply["ok"] and sorted(reply["result"]["draining"]) == ["ray-1", "ray-2"]
    drains = {d.next(("drain",))["name"] for _ in range(2)}
    assert drains == {"ray-1", "ray-2"}
    time.sleep(1)
    status = d.request("status")["result"]
    assert {a["name"]: a["state"] for a in status["actors"]} == {
        "ray-0": "up",
        "ray-1": "draining",
        "ray-2": "draining",
    }
    d.send({"op": "drained", "name": "ray-2"})
    assert d.next(("removed",))["name"] == "ray-2"
    d.send({"op": "drained", "name": "ray-1"})
    assert d.next(("removed",))["name"] == "ray-1"
    assert [a["name"] for a in d.request("status")["result"]["actors"]] == ["ray-0"]
    reply = d.request("scale", count=CHIPS + 1)
    assert not reply["ok"] and reply["error"]["code"] == "out_of_range"
    reply = d.request("scale", count=2)
    assert reply["ok"] and reply["result"]["added"] == ["ray-1"]
    assert d.next(("endpoint",))["name"] == "ray-1"


def test_slice_placement_group_places_one_actor_per_chip_of_the_slice(fleet):
    d = fleet(placement={"mode": "slice", "topology": "2x2", "accelerator_version": "v6e", "chips_per_vm": 2})
    ready = d.next(("ready", "error"))
    assert ready["type"] == "ready", ready
    assert ready["capacity"] == CHIPS
    eps = collect_endpoints(d, CHIPS)
    assert len({ep["node"] for ep in eps.values()}) == HOSTS


def test_per_host_places_one_actor_holding_each_hosts_chips(fleet):
    d = fleet(placement={"mode": "per-host"})
    ready = d.next(("ready", "error"))
    assert ready["type"] == "ready" and ready["capacity"] == HOSTS, ready
    eps = collect_endpoints(d, HOSTS)
    assert sorted(tuple(ep["chips"]) for ep in eps.values()) == [tuple(range(CHIPS_PER_HOST))] * HOSTS
    assert len({ep["node"] for ep in eps.values()}) == HOSTS


def test_a_driver_without_the_clusters_token_is_refused(fleet, ray_cluster):
    wrong = ray_cluster["tmp"] / "wrong-token"
    wrong.write_text("not-the-cluster-token-" + "0" * 20 + "\n")
    d = fleet(token_file=str(wrong))
    err = d.next(("error", "ready"))
    assert err["type"] == "error" and err["code"] == "ray_auth_refused", err
    assert d.proc.wait(30) == 2


def test_an_open_cluster_is_refused_unless_allowed_on_loopback(tmp_path, channel, catalog_path):
    """A head started with RAY_AUTH_MODE=disabled: anyone could run code on it."""
    import shutil
    import socket
    import subprocess
    import sys
    import tempfile

    short = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # Ray's socket paths must stay under 108 bytes
    with socket.socket() as s:  # a free port in this test's own network namespace
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_AUTH_TOKEN_PATH", None)
    head = subprocess.run(
        [
            os.path.join(os.path.dirname(sys.executable), "ray"),
            "start",
            "--head",
            f"--port={port}",
            "--num-cpus=0",
            "--include-dashboard=false",
            "--object-store-memory=80000000",
            f"--temp-dir={short}",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        assert head.returncode == 0, head.stderr[-2000:]
        cfg = {
            "address": f"127.0.0.1:{port}",
            "token_file": channel["token_file"],  # any token: an open cluster takes it
            "placement": {"mode": "count", "count": 0, "resources": {"CPU": 1}},
            "actor": {"catalog": catalog_path, "device": "cpu"},
            "channel": {"client_ca": channel["ca"], "token_file": channel["token_file"]},
        }
        d = Driver(cfg, tmp_path)
        err = d.next(("error", "ready"))
        assert err["type"] == "error" and err["code"] == "ray_insecure_cluster", err
        assert d.proc.wait(30) == 2
        cfg["allow_insecure_local"] = True
        d = Driver(cfg, tmp_path)
        assert d.next(("error", "ready"))["type"] == "ready"
        assert d.stop() == 0
    finally:
        # Only this head's processes, by PID: `ray stop` would stop every Ray process in this
        # namespace, the session's cluster too (the tests after this one would find it gone).
        _kill_processes_naming(short)
        shutil.rmtree(short, ignore_errors=True)


def _kill_processes_naming(path: str, wait_s: float = 20.0) -> None:
    """SIGKILLs every process whose command line names `path` (a Ray head's temp dir: its GCS,
    raylet and helpers all carry it), then waits until none is left."""
    import contextlib
    import signal

    def pids() -> list[int]:
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    if path.encode() in fh.read():
                        found.append(int(entry))
            except OSError:
                continue
        return found

    deadline = time.monotonic() + wait_s
    while (left := pids()) and time.monotonic() < deadline:
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
