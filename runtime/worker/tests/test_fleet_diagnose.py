"""The fleet's failures in one line with the fix, and the actor pre-check, without a Ray cluster."""

from __future__ import annotations

import json
import os

import pytest

from tpu_worker.fleet import config as fc
from tpu_worker.fleet import diagnose, preflight
from tpu_worker.fleet.errors import StartError

BASE = {
    "address": "10.0.0.2:6379",
    "token_file": "/etc/tpu-mcp/ray-token",
    "actor": {"catalog": "/srv/catalog.json"},
    "channel": {"client_ca": "/etc/tpu-mcp/ca.crt", "token_file": "/etc/tpu-mcp/worker-token"},
}

# What Ray 2.60 raised for an actor on a node without the package (seen in a loopback test
# cluster whose nodes lacked runtime/worker; the driver's stderr got the same again per actor).
RAY_IMPORT_DEATH = """The actor died because of an error raised in its creation task, \
ray::FleetWorker.__init__() (pid=26255, ip=127.0.0.1, actor_id=d7842c7d00e975f855781d6201000000, \
repr=<tpu_worker.fleet.actor.FunctionActorManager._create_fake_actor_class.<locals>.TemporaryActor object>)
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
RuntimeError: The actor with name FleetWorker failed to import on the worker. This may be because needed \
library dependencies are not installed in the worker environment:

ray::FleetWorker.__init__() (pid=26255, ip=127.0.0.1, actor_id=d7842c7d00e975f855781d6201000000)
                  ^^^^^^^^^^^^^^^^^^^^^^^^^^^
ModuleNotFoundError: No module named 'tpu_worker'
"""

WORKER_DEVICE_ERROR = (
    '{"type":"error","id":null,"error":{"code":"unsupported_device","message":"--device tpu was requested but '
    "torch_tpu is not usable: import failed: ModuleNotFoundError: No module named 'torch_tpu'. Start the worker "
    'with --device auto or install the backend.","recoverable":false}}'
)


def cfg(**over) -> fc.FleetConfig:
    raw = json.loads(json.dumps(BASE))
    for k, v in over.items():
        raw[k] = {**raw.get(k, {}), **v} if isinstance(v, dict) else v
    return fc.parse(raw)


def node(nid: str, **res) -> dict:
    return {"NodeID": nid, "Alive": True, "NodeManagerAddress": "10.0.0.9", "Resources": {"CPU": 1.0, **res}}


def test_an_import_death_is_one_line_naming_the_module_and_the_fix():
    code, line = diagnose.reason(RAY_IMPORT_DEATH, "auto")
    assert code == "ray_actor_import_failed"
    assert "\n" not in line and "'tpu_worker'" in line
    assert "pip install ./runtime/worker" in line and "PYTHONPATH" in line


def test_a_tpu_on_a_host_without_one_says_to_set_device_cpu():
    code, line = diagnose.reason(WORKER_DEVICE_ERROR, "auto")
    assert code == "ray_actor_device_unavailable"
    assert 'actor.device: "cpu"' in line and "add TPU hosts" in line
    assert "torch_tpu is not usable" in line and "\n" not in line
    assert "Start the worker with --device auto" not in line  # the worker's advice does not apply to an actor


def test_an_unknown_death_keeps_its_last_informative_line():
    code, line = diagnose.reason('Traceback (most recent call last):\n  File "x.py", line 1\nValueError: boom\n', "cpu")
    assert code is None and line == "ValueError: boom"


@pytest.mark.parametrize(
    ("over", "kind"),
    [
        ({}, "tpu"),  # per-chip with device auto: Ray hands a chip, the worker gets --device tpu:N
        ({"actor": {"device": "cpu"}}, "cpu"),
        ({"placement": {"mode": "count", "count": 2, "resources": {"CPU": 1}}}, "auto"),
        ({"placement": {"mode": "count", "count": 2, "resources": {"TPU": 1}}}, "tpu"),
        ({"actor": {"device": "tpu"}, "placement": {"mode": "count", "count": 1, "resources": {"CPU": 1}}}, "tpu"),
    ],
)
def test_the_device_the_actors_will_ask_for(over, kind):
    assert preflight.device_kind(cfg(**over)) == kind


