"""The driver's configuration: `runtime.ray` from the server config, checked once, frozen.

Every field is named and bounded here so that a typo is a clear start-up error, not a silently
different fleet. Paths name files on the control host (the Ray token, Ray TLS, the worker
channel's CA and token) except `actor.catalog`, which names the catalog on the cluster's nodes.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass, field
from typing import Any

MODES = ("per-chip", "per-host", "count", "slice")
TPU_CHIP_OPTIONS = (1, 2, 4, 8)  # what Ray accepts for {"TPU": n} on one actor
MAX_ACTORS = 4096


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class Placement:
    mode: str = "per-chip"
    count: int | None = None  # None: as many as the cluster (or slice) holds
    resources: dict[str, float] = field(default_factory=dict)  # count mode: per actor
    chips_per_host: int | None = None  # per-host mode; None: what each node reports
    topology: str | None = None  # slice mode, e.g. "2x4"
    accelerator_version: str | None = None  # slice mode, e.g. "v6e"
    num_slices: int = 1
    chips_per_vm: int | None = None
    per: str = "chip"  # slice mode: one actor per "chip" or per "host"
    ready_timeout_s: float = 120.0


@dataclass(frozen=True)
class Actor:
    catalog: str = ""
    device: str = "auto"  # "auto": the chip Ray gave the actor (tpu:N), else what the worker finds
    threads: int = 0
    num_cpus: float = 0.0
    max_restarts: int = 3
    start_timeout_s: float = 120.0
    listen_host: str | None = None  # None: the node's address as Ray knows it
    worker_args: tuple[str, ...] = ()
    # The node pre-check before placing (preflight.py); off only where it cannot see what the
    # actors will have (device files mounted elsewhere, a simulated host).
    preflight: bool = True


@dataclass(frozen=True)
class Channel:
    client_ca: str = ""  # CA (PEM) that signs the control plane's client certificate
    token_file: str = ""  # the worker channel token (not Ray's)


@dataclass(frozen=True)
class RayTls:
    ca: str
    cert: str
    key: str


@dataclass(frozen=True)
class FleetConfig:
    address: str
    token_file: str | None
    allow_insecure_local: bool
    tls: RayTls | None
    placement: Placement
    actor: Actor
    channel: Channel
    name_prefix: str = "ray"
    drain_timeout_s: float = 60.0
    namespace: str = "tpu-mcp"

    @property
    def address_is_loopback(self) -> bool:
        return is_loopback(self.address)


def is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]") if ":" in address else address
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _take(obj: dict, key: str, kinds: tuple[type, ...], where: str, default: Any = None) -> Any:
    if key not in obj or obj[key] is None:
        return default
    value = obj[key]
    if isinstance(value, bool) and bool not in kinds:
        raise ConfigError(f"{where}.{key} must be {' or '.join(k.__name__ for k in kinds)}, not a boolean")
    if not isinstance(value, kinds):
        raise ConfigError(f"{where}.{key} must be {' or '.join(k.__name__ for k in kinds)}")
    return value


def _no_extra(obj: dict, allowed: set[str], where: str) -> None:
    extra = sorted(set(obj) - allowed)
    if extra:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(extra)}; allowed: {', '.join(sorted(allowed))}")


def _positive_int(value: Any, where: str, *, zero: bool = False, most: int = MAX_ACTORS) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if zero else 1) or value > most:
        raise ConfigError(f"{where} must be an integer from {0 if zero else 1} to {most}")
    return value


def parse(raw: Any) -> FleetConfig:
    if not isinstance(raw, dict):
        raise ConfigError("runtime.ray must be an object")
    w = "runtime.ray"
    _no_extra(
        raw,
        {
            "address",
            "token_file",
            "allow_insecure_local",
            "tls",
            "placement",
            "actor",
            "channel",
            "name_prefix",
            "drain_timeout_s",
            "namespace",
        },
        w,
    )
    address = _take(raw, "address", (str,), w)
    if not address or ":" not in address:
        raise ConfigError(f"{w}.address must be the cluster's GCS address HOST:PORT, e.g. 10.0.0.2:6379")
    token_file = _take(raw, "token_file", (str,), w)
    insecure = _take(raw, "allow_insecure_local", (bool,), w, False)
    if not token_file and not insecure:
        raise ConfigError(
            f"{w}.token_file is required: Ray's ports run code for anyone who reaches them, so the cluster "
            "must use token auth (RAY_AUTH_MODE=token); set allow_insecure_local: true only for a loopback test cluster"
        )
    if insecure and not is_loopback(address):
        raise ConfigError(f"{w}.allow_insecure_local is only allowed for a loopback address, not {address}")
    tls = None
    if "tls" in raw and raw["tls"] is not None:
        t = _take(raw, "tls", (dict,), w)
        _no_extra(t, {"ca", "cert", "key"}, f"{w}.tls")
        parts = {k: _take(t, k, (str,), f"{w}.tls") for k in ("ca", "cert", "key")}
        if not all(parts.values()):
            raise ConfigError(f"{w}.tls needs ca, cert and key (PEM files for Ray's gRPC TLS)")
        tls = RayTls(**parts)

    p = _take(raw, "placement", (dict,), w, {})
    wp = f"{w}.placement"
    _no_extra(
        p,
        {
            "mode",
            "count",
            "resources",
            "chips_per_host",
            "topology",
            "accelerator_version",
            "num_slices",
            "chips_per_vm",
            "per",
            "ready_timeout_s",
        },
        wp,
    )
    mode = _take(p, "mode", (str,), wp, "per-chip")
    if mode not in MODES:
        raise ConfigError(f"{wp}.mode must be one of {', '.join(MODES)}")
    count = p.get("count")
    if count is not None:
        count = _positive_int(count, f"{wp}.count", zero=True)
    resources = _take(p, "resources", (dict,), wp, {})
    for k, v in resources.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise ConfigError(f"{wp}.resources.{k} must be a non-negative number")
    if mode == "count":
        if count is None:
            raise ConfigError(f"{wp}.count is required in count mode")
        num_cpus_asked = (raw.get("actor") or {}).get("num_cpus") or 0
        if not any(v > 0 for v in resources.values()) and not num_cpus_asked:
            raise ConfigError(
                f'{wp}.resources must ask for something in count mode (e.g. {{"GPU": 1}} or actor.num_cpus): '
                "an actor asking for nothing could land on any node, even a zero-resource control host"
            )
        if "TPU" in resources and resources["TPU"] not in TPU_CHIP_OPTIONS:
            raise ConfigError(f"{wp}.resources.TPU must be one of {TPU_CHIP_OPTIONS} (what Ray accepts per actor)")
    elif resources:
        raise ConfigError(f"{wp}.resources is only for count mode; {mode} derives TPU resources from the cluster")
    chips_per_host = p.get("chips_per_host")
    if chips_per_host is not None and chips_per_host not in TPU_CHIP_OPTIONS:
        raise ConfigError(f"{wp}.chips_per_host must be one of {TPU_CHIP_OPTIONS}")
    topology = _take(p, "topology", (str,), wp)
    version = _take(p, "accelerator_version", (str,), wp)
    per = _take(p, "per", (str,), wp, "chip")
    if per not in ("chip", "host"):
        raise ConfigError(f'{wp}.per must be "chip" or "host"')
    if mode == "slice" and not (topology and version):
        raise ConfigError(f'{wp}: slice mode needs topology (e.g. "2x4") and accelerator_version (e.g. "v6e")')
    chips_per_vm = p.get("chips_per_vm")
    if chips_per_vm is not None and chips_per_vm not in TPU_CHIP_OPTIONS:
        raise ConfigError(f"{wp}.chips_per_vm must be one of {TPU_CHIP_OPTIONS}")
    ready = _take(p, "ready_timeout_s", (int, float), wp, 120.0)
    placement = Placement(
        mode=mode,
        count=count,
        resources={k: float(v) for k, v in resources.items()},
        chips_per_host=chips_per_host,
        topology=topology,
        accelerator_version=version,
        num_slices=_positive_int(p.get("num_slices", 1), f"{wp}.num_slices", most=64),
        chips_per_vm=chips_per_vm,
        per=per,
        ready_timeout_s=float(ready),
    )

    a = _take(raw, "actor", (dict,), w, {})
    wa = f"{w}.actor"
    _no_extra(
        a,
        {
            "catalog",
            "device",
            "threads",
            "num_cpus",
            "max_restarts",
            "start_timeout_s",
            "listen_host",
            "worker_args",
            "preflight",
        },
        wa,
    )
    catalog = _take(a, "catalog", (str,), wa)
    if not catalog:
        raise ConfigError(f"{wa}.catalog is required: the catalog file's path on the cluster's nodes")
    device = _take(a, "device", (str,), wa, "auto")
    if device not in ("auto", "cpu", "cuda", "tpu"):
        raise ConfigError(f'{wa}.device must be "auto", "cpu", "cuda" or "tpu" (the chip index comes from Ray)')
    worker_args = _take(a, "worker_args", (list,), wa, [])
    allowed_args = ("--max-body-bytes", "--max-weight-bytes", "--tpu-eager")
    for i in range(0, len(worker_args), 2):
        if worker_args[i] not in allowed_args or i + 1 >= len(worker_args) or not isinstance(worker_args[i + 1], str):
            raise ConfigError(f"{wa}.worker_args takes pairs of {', '.join(allowed_args)} and a string value")
    num_cpus = _take(a, "num_cpus", (int, float), wa, 0)
    if num_cpus < 0:
        raise ConfigError(f"{wa}.num_cpus must be >= 0")
    actor = Actor(
        catalog=catalog,
        device=device,
        threads=_positive_int(a.get("threads", 0), f"{wa}.threads", zero=True, most=1024),
        num_cpus=float(num_cpus),
        max_restarts=_positive_int(a.get("max_restarts", 3), f"{wa}.max_restarts", zero=True, most=1000),
        start_timeout_s=float(_take(a, "start_timeout_s", (int, float), wa, 120.0)),
        listen_host=_take(a, "listen_host", (str,), wa),
        worker_args=tuple(worker_args),
        preflight=bool(_take(a, "preflight", (bool,), wa, True)),
    )

    c = _take(raw, "channel", (dict,), w, {})
    wc = f"{w}.channel"
    _no_extra(c, {"client_ca", "token_file"}, wc)
    client_ca = _take(c, "client_ca", (str,), wc)
    channel_token = _take(c, "token_file", (str,), wc)
    if not client_ca or not channel_token:
        raise ConfigError(
            f"{wc} needs client_ca (the CA that signed the control plane's client certificate) and token_file "
            "(the worker channel token): every actor's serve requires both"
        )
    prefix = _take(raw, "name_prefix", (str,), w, "ray")
    if not prefix.replace("-", "").isalnum() or len(prefix) > 32:
        raise ConfigError(f"{w}.name_prefix must be letters, digits and '-' (at most 32)")
    return FleetConfig(
        address=address,
        token_file=token_file,
        allow_insecure_local=insecure,
        tls=tls,
        placement=placement,
        actor=actor,
        channel=Channel(client_ca=client_ca, token_file=channel_token),
        name_prefix=prefix,
        drain_timeout_s=float(_take(raw, "drain_timeout_s", (int, float), w, 60.0)),
        namespace=_take(raw, "namespace", (str,), w, "tpu-mcp"),
    )


def load(path: str) -> FleetConfig:
    try:
        with open(path, encoding="utf-8") as fh:
            raw = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the fleet config {path}: {exc}") from exc
    return parse(raw)
