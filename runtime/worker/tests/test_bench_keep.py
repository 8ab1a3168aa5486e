"""A fine-tune's result kept as a model (bench/keep.py, catalog.kept_entries): the trained
weights written under --kept-dir, never over the base model's files; served by id once the
server's index names it, its sha256 checked at every load; a stopped run keeps nothing."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from conftest import bench_args
from tpu_worker.catalog import load_catalog
from tpu_worker.errors import WorkerError
from tpu_worker.ops import OpContext, Worker

KEPT = "kept-0123456789ab"


def tune_args(**args) -> dict:
    base = {
        "model": "tiny-gpt2",
        "work": "fine_tune",
        "dataset": "us-founding-texts",
        "steps": 3,
        "eval_every": 3,
        "learning_rate": 1e-3,
        "batch_sizes": [2],
        "seq_lens": [32],
        "dtypes": ["float32"],
        "iterations": None,
        "keep": {"id": KEPT, "dtype": "float32", "mode": "eager"},
    }
    return bench_args(**{**base, **args})


def _digests(folder: str) -> dict[str, str]:
    out = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as fh:
            out[name] = hashlib.sha256(fh.read()).hexdigest()
    return out


@pytest.fixture
def kept_worker(tmp_path, catalog_path, cpu_probe):
    w = Worker(load_catalog(catalog_path, str(tmp_path / "kept")), cpu_probe)
    yield w
    w.close()


def _json(path: str) -> dict:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def _index(worker, entry: dict) -> None:
    """The server's record of the kept model (tools/stores/kept.ts writes this file)."""
    with open(os.path.join(worker.catalog.kept_dir, "index.json"), "w", encoding="utf-8") as fh:
        json.dump({"models": [{"id": entry["id"], "entry": entry}]}, fh)


def test_keeps_the_trained_weights_and_serves_them_with_their_digest_checked(kept_worker):
    w = kept_worker
    base_dir = w.entry_and_weights("tiny-gpt2")[1].model_dir
    before = _digests(base_dir)
    r = w.handle("benchmark", tune_args(), [], OpContext("t"))[0]
    k = r["manifest"]["kept"]
    assert k["written"] is True and k["id"] == KEPT and k["steps"] == 3, k
    assert k["sha256"].startswith("sha256:") and k["files"] == ["model.safetensors"]
    folder = os.path.join(w.catalog.kept_dir, KEPT)
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(os.listdir(folder))
    assert _digests(base_dir) == before  # the base model's files are only read
    # Not served until the server's index names it.
    with pytest.raises(WorkerError) as e:
        w.catalog.get(KEPT)
    assert e.value.code == "unknown_model"
    base = _json(w.catalog.path)["models"]
    entry = {
        **next(m for m in base if m["id"] == "tiny-gpt2"),
        "id": KEPT,
        "source": {"path": folder},
        "sha256": k["sha256"],
    }
    _index(w, entry)
    loaded = w.handle("load", {"model": KEPT}, [], OpContext("l"))[0]
    assert loaded["model"] == KEPT
    w.handle("unload", {"model": KEPT}, [], OpContext("u"))
    # A weight byte changed on disk: the digest no longer matches and the load is refused.
    path = os.path.join(folder, "model.safetensors")
    with open(path, "r+b") as fh:
        fh.seek(-1, os.SEEK_END)
        last = fh.read(1)[0]
        fh.seek(-1, os.SEEK_END)
        fh.write(bytes([last ^ 0xFF]))
    with pytest.raises(WorkerError) as e:
        w.handle("load", {"model": KEPT}, [], OpContext("l2"))
    assert e.value.code == "unsafe_weights" and "sha256 differs" in e.value.message


def test_a_stopped_run_keeps_nothing(kept_worker):
    ctx = OpContext("t")

    def progress(p, total=None, message=None, delta=None):
        if p == 1:
            ctx.token.cancel("budget")

    ctx.progress = progress
    r = kept_worker.handle("benchmark", tune_args(steps=5), [], ctx)[0]
    assert r["manifest"]["kept"] == {"id": KEPT, "written": False, "reason": "the float32 eager configuration stopped"}
    assert not os.path.exists(os.path.join(kept_worker.catalog.kept_dir, KEPT))


def test_keep_must_name_a_configuration_of_the_grid(kept_worker):
    with pytest.raises(WorkerError) as e:
        kept_worker.handle(
            "benchmark", tune_args(keep={"id": KEPT, "dtype": "bfloat16", "mode": "eager"}), [], OpContext("t")
        )
    assert e.value.code == "invalid_argument" and "not a configuration of this run's grid" in e.value.message
    with pytest.raises(WorkerError) as e:
        bad = {"id": "../x", "dtype": "float32", "mode": "eager"}
        kept_worker.handle("benchmark", tune_args(keep=bad), [], OpContext("t"))
    assert "args.keep" in e.value.message


def test_a_bad_sha256_in_an_entry_is_refused(tmp_path, catalog_path):
    data = _json(catalog_path)
    data["models"][0]["sha256"] = "md5:abc"
    p = tmp_path / "c.json"
    p.write_text(json.dumps(data))
    from tpu_worker.catalog import CatalogError

    with pytest.raises(CatalogError, match="sha256"):
        load_catalog(str(p))
