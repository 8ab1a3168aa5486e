"""Ray's environment for this process, set from the fleet config before Ray is imported or
connects (token auth, TLS). A leaf: the driver's entry point and the node pre-check's CLI both
use it, and neither may import the other (runtime/worker/tests/test_imports.py)."""

from __future__ import annotations

import os

from . import config as fleet_config
from .errors import StartError


def set_ray_env(cfg: fleet_config.FleetConfig) -> None:
    """Ray reads these when it is imported and when it connects; never after."""
    os.environ.pop("RAY_AUTH_TOKEN", None)  # the configured file wins over anything inherited
    if cfg.token_file:
        try:
            with open(cfg.token_file, encoding="utf-8") as fh:
                ok = bool(fh.read().strip())
        except OSError as exc:
            raise StartError("invalid_config", f"runtime.ray.token_file {cfg.token_file}: {exc}") from exc
        if not ok:
            raise StartError("invalid_config", f"runtime.ray.token_file {cfg.token_file} is empty")
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN_PATH"] = cfg.token_file
    else:
        os.environ["RAY_AUTH_MODE"] = "disabled"
        os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
    if cfg.tls:
        os.environ["RAY_USE_TLS"] = "1"
        os.environ["RAY_TLS_SERVER_CERT"] = cfg.tls.cert
        os.environ["RAY_TLS_SERVER_KEY"] = cfg.tls.key
        os.environ["RAY_TLS_CA_CERT"] = cfg.tls.ca
