"""What the actors will need on the nodes, checked before any actor is placed (the driver) and by
`tpu-mcp doctor`.

Per node that could host an actor: the worker package imports there (Ray imports the actor class
by name, so a node without it kills every actor placed on it), the device the actors will ask for
exists there, and `actor.catalog` is a file there. Each node is asked by a tiny Ray task with no
resources, pinned to it, in the environment the actors get (the driver sets no runtime_env: the
node's own Python and PYTHONPATH). The task's code travels by value, so it runs even where our
package is missing and can say so.

As a script (`python -m tpu_worker.fleet.preflight --config FILE`, Ray's auth variables set as the
driver sets them): one JSON line per check, {"name", "ok", "detail"}.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from typing import Any

from . import diagnose
from .config import FleetConfig

NODE_TIMEOUT_S = 60.0
ACTOR_MODULE = "tpu_worker.fleet.actor"  # what Ray imports on the node for the actor class
SERVE_NEEDS = ("torch", "cryptography")  # what the actor's serve and its worker import there


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    code: str | None = None


def device_kind(cfg: FleetConfig) -> str:
    """The device the actors will ask for: "tpu", "cuda", "cpu", or "auto" (whatever the node has)."""
    d = cfg.actor.device
    for kind in ("tpu", "cuda", "cpu"):
        if d == kind or d.startswith(kind + ":"):
            return kind
    if cfg.placement.mode != "count" or "TPU" in cfg.placement.resources:
        return "tpu"  # actor.device auto with a chip from Ray: the worker gets --device tpu:N
    return "auto"


def device_label(cfg: FleetConfig) -> str:
    """The device as the operator reads it in a message: `tpu (actor.device "auto")`."""
    kind = device_kind(cfg)
    return kind if cfg.actor.device == kind else f'{kind} (actor.device "{cfg.actor.device}")'


def candidate_nodes(cfg: FleetConfig, nodes: list[dict]) -> list[dict]:
    """Alive nodes an actor may land on."""
    alive = [n for n in nodes if n.get("Alive")]
    if cfg.placement.mode != "count":
        return [n for n in alive if n.get("Resources", {}).get("TPU", 0) >= 1]
    want = dict(cfg.placement.resources)
    if cfg.actor.num_cpus:
        want.setdefault("CPU", cfg.actor.num_cpus)
    return [n for n in alive if all(n.get("Resources", {}).get(k, 0) >= v for k, v in want.items())]


def cluster_checks(cfg: FleetConfig, nodes: list[dict]) -> list[Check]:
    """What the node list alone tells: is there anywhere the actors can go, with the device they ask for?"""
    kind = device_kind(cfg)
    hosts = candidate_nodes(cfg, nodes)
    if kind == "tpu" and not any(n.get("Resources", {}).get("TPU", 0) >= 1 for n in hosts):
        return [
            Check(
                "actor device",
                False,
                diagnose.device_fix(device_label(cfg), 'no node of the cluster has the "TPU" resource'),
                "ray_actor_device_unavailable",
            )
        ]
    if not hosts:
        asked = cfg.placement.resources or {"CPU": cfg.actor.num_cpus}
        return [Check("actor nodes", False, f"no alive node offers what each actor asks for ({asked})")]
    return []


def node_facts(module: str, kind: str, catalog: str, needs: tuple[str, ...] = ()) -> dict[str, Any]:
    """Runs ON a node (by value: no import of ours at module level). Plain facts, never raises.
    `module` is imported as Ray would import the actor class; `needs` (what its `serve` and worker
    import later) are only looked up, since importing torch takes seconds."""
    import glob
    import importlib
    import importlib.util
    import os
    import sys as _sys

    facts: dict[str, Any] = {"python": _sys.executable, "import_error": None, "device_error": None}
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any failure is what we report
        facts["import_error"] = f"{type(exc).__name__}: {exc}"
    for name in needs:
        if facts["import_error"] is None and importlib.util.find_spec(name) is None:
            facts["import_error"] = f"ModuleNotFoundError: No module named '{name}'"
    if kind == "tpu":
        chips = glob.glob("/dev/accel*") + [p for p in glob.glob("/dev/vfio/*") if p.rsplit("/", 1)[-1].isdigit()]
        missing = []
        if not chips:
            missing.append("no TPU chips (/dev/accel*, /dev/vfio/N)")
        if importlib.util.find_spec("torch_tpu") is None:
            missing.append("torch_tpu is not installed")
        if missing:
            facts["device_error"] = "; ".join(missing)
    facts["catalog_missing"] = bool(catalog) and not os.path.isfile(catalog)
    return facts


def _node_label(n: dict) -> str:
    return f"{n.get('NodeManagerAddress', '?')} ({str(n.get('NodeID', '?'))[:8]})"


def node_checks(cfg: FleetConfig, nodes: list[dict], module: str = ACTOR_MODULE, timeout_s: float = NODE_TIMEOUT_S):
    """One Ray task per candidate node (ray is initialised by the caller); returns the failed checks
    and the nodes that did not answer in time."""
    import ray
    from ray import cloudpickle
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # node_facts must run without our package
    remote = ray.remote(num_cpus=0, max_retries=0)(node_facts)
    kind = device_kind(cfg)
    hosts = candidate_nodes(cfg, nodes)
    refs = [
        remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n["NodeID"], soft=False)).remote(
            module, kind, cfg.actor.catalog, SERVE_NEEDS
        )
        for n in hosts
    ]
    bad: list[Check] = []
    silent: list[str] = []
    for n, ref in zip(hosts, refs, strict=True):
        where = _node_label(n)
        try:
            facts = ray.get(ref, timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            silent.append(where)
            ray.cancel(ref, force=True)
            continue
        except Exception as exc:  # noqa: BLE001 - the task itself failed on the node: say why in one line
            code, line = diagnose.reason(str(exc), device_label(cfg))
            bad.append(Check("actor import", False, f"node {where}: {line}", code or "ray_actor_check_failed"))
            continue
        if facts["import_error"]:
            code, line = diagnose.reason(facts["import_error"], device_label(cfg))
            bad.append(Check("actor import", False, f"node {where}: {line}", code or "ray_actor_import_failed"))
        if facts["device_error"]:
            bad.append(
                Check(
                    "actor device",
                    False,
                    f"node {where}: {diagnose.device_fix(device_label(cfg), facts['device_error'])}",
                    "ray_actor_device_unavailable",
                )
            )
        if facts["catalog_missing"]:
            bad.append(
                Check(
                    "actor catalog",
                    False,
                    f"node {where}: runtime.ray.actor.catalog {cfg.actor.catalog} is not a file there "
                    "(it names the catalog on the nodes)",
                    "ray_actor_catalog_missing",
                )
            )
    return bad, silent, len(hosts)


def run(cfg: FleetConfig, module: str = ACTOR_MODULE) -> list[Check]:
    """Every check, for the doctor (ray.init here; the caller set Ray's auth variables)."""
    import ray

    ray.init(address=cfg.address, namespace=f"{cfg.namespace}-doctor", log_to_driver=False, logging_level="error")
    try:
        nodes = ray.nodes()
        bad = cluster_checks(cfg, nodes)
        if bad:
            return bad
        failed, silent, n = node_checks(cfg, nodes, module)
        out = list(failed)
        if silent:
            out.append(Check("actor nodes", False, f"no answer within {NODE_TIMEOUT_S:g}s from {', '.join(silent)}"))
        if not out:
            kind = device_kind(cfg)
            out.append(
                Check(
                    "actor nodes",
                    True,
                    f"{n} node(s) where actors may go import the worker package"
                    + (", have TPU chips and torch_tpu" if kind == "tpu" else f" (actor device {cfg.actor.device})")
                    + (" and hold actor.catalog" if cfg.actor.catalog else ""),
                )
            )
        return out
    finally:
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    from . import config as fleet_config
    from .errors import StartError
    from .ray_env import set_ray_env

    p = argparse.ArgumentParser(prog="python -m tpu_worker.fleet.preflight")
    p.add_argument("--config", required=True, help="JSON file: the runtime.ray section, as the driver gets it")
    args = p.parse_args(argv)
    try:
        cfg = fleet_config.load(args.config)
        set_ray_env(cfg)
        checks = run(cfg)
    except (fleet_config.ConfigError, StartError) as exc:
        checks = [Check("actor nodes", False, str(exc))]
    except Exception as exc:  # noqa: BLE001 - the doctor shows one line, not a traceback
        checks = [
            Check("actor nodes", False, f"could not run the check on the cluster: {diagnose.last_line(str(exc))}")
        ]
    for c in checks:
        print(json.dumps(asdict(c)), flush=True)
    return 0 if all(c.ok for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
