"""What the actors will need, checked on a real cluster's nodes: the driver refuses in one line
with the fix, and the pre-check `tpu-mcp doctor` runs reports each problem (token auth, loopback,
simulated TPU hosts: a "TPU" resource with no chips and no torch_tpu behind it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from fleet_client import Driver
from test_fleet import fleet_config

from conftest import HOSTS


def test_tpu_actors_on_hosts_without_chips_are_refused_before_placement_with_the_fix(
    ray_cluster, channel, catalog_path
):
    # actor.device "auto" (the default): each actor would run its worker on the chip Ray gave it.
    d = Driver(fleet_config(ray_cluster, channel, catalog_path, actor={"device": "auto"}), ray_cluster["tmp"])
    msg = d.next(("error", "ready", "endpoint"))
    assert msg["type"] == "error", msg
    assert msg["code"] == "ray_actor_device_unavailable"
    assert 'actor.device: "cpu"' in msg["message"] and "no TPU chips" in msg["message"]
    assert "\n" not in msg["message"]
    assert d.proc.wait(60) == 2  # refused, not retried: the control plane shows fleet state "refused"


def preflight(ray_cluster, tmp, cfg: dict, module: str | None = None) -> list[dict]:
    """`python -m tpu_worker.fleet.preflight` as the doctor runs it (or run() with another module)."""
    path = tmp / f"preflight-{module or 'actor'}.json"
    path.write_text(json.dumps(cfg))
    if module is None:
        cmd = [sys.executable, "-m", "tpu_worker.fleet.preflight", "--config", str(path)]
    else:
        code = (
            "import json, sys\nfrom dataclasses import asdict\n"
            "from tpu_worker.fleet import config, preflight\nfrom tpu_worker.fleet.ray_env import set_ray_env\n"
            "cfg = config.load(sys.argv[1]); set_ray_env(cfg)\n"
            "for c in preflight.run(cfg, sys.argv[2]): print(json.dumps(asdict(c)))"
        )
        cmd = [sys.executable, "-c", code, str(path), module]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180, check=False)
    lines = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert lines, r.stderr[-2000:]
    return lines


def test_the_doctors_pre_check_reports_each_node_with_the_fix(ray_cluster, channel, catalog_path):
    tmp = ray_cluster["tmp"]
    good = preflight(ray_cluster, tmp, fleet_config(ray_cluster, channel, catalog_path))
    assert [(c["name"], c["ok"]) for c in good] == [("actor nodes", True)], good
    assert f"{HOSTS} node(s)" in good[0]["detail"]

    tpu = preflight(ray_cluster, tmp, fleet_config(ray_cluster, channel, catalog_path, actor={"device": "auto"}))
    assert [c["code"] for c in tpu] == ["ray_actor_device_unavailable"] * HOSTS, tpu
    assert all('actor.device: "cpu"' in c["detail"] for c in tpu)

    # A module the nodes cannot import stands in for a node without the worker package: the
    # check's own code travels by value, so it answers there instead of dying with the import.
    missing = preflight(ray_cluster, tmp, fleet_config(ray_cluster, channel, catalog_path), "tpu_worker_absent")
    assert [c["code"] for c in missing] == ["ray_actor_import_failed"] * HOSTS, missing
    assert all("cannot import 'tpu_worker_absent'" in c["detail"] for c in missing)
