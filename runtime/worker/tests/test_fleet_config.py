"""The fleet driver's config and the actor's chip hand-over, without Ray (the Ray suite is tests_ray)."""

from __future__ import annotations

import pytest

from tpu_worker.fleet import config as fc
from tpu_worker.fleet.actor import chips_from_env, worker_device

BASE = {
    "address": "10.0.0.2:6379",
    "token_file": "/etc/tpu-mcp/ray-token",
    "actor": {"catalog": "/srv/catalog.json"},
    "channel": {"client_ca": "/etc/tpu-mcp/ca.crt", "token_file": "/etc/tpu-mcp/worker-token"},
}


def with_(**over):
    return {**BASE, **over}


def test_defaults_place_one_actor_per_chip_with_bounded_restarts():
    cfg = fc.parse(BASE)
    assert cfg.placement.mode == "per-chip" and cfg.placement.count is None
    assert cfg.actor.max_restarts == 3 and cfg.actor.device == "auto"
    assert not cfg.allow_insecure_local and cfg.tls is None


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ({k: v for k, v in BASE.items() if k != "token_file"}, "token_file is required"),
        (with_(token_file=None, allow_insecure_local=True, address="10.0.0.2:6379"), "only allowed for a loopback"),
        (with_(placement={"mode": "count"}), "count is required in count mode"),
        (with_(placement={"mode": "count", "count": 2}), "must ask for something in count mode"),
        (with_(placement={"mode": "count", "count": 2, "resources": {"TPU": 3}}), "must be one of (1, 2, 4, 8)"),
        (with_(placement={"mode": "per-chip", "resources": {"GPU": 1}}), "only for count mode"),
        (with_(placement={"mode": "slice", "topology": "2x4"}), "slice mode needs topology"),
        (with_(placement={"mode": "everywhere"}), "mode must be one of"),
        (with_(actor={"catalog": "/c.json", "worker_args": ["--catalog", "/evil.json"]}), "worker_args takes pairs"),
        (with_(actor={"catalog": "/c.json", "device": "tpu:3"}), "the chip index comes from Ray"),
        (with_(channel={"client_ca": "/ca.crt"}), "needs client_ca"),
        (with_(surprise=1), "unknown field(s) surprise"),
        (with_(tls={"ca": "/ca"}), "tls needs ca, cert and key"),
    ],
)
def test_bad_config_is_refused_with_what_to_do(raw, fragment):
    with pytest.raises(fc.ConfigError) as exc:
        fc.parse(raw)
    assert fragment in str(exc.value)


def test_insecure_only_on_loopback():
    cfg = fc.parse(with_(token_file=None, allow_insecure_local=True, address="127.0.0.1:6379"))
    assert cfg.allow_insecure_local and cfg.address_is_loopback
    assert fc.is_loopback("localhost:1") and fc.is_loopback("[::1]:6379") and not fc.is_loopback("10.1.2.3:6379")


def test_the_chip_ray_gave_becomes_the_workers_device():
    assert chips_from_env("3") == [3] and chips_from_env("0,1,2,3") == [0, 1, 2, 3] and chips_from_env(None) == []
    assert worker_device("auto", [3]) == "tpu:3"  # one chip: the worker serves host chip 3
    assert worker_device("auto", [0, 1, 2, 3]) == "tpu"  # a whole host: the worker's own choice among them
    assert worker_device("auto", []) == "auto"  # a CPU/GPU actor
    assert worker_device("cpu", [1]) == "cpu"  # simulated TPU hosts in tests run the CPU worker
