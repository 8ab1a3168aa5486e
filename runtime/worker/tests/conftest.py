from __future__ import annotations

import json
import os
import sys

import pytest

WORKER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(os.path.dirname(WORKER_DIR))
sys.path.insert(0, WORKER_DIR)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

BUILTIN_CATALOG = os.path.join(REPO, "runtime", "catalog.builtin.json")
# The server's benchmark bounds at their config defaults (server/config/config.ts `benchmark`) and its
# shortest benchmarked sequence (tools/run_benchmark.ts MIN_SEQ_LEN).
BENCH_LIMITS = {"max_configs": 64, "max_iterations": 10_000, "max_duration_s": 600, "max_warmup": 100, "min_seq_len": 2}


def bench_args(**args) -> dict:
    """A `benchmark` request as the server sends it, every value resolved (the worker has no
    defaults of its own). `limits` given as a dict overrides single bounds; a key given as None
    is left out (to see it refused)."""
    out = {
        "model": "mnist-cnn",
        "batch_sizes": [1],
        "dtypes": ["float32"],
        "modes": ["eager"],
        "scenario": "single-stream",
        "warmup": 1,
        # No extension unless a test asks: the figures of these tests do not depend on the host.
        "extend_factor": 1,
        "limits": dict(BENCH_LIMITS),
    }
    if args.get("scenario") not in ("forward", "generate"):  # the v1 spelling names the work itself
        out["work"] = "forward"
    if "duration_s" not in args:
        out["iterations"] = 4
    if isinstance(args.get("limits"), dict):
        args = {**args, "limits": {**BENCH_LIMITS, **args["limits"]}}
    out.update(args)
    return {k: v for k, v in out.items() if v is not None}


SHARED_MODELS = os.path.join(REPO, ".data", "models")


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> str:
    """The built-in models: the repo's .data/models when already built, else a tmp root that
    links the ones already there and builds only the missing ones (a model added to the
    built-ins does not rebuild the others)."""
    from tpu_worker import builtin

    missing = [name for name, _ in builtin.BUILDERS if not builtin.is_valid(os.path.join(SHARED_MODELS, name))]
    if not missing:
        return SHARED_MODELS
    out = str(tmp_path_factory.mktemp("models"))
    for name, _ in builtin.BUILDERS:
        if name not in missing:
            os.symlink(os.path.realpath(os.path.join(SHARED_MODELS, name)), os.path.join(out, name))
    builtin.build_all(out)
    return out


@pytest.fixture(scope="session")
def catalog_path(models_dir, tmp_path_factory) -> str:
    """The built-in catalog with its model root pointed at `models_dir` (and the shared root,
    which its links may point into)."""
    with open(BUILTIN_CATALOG, encoding="utf-8") as fh:
        data = json.load(fh)
    data["model_roots"] = [models_dir] + ([SHARED_MODELS] if models_dir != SHARED_MODELS else [])
    # The built-in datasets stay where the repo keeps them (the copy lives elsewhere).
    data["dataset_roots"] = [os.path.join(os.path.dirname(BUILTIN_CATALOG), r) for r in data["dataset_roots"]]
    path = tmp_path_factory.mktemp("catalog") / "catalog.json"
    path.write_text(json.dumps(data))
    return str(path)


@pytest.fixture(scope="session")
def catalog(catalog_path):
    from tpu_worker.catalog import load_catalog

    return load_catalog(catalog_path)


@pytest.fixture(scope="session")
def cpu_probe():
    from tpu_worker.probe import probe

    return probe("cpu")


@pytest.fixture
def worker(catalog, cpu_probe):
    from tpu_worker.ops import Worker

    w = Worker(catalog, cpu_probe)
    yield w
    w.close()


@pytest.fixture(scope="session")
def shared_worker(catalog, cpu_probe):
    """One worker with models loaded once for the read-only tests that need them."""
    from tpu_worker.ops import OpContext, Worker

    w = Worker(catalog, cpu_probe)
    for m in ("all-minilm-l6-v2", "tiny-gpt2", "mnist-cnn", "tiny-chat"):
        w.handle("load", {"model": m}, [], OpContext(f"load-{m}"))
    yield w
    w.close()
