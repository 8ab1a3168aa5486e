"""Where actors go: slots in placement groups that follow TPU topology, or plain resource asks.

- per-chip: one STRICT_PACK placement group per TPU host holding one {"TPU": 1} bundle per chip,
  pinned to that host by its `ray.io/node-id` label, so a host's chip actors are co-located (a
  model that spans chips later finds them on one host). One actor per bundle.
- per-host: one actor per TPU host asking {"TPU": chips_per_host} (the whole host).
- slice: a slice placement group from `ray.util.tpu.slice_placement_group` (Ray's documented,
  alpha API: it reserves the slice's head through `TPU-{pod_type}-head` and gang-places one
  bundle per host, or per chip with per="chip"), one actor per bundle.
- count: `count` actors asking `resources` each (CPU or GPU clusters, or anything custom).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from .config import Placement


class PlacementError(RuntimeError):
    pass


@dataclass
class Slot:
    """Where one actor may go: a bundle of a placement group, or free scheduling with resources."""

    resources: dict[str, float]
    pg: Any = None
    bundle: int = -1
    node: str | None = None  # the host this slot is pinned to, when known
    taken_by: str | None = None


@dataclass
class Layout:
    slots: list[Slot] = field(default_factory=list)
    groups: list[Any] = field(default_factory=list)  # placement groups to remove at shutdown
    unbounded: dict[str, float] | None = None  # count mode: any number of actors with these resources
    slice_handles: list[Any] = field(default_factory=list)

    @property
    def capacity(self) -> int | None:
        return None if self.unbounded is not None else len(self.slots)

    def free_slot(self) -> Slot | None:
        if self.unbounded is not None:
            slot = Slot(resources=dict(self.unbounded))
            self.slots.append(slot)
            return slot
        return next((s for s in self.slots if s.taken_by is None), None)


def tpu_nodes(nodes: list[dict]) -> list[dict]:
    """Alive nodes offering TPU chips, in a stable order (slice worker id, then node id)."""
    alive = [n for n in nodes if n.get("Alive") and n.get("Resources", {}).get("TPU", 0) >= 1]

    def key(n: dict) -> tuple:
        labels = n.get("Labels") or {}
        return (labels.get("ray.io/tpu-slice-name", ""), int(labels.get("ray.io/tpu-worker-id", "0") or 0), n["NodeID"])

    return sorted(alive, key=key)


def build(placement: Placement, nodes: list[dict], timeout_s: float, cpus_per_actor: float = 0.0) -> Layout:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    layout = Layout()
    if placement.mode == "count":
        layout.unbounded = dict(placement.resources)
        return layout
    if placement.mode == "slice":
        from ray.util.tpu import slice_placement_group

        # Ray's default adds {"CPU": 1} to every bundle; reserve what our actor asks for instead.
        per_bundle: dict[str, float] = {"CPU": cpus_per_actor}
        if placement.per == "chip":
            per_bundle["TPU"] = 1.0
        try:
            handle = slice_placement_group(
                topology=placement.topology,
                accelerator_version=placement.accelerator_version,
                resources_per_bundle=per_bundle,
                num_slices=placement.num_slices,
                chips_per_vm=placement.chips_per_vm,
            )
        except (ValueError, RuntimeError) as exc:
            raise PlacementError(f"could not reserve the TPU slice: {exc}") from exc
        layout.slice_handles.append(handle)
        pg = handle.placement_group
        try:
            ray.get(pg.ready(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError as exc:
            handle.shutdown()
            raise PlacementError(
                f"the slice placement group ({placement.topology} {placement.accelerator_version}) was not ready "
                f"within {timeout_s:g}s: the cluster lacks free hosts of that slice"
            ) from exc
        for i, bundle in enumerate(pg.bundle_specs):
            layout.slots.append(Slot(resources={"TPU": float(bundle.get("TPU", 0))}, pg=pg, bundle=i))
        return layout

    hosts = tpu_nodes(nodes)
    if not hosts:
        raise PlacementError(
            f'{placement.mode} placement needs nodes with the "TPU" resource and the cluster has none; '
            'use mode "count" with resources for a CPU or GPU cluster'
        )
    if placement.mode == "per-host":
        for n in hosts:
            chips = int(n["Resources"]["TPU"])
            want = placement.chips_per_host or chips
            if chips >= want:
                layout.slots.append(Slot(resources={"TPU": float(want)}, node=n["NodeID"]))
        if not layout.slots:
            raise PlacementError(f"no TPU host has {placement.chips_per_host} chips")
        return layout

    # per-chip: reserve each host's chips as one STRICT_PACK group pinned to that host.
    for n in hosts:
        chips = int(n["Resources"]["TPU"])
        node_id = n["NodeID"]
        bundles = [{"TPU": 1.0, **({"CPU": cpus_per_actor} if cpus_per_actor else {})}] * chips
        pg = placement_group(
            bundles, strategy="STRICT_PACK", bundle_label_selector=[{"ray.io/node-id": node_id}] * chips
        )
        layout.groups.append(pg)
        for i in range(chips):
            layout.slots.append(Slot(resources={"TPU": 1.0}, pg=pg, bundle=i, node=node_id))
    try:
        ray.get([pg.ready() for pg in layout.groups], timeout=timeout_s)
    except ray.exceptions.GetTimeoutError as exc:
        for pg in layout.groups:
            remove_placement_group(pg)
        raise PlacementError(
            f"could not reserve the TPU hosts' chips within {timeout_s:g}s (another job holds some of them?)"
        ) from exc
    return layout


def release(layout: Layout) -> None:
    from ray.util.placement_group import remove_placement_group

    for pg in layout.groups:
        with contextlib.suppress(Exception):  # best effort; Ray frees these with the driver anyway
            remove_placement_group(pg)
    for h in layout.slice_handles:
        with contextlib.suppress(Exception):  # best effort; Ray frees these with the driver anyway
            h.shutdown()
