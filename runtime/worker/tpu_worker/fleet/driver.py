"""The fleet driver: places FleetWorker actors, watches them, reports endpoints, scales with drain.

Control protocol (one JSON object per line; the driver's stdout ⇄ the control plane):

driver → control plane
  {"type":"ready", "ray_version", "mode", "capacity": N|null, "nodes": K, "tpu_chips": C, "target": T}
  {"type":"endpoint", "name", "host", "port", "certificate", "device", "chips", "node", "pid", "serve_pid",
   "ray_name", "restarts"}
        an actor is serving (first start or after a restart): connect to it as a remote worker
  {"type":"pending", "name", "reason"}   the actor cannot be placed yet (no free resources)
  {"type":"lost", "name", "reason", "restarts"}   the actor died; Ray is restarting it
  {"type":"dead", "name", "reason", "code"?}   Ray gave up (max_restarts used) or it could not start;
                                         `reason` is one line (a known cause names its fix, `code` says which)
  {"type":"drain", "name"}               stop routing to it and answer {"op":"drained"}
  {"type":"removed", "name"}             scale-down finished for it
  {"type":"reply", "id", "ok": true, "result"} | {"type":"reply", "id", "ok": false, "error": {code, message}}
  {"type":"error", "code", "message"}    fatal (start-up); the driver exits

control plane → driver
  {"op":"scale", "id", "count": N}       add or remove actors (removal drains first)
  {"op":"drained", "name"}               the pool has no call in flight on it any more
  {"op":"status", "id"}                  every actor with its state
  {"op":"stop"}  (or EOF on stdin)       kill every actor, release placement groups, exit 0
"""

from __future__ import annotations

import contextlib
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, GetTimeoutError, RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from .. import logs
from . import diagnose, preflight
from . import placement as plc
from .actor import FleetWorker
from .config import FleetConfig
from .errors import StartError

_RemoteWorker = ray.remote(FleetWorker)
PENDING_REPORT_S = 10.0
MAX_CONCURRENCY = 4  # endpoint/stop calls while wait_exit holds one thread


@dataclass
class Member:
    name: str
    index: int
    slot: plc.Slot
    handle: Any = None
    state: str = "starting"  # starting | up | lost | draining | removed | dead
    restarts: int = 0
    endpoint: dict | None = None
    drained: threading.Event = field(default_factory=threading.Event)
    removing: bool = False


