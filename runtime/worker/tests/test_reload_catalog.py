"""`reload_catalog`: the worker re-reads its catalog file; new models are added and loadable, an
entry it has keeps its definition (a loaded model does not change under its callers), a removed
one stays, and a file that does not validate changes nothing."""

import json

import pytest

from tpu_worker.catalog import load_catalog
from tpu_worker.errors import WorkerError
from tpu_worker.ops import OpContext, Worker


@pytest.fixture
def grown(catalog_path, cpu_probe, tmp_path):
    """A worker started on a catalog of mnist-cnn and tiny-gpt2, and a writer of its file."""
    with open(catalog_path, encoding="utf-8") as fh:
        full = json.load(fh)
    by_id = {m["id"]: m for m in full["models"]}
    path = tmp_path / "catalog.json"

    def write(models):
        path.write_text(json.dumps({**full, "models": models}))

    write([by_id["mnist-cnn"], by_id["tiny-gpt2"]])
    w = Worker(load_catalog(str(path)), cpu_probe)
    yield w, write, by_id
    w.close()


def test_adds_new_models_keeps_the_rest(grown):
    w, write, by_id = grown
    changed = {**by_id["tiny-gpt2"], "description": "edited"}
    write([by_id["mnist-cnn"], changed, by_id["tiny-chat"]])
    result, _ = w.handle("reload_catalog", {}, [], OpContext("r1"))
    assert result == {"added": ["tiny-chat"], "changed": ["tiny-gpt2"], "removed": []}
    assert w.catalog.get("tiny-chat").id == "tiny-chat"
    assert w.catalog.get("tiny-gpt2").description == by_id["tiny-gpt2"]["description"]
    loaded, _ = w.handle("load", {"model": "tiny-chat"}, [], OpContext("l1"))
    assert loaded["model"] == "tiny-chat"

    write([by_id["tiny-gpt2"]])
    result, _ = w.handle("reload_catalog", {}, [], OpContext("r2"))
    assert result["added"] == [] and result["removed"] == ["mnist-cnn", "tiny-chat"]
    assert sorted(w.catalog.entries) == ["mnist-cnn", "tiny-chat", "tiny-gpt2"]


def test_an_invalid_file_changes_nothing(grown):
    w, write, by_id = grown
    write([by_id["mnist-cnn"], {"id": "broken"}])
    with pytest.raises(WorkerError) as e:
        w.handle("reload_catalog", {}, [], OpContext("r"))
    assert e.value.code == "invalid_argument" and "nothing changed" in e.value.message
    assert sorted(w.catalog.entries) == ["mnist-cnn", "tiny-gpt2"]