def test_a_cluster_without_tpu_resources_is_refused_for_tpu_actors_with_the_fix():
    bad = preflight.cluster_checks(cfg(), [node("a"), node("b")])
    assert [c.code for c in bad] == ["ray_actor_device_unavailable"]
    assert 'actor.device: "cpu"' in bad[0].detail and "device 'tpu (actor.device \"auto\")'" in bad[0].detail
    ok = cfg(actor={"device": "cpu"}, placement={"mode": "count", "count": 2, "resources": {"CPU": 1}})
    assert preflight.cluster_checks(ok, [node("a")]) == []
    assert preflight.candidate_nodes(cfg(), [node("a"), node("t", TPU=4.0)])[0]["NodeID"] == "t"


def test_node_facts_name_a_missing_package_a_missing_tpu_and_a_missing_catalog(tmp_path):
    facts = preflight.node_facts("tpu_worker_not_installed_here", "cpu", str(tmp_path / "nope.json"))
    assert facts["import_error"] == "ModuleNotFoundError: No module named 'tpu_worker_not_installed_here'"
    assert facts["catalog_missing"] is True and facts["device_error"] is None
    cat = tmp_path / "catalog.json"
    cat.write_text("{}")
    facts = preflight.node_facts(preflight.ACTOR_MODULE, "tpu", str(cat), preflight.SERVE_NEEDS)
    assert facts["import_error"] is None and facts["catalog_missing"] is False
    if not any(os.path.exists(p) for p in ("/dev/accel0", "/dev/vfio/0")):
        assert "no TPU chips" in facts["device_error"]
    facts = preflight.node_facts("tpu_worker", "cpu", "", ("torch", "torch_not_on_this_node"))
    assert facts["import_error"] == "ModuleNotFoundError: No module named 'torch_not_on_this_node'"


def test_the_driver_refuses_to_place_actors_that_would_die_and_says_why(monkeypatch):
    from tpu_worker.fleet import driver as drv

    line = diagnose.import_fix("tpu_worker")
    monkeypatch.setattr(
        preflight,
        "node_checks",
        lambda c, nodes, **_: (
            [preflight.Check("actor import", False, f"node n1: {line}", "ray_actor_import_failed")],
            [],
            1,
        ),
    )
    d = drv.Driver(cfg(actor={"device": "cpu"}), chan=None)
    with pytest.raises(StartError) as err:
        d._preflight([node("n1", TPU=2.0)])
    assert err.value.code == "ray_actor_import_failed" and "'tpu_worker'" in err.value.message
    # device tpu on a cluster without TPU resources: refused before any Ray task
    d = drv.Driver(cfg(), chan=None)
    with pytest.raises(StartError) as err:
        d._preflight([node("n1")])
    assert err.value.code == "ray_actor_device_unavailable"


def test_a_dead_actor_is_reported_in_one_line_with_its_fix_and_kept_in_the_status():
    from tpu_worker.fleet import driver as drv
    from tpu_worker.fleet.placement import Slot

    sent: list[dict] = []

    class Chan:
        def emit(self, msg: dict) -> None:
            sent.append(msg)

    d = drv.Driver(cfg(), chan=Chan())
    m = drv.Member(name="ray-0", index=0, slot=Slot(resources={"TPU": 1.0}))
    d._members["ray-0"] = m
    d._gone(m, RuntimeError("\x1b[36mray::FleetWorker.__init__()\x1b[39m " + RAY_IMPORT_DEATH))
    assert sent == [
        {
            "type": "dead",
            "name": "ray-0",
            "reason": diagnose.import_fix("tpu_worker"),
            "code": "ray_actor_import_failed",
        }
    ]
    assert d.status()["last_error"]["code"] == "ray_actor_import_failed"