class Driver:
    def __init__(self, cfg: FleetConfig, chan) -> None:
        self.cfg = cfg
        self.chan = chan
        self._lock = threading.RLock()
        self._members: dict[str, Member] = {}
        self._layout: plc.Layout | None = None
        self._spec_base: dict[str, Any] = {}
        self._stopping = False
        self._run_id = secrets.token_hex(4)
        self._last_error: dict[str, str] | None = None  # the last actor that died, and why

    # -- start ----------------------------------------------------------------------------------
    def connect(self) -> None:
        cfg = self.cfg
        try:
            with open(cfg.channel.client_ca, encoding="utf-8") as fh:
                client_ca = fh.read()
            with open(cfg.channel.token_file, encoding="utf-8") as fh:
                token = fh.readline().strip()
        except OSError as exc:
            raise StartError("invalid_config", f"runtime.ray.channel: {exc}") from exc
        if "BEGIN CERTIFICATE" not in client_ca or len(token) < 16:
            raise StartError(
                "invalid_config",
                "runtime.ray.channel.client_ca must be a PEM certificate and token_file a token of 16+ characters",
            )
        a = cfg.actor
        self._spec_base = {
            "client_ca_pem": client_ca,
            "token": token,
            "catalog": a.catalog,
            "device": a.device,
            "threads": a.threads,
            "listen_host": a.listen_host,
            "start_timeout_s": a.start_timeout_s,
            "worker_args": list(a.worker_args),
        }
        try:
            ray.init(address=cfg.address, namespace=cfg.namespace, log_to_driver=True, logging_level="warning")
        except ConnectionError as exc:
            raise StartError("ray_unreachable", f"cannot connect to the Ray cluster at {cfg.address}: {exc}") from exc
        nodes = ray.nodes()
        self._preflight(nodes)
        try:
            self._layout = plc.build(cfg.placement, nodes, cfg.placement.ready_timeout_s, cfg.actor.num_cpus)
        except plc.PlacementError as exc:
            raise StartError("ray_placement_failed", str(exc)) from exc
        capacity = self._layout.capacity
        target = cfg.placement.count if cfg.placement.count is not None else capacity or 0
        if capacity is not None and target > capacity:
            plc.release(self._layout)
            raise StartError(
                "ray_placement_failed",
                f"runtime.ray.placement.count {target} is more than the {capacity} slot(s) the cluster offers",
            )
        self.chan.emit(
            {
                "type": "ready",
                "ray_version": ray.__version__,
                "mode": cfg.placement.mode,
                "capacity": capacity,
                "nodes": sum(1 for n in nodes if n.get("Alive")),
                "tpu_chips": int(sum(n.get("Resources", {}).get("TPU", 0) for n in nodes if n.get("Alive"))),
                "target": target,
            }
        )
        self.scale(target)

    def _preflight(self, nodes: list[dict]) -> None:
        """Refuses, in one line with the fix, a cluster where every actor would die (the worker
        package missing on a node) or serve a device its node lacks (a TPU on a host without one)."""
        if not self.cfg.actor.preflight:
            logs.warn("actor pre-check skipped (runtime.ray.actor.preflight is false)")
            return
        bad = [c for c in preflight.cluster_checks(self.cfg, nodes) if c.code == "ray_actor_device_unavailable"]
        if not bad:
            bad, silent, _ = preflight.node_checks(self.cfg, nodes)
            if silent:
                logs.warn("nodes did not answer the actor pre-check; placing anyway", nodes=silent)
        if bad:
            raise StartError(bad[0].code or "ray_actor_check_failed", "; ".join(c.detail for c in bad))

    # -- actors ---------------------------------------------------------------------------------
    def _options(self, name: str, slot: plc.Slot) -> dict[str, Any]:
        resources = dict(slot.resources)
        num_cpus = resources.pop("CPU", self.cfg.actor.num_cpus)
        num_gpus = resources.pop("GPU", 0)
        opts: dict[str, Any] = {
            # Unique per driver run, so two control planes on one cluster never collide.
            "name": f"{name}@{self._run_id}",
            "max_restarts": self.cfg.actor.max_restarts,
            "max_task_retries": 0,
            "max_concurrency": MAX_CONCURRENCY,
            "num_cpus": num_cpus,
            "num_gpus": num_gpus,
            "resources": resources,
        }
        if slot.pg is not None:
            opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=slot.pg, placement_group_bundle_index=slot.bundle
            )
        elif slot.node is not None:
            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=slot.node, soft=False)
        return opts

    def _free_name(self) -> tuple[str, int]:
        used = {m.index for m in self._members.values()}
        i = 0
        while i in used:
            i += 1
        return f"{self.cfg.name_prefix}-{i}", i

    def _launch(self) -> Member | None:
        assert self._layout is not None
        slot = self._layout.free_slot()
        if slot is None:
            return None
        name, index = self._free_name()
        slot.taken_by = name
        m = Member(name=name, index=index, slot=slot)
        spec = {**self._spec_base, "name": name}
        m.handle = _RemoteWorker.options(**self._options(name, slot)).remote(spec)
        self._members[name] = m
        threading.Thread(target=self._watch, args=(m,), name=f"watch-{name}", daemon=True).start()
        return m

    def _watch(self, m: Member) -> None:
        """Follows one actor for its whole life: up → (lost → up)* → removed | dead."""
        pending_since = time.monotonic()
        reported_pending = False
        while not m.removing and not self._stopping:
            ref = m.handle.endpoint.remote()
            try:
                while True:
                    try:
                        ep = ray.get(ref, timeout=PENDING_REPORT_S)
                        break
                    except GetTimeoutError:
                        if m.removing or self._stopping:
                            return
                        if not reported_pending and time.monotonic() - pending_since > PENDING_REPORT_S:
                            reported_pending = True
                            self.chan.emit(
                                {"type": "pending", "name": m.name, "reason": "waiting for Ray to place or start it"}
                            )
            except ActorUnavailableError:
                time.sleep(0.5)
                continue
            except RayActorError as exc:
                self._gone(m, exc)
                return
            reported_pending = False
            with self._lock:
                if m.removing:
                    return
                if m.state != "draining":
                    m.state = "up"
                m.endpoint = ep
            self.chan.emit({"type": "endpoint", **ep, "ray_name": f"{m.name}@{self._run_id}", "restarts": m.restarts})
            logs.info("actor serving", name=m.name, host=ep["host"], port=ep["port"], device=ep["device"])
            try:
                ray.get(m.handle.wait_exit.remote())
            except ActorUnavailableError:
                pass
            except RayActorError as exc:
                if isinstance(exc, ActorDiedError) and not self._may_restart(m):
                    self._gone(m, exc)
                    return
                if m.removing or self._stopping:
                    return
            with self._lock:
                if m.removing or self._stopping:
                    return
                m.restarts += 1
                if m.state != "draining":
                    m.state = "lost"
                m.endpoint = None
            pending_since = time.monotonic()
            self.chan.emit(
                {"type": "lost", "name": m.name, "reason": "actor died; Ray restarts it", "restarts": m.restarts}
            )

    def _may_restart(self, m: Member) -> bool:
        return m.restarts < self.cfg.actor.max_restarts

    def _gone(self, m: Member, exc: BaseException) -> None:
        with self._lock:
            if m.removing or self._stopping:
                return
            m.state = "dead"
            m.slot.taken_by = None
            self._members.pop(m.name, None)
        code, reason = diagnose.reason(str(exc) or type(exc).__name__, preflight.device_label(self.cfg))
        with self._lock:
            self._last_error = {"name": m.name, "reason": reason, **({"code": code} if code else {})}
        logs.warn("actor dead", name=m.name, reason=reason, code=code)
        self.chan.emit({"type": "dead", "name": m.name, "reason": reason, **({"code": code} if code else {})})

    # -- scale ----------------------------------------------------------------------------------
    def scale(self, count: int) -> dict[str, Any]:
        with self._lock:
            live = sorted(
                (m for m in self._members.values() if m.state not in ("draining", "removed", "dead")),
                key=lambda m: m.index,
            )
            capacity = self._layout.capacity if self._layout else 0
            if capacity is not None and count > capacity:
                raise StartError(
                    "out_of_range",
                    f"the fleet can hold at most {capacity} worker(s) ({self.cfg.placement.mode} placement "
                    "over the chips it reserved); add TPU hosts to the cluster and restart the fleet",
                )
            added, draining = [], []
            for _ in range(count - len(live)):
                m = self._launch()
                if m is None:
                    break
                added.append(m.name)
            for m in reversed(live[count:]) if count < len(live) else []:
                m.state = "draining"
                draining.append(m.name)
                threading.Thread(target=self._remove, args=(m,), name=f"remove-{m.name}", daemon=True).start()
        for name in draining:
            self.chan.emit({"type": "drain", "name": name})
        return {"target": count, "added": added, "draining": draining}

    def _remove(self, m: Member) -> None:
        if not m.drained.wait(self.cfg.drain_timeout_s):
            logs.warn("drain timed out; removing anyway", name=m.name, timeout_s=self.cfg.drain_timeout_s)
        with self._lock:
            m.removing = True
        with contextlib.suppress(Exception):  # best effort; Ray frees these with the driver anyway
            ray.get(m.handle.stop.remote(), timeout=30)
        ray.kill(m.handle, no_restart=True)
        with self._lock:
            m.state = "removed"
            m.slot.taken_by = None
            if self._layout is not None and self._layout.unbounded is not None and m.slot in self._layout.slots:
                self._layout.slots.remove(m.slot)
            self._members.pop(m.name, None)
        self.chan.emit({"type": "removed", "name": m.name})

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {
                "capacity": self._layout.capacity if self._layout else None,
                "last_error": self._last_error,
                "actors": [
                    {
                        "name": m.name,
                        "ray_name": f"{m.name}@{self._run_id}",
                        "state": m.state,
                        "restarts": m.restarts,
                        "endpoint": None
                        if m.endpoint is None
                        else {k: m.endpoint[k] for k in ("host", "port", "device", "chips", "node", "pid")},
                    }
                    for m in sorted(self._members.values(), key=lambda m: m.index)
                ],
            }

    # -- control loop ---------------------------------------------------------------------------
    def serve(self, inp: IO[bytes]) -> int:
        for raw in inp:
            try:
                msg = json.loads(raw)
                if not isinstance(msg, dict):
                    raise ValueError("not an object")
            except ValueError:
                self.chan.emit(
                    {
                        "type": "reply",
                        "id": None,
                        "ok": False,
                        "error": {"code": "protocol_error", "message": "each line must be a JSON object"},
                    }
                )
                continue
            op, rid = msg.get("op"), msg.get("id")
            if op == "stop":
                break
            try:
                if op == "scale":
                    count = msg.get("count")
                    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                        raise StartError("invalid_argument", "scale needs count: a non-negative integer")
                    result: Any = self.scale(count)
                elif op == "drained":
                    with self._lock:
                        m = self._members.get(str(msg.get("name")))
                    if m is not None:
                        m.drained.set()
                    continue
                elif op == "status":
                    result = self.status()
                else:
                    raise StartError("invalid_argument", f"unknown op {op!r}; use scale, drained, status or stop")
            except StartError as exc:
                self.chan.emit(
                    {"type": "reply", "id": rid, "ok": False, "error": {"code": exc.code, "message": exc.message}}
                )
                continue
            self.chan.emit({"type": "reply", "id": rid, "ok": True, "result": result})
        self.shutdown()
        return 0

    def shutdown(self) -> None:
        with self._lock:
            self._stopping = True
            members = list(self._members.values())
        for m in members:
            with contextlib.suppress(Exception):  # best effort; Ray frees these with the driver anyway
                ray.kill(m.handle, no_restart=True)
        if self._layout is not None:
            plc.release(self._layout)
        ray.shutdown()
        logs.info("fleet driver stopped", actors=len(members))
