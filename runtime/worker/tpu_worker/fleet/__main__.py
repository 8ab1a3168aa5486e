"""`python -m tpu_worker.fleet --config FILE`: the Ray fleet driver, supervised by the control plane.

Order matters: stdout is taken for the control protocol first (Ray and its C++ core may print),
then Ray's auth and TLS switches are put in the environment, and only then is ray imported.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import threading

from .. import logs
from ..launch import take_stdout
from . import config as fleet_config
from .errors import StartError
from .ray_env import set_ray_env

EXIT_OK = 0
EXIT_REFUSED = 2
PROBE_TIMEOUT_S = 60


class Channel:
    """One JSON object per line on the private stdout, written under one lock."""

    def __init__(self, out) -> None:
        self._out = out
        self._lock = threading.Lock()

    def emit(self, msg: dict) -> None:
        line = (json.dumps(msg, separators=(",", ":")) + "\n").encode()
        with self._lock:
            try:
                self._out.write(line)
                self._out.flush()
            except (OSError, ValueError):
                pass  # the control plane is gone; stdin EOF will end us


def refuse_open_cluster(cfg: fleet_config.FleetConfig) -> bool:
    """Raises unless the cluster checks tokens (or is an allowed loopback test cluster).

    Returns True when the cluster is open (allowed only with allow_insecure_local on loopback).
    """
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_TOKEN_PATH"}
    env["RAY_AUTH_MODE"] = "token"
    env["RAY_AUTH_TOKEN"] = secrets.token_hex(32)  # a token no cluster can hold
    try:
        r = subprocess.run(
            [sys.executable, "-m", "tpu_worker.fleet.probe", cfg.address],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
        verdict = (r.stdout.strip().splitlines() or [f"unreachable probe exited {r.returncode}"])[-1]
    except subprocess.TimeoutExpired:
        verdict = f"unreachable no answer within {PROBE_TIMEOUT_S}s"
    if verdict == "refused":
        return False
    if verdict == "open":
        if cfg.allow_insecure_local and cfg.address_is_loopback:
            logs.warn("the Ray cluster accepts clients without a token; allowed for this loopback cluster")
            return True
        raise StartError(
            "ray_insecure_cluster",
            f"the Ray cluster at {cfg.address} accepts clients without a token, so anyone who reaches its ports "
            "can run code there; start it with RAY_AUTH_MODE=token (and TLS), or for a loopback test cluster "
            "set runtime.ray.allow_insecure_local: true",
        )
    raise StartError("ray_unreachable", f"cannot reach the Ray cluster at {cfg.address}: {verdict.partition(' ')[2]}")


def check_token(cfg: fleet_config.FleetConfig) -> None:
    from ray._raylet import GcsClient
    from ray.exceptions import AuthenticationError

    try:
        GcsClient(address=cfg.address).internal_kv_get(b"tpu-mcp-probe", None, timeout=10)
    except AuthenticationError as exc:
        raise StartError(
            "ray_auth_refused",
            f"the Ray cluster at {cfg.address} refused this driver's token (runtime.ray.token_file "
            f"{cfg.token_file}): use the cluster's token (`ray get-auth-token` on the head)",
        ) from exc
    except Exception as exc:
        raise StartError("ray_unreachable", f"cannot reach the Ray cluster at {cfg.address}: {exc}") from exc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tpu_worker.fleet", description="tpu-mcp Ray fleet driver")
    p.add_argument("--config", required=True, help="JSON file: the runtime.ray section")
    args = p.parse_args(argv)
    chan = Channel(take_stdout())
    logs.install_logging_bridge()
    try:
        try:
            cfg = fleet_config.load(args.config)
        except fleet_config.ConfigError as exc:
            raise StartError("invalid_config", str(exc)) from exc
        set_ray_env(cfg)
        try:
            import ray  # noqa: F401 - only to fail early and clearly when Ray is not installed
        except ImportError as exc:
            raise StartError(
                "ray_missing",
                "Ray is not installed in the worker's Python: pip install -r runtime/worker/requirements-ray.txt",
            ) from exc
        refuse_open_cluster(cfg)
        if cfg.token_file:
            check_token(cfg)
        from .driver import Driver

        driver = Driver(cfg, chan)
        driver.connect()
    except StartError as exc:
        logs.error("fleet driver refused to start", code=exc.code, error=exc.message)
        chan.emit({"type": "error", "code": exc.code, "message": exc.message})
        return EXIT_REFUSED
    return driver.serve(sys.stdin.buffer)


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    os._exit(code)
