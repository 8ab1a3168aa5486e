"""The simulated TPU host: the REAL torch-tpu 0.2.0 wheel (in .venv-tpu, made by
tpu_sim/setup_env.py on first use) with only the chip faked (tpu_sim/hook/sitecustomize.py)."""

from __future__ import annotations

import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER_DIR = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(WORKER_DIR))
sys.path.insert(0, WORKER_DIR)
sys.path.insert(0, os.path.join(WORKER_DIR, "tests"))

from tpu_sim import host, setup_env  # noqa: E402
from tpu_sim.overlay import overlay_python  # noqa: E402, F401 - used by the tests

BUILTIN_CATALOG = os.path.join(REPO, "runtime", "catalog.builtin.json")


@pytest.fixture(scope="session")
def tpu_python() -> str:
    return setup_env.ensure(REPO)


@pytest.fixture(scope="session")
def catalog_path(tmp_path_factory) -> str:
    from tpu_worker import builtin

    shared = os.path.join(REPO, ".data", "models")
    if all(builtin.is_valid(os.path.join(shared, name)) for name, _ in builtin.BUILDERS):
        models = shared
    else:
        models = str(tmp_path_factory.mktemp("models"))
        builtin.build_all(models)
    with open(BUILTIN_CATALOG, encoding="utf-8") as fh:
        data = json.load(fh)
    data["model_roots"] = [models]
    path = tmp_path_factory.mktemp("catalog") / "catalog.json"
    path.write_text(json.dumps(data))
    return str(path)


def make_env(root: str | None, call_log: str | None = None, **extra: str) -> dict:
    """A worker's environment: on the simulated host when `root` is set, else this real host."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_", "TORCH_TPU_"))}
    base.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    base["PYTHONPATH"] = WORKER_DIR
    env = host.sim_env(root, base) if root else {**base, "TPU_WORKER_TCMALLOC": "0"}
    if call_log:
        env["TPU_SIM_CALL_LOG"] = call_log
    env["TPU_WORKER_COMPILATION_CACHE"] = os.path.join(os.path.dirname(call_log or root or "/tmp"), "tt-cache")
    env.update(extra)
    return env


@pytest.fixture
def sim_host(tmp_path):
    """A 4-chip TPU v6e host."""
    return host.make_host(str(tmp_path / "host"), 4, "v6e")
