from __future__ import annotations

import json
import os
import pickle
import struct

import pytest
import torch
from safetensors.torch import save_file

from tpu_worker.catalog import parse_catalog
from tpu_worker.errors import WorkerError
from tpu_worker.loaders import DigestCache, inspect_weights, load_state_dict, read_safetensors_header


def make_catalog(tmp_path, source: dict, fmt: str = "safetensors", trusted: bool = False, roots=("models",)):
    data = {
        "model_roots": list(roots),
        "models": [
            {
                "id": "m",
                "task": "tensor",
                "architecture": "mnist-cnn",
                "source": source,
                "format": fmt,
                "trusted": trusted,
                "dtypes": ["float32"],
                "input": {"shape": [1, 28, 28], "dtype": "float32"},
                "limits": {"max_batch": 4},
            }
        ],
    }
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps(data))
    cat = parse_catalog(data, str(path))
    return cat, cat.entries["m"]


def refused(cat, entry, code: str) -> WorkerError:
    with pytest.raises(WorkerError) as info:
        inspect_weights(entry, cat)
    assert info.value.code == code, info.value.message
    assert str(os.path.realpath(cat.roots[0])) not in info.value.message  # no absolute paths leak
    assert "/tmp" not in info.value.message
    return info.value


@pytest.fixture
def root(tmp_path):
    (tmp_path / "models").mkdir()
    return tmp_path / "models"


class _Canary:
    """Unpickling this object would create a file: proof that code ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def write_evil_pickle(path, canary) -> None:
    with open(path, "wb") as fh:
        pickle.dump({"weight": _Canary(str(canary))}, fh)


def test_safetensors_file_is_inspected_from_its_header(tmp_path, root):
    save_file(
        {"a": torch.zeros(3, 4), "b": torch.ones(5, dtype=torch.float16), "pos": torch.arange(4)},
        str(root / "w.safetensors"),
    )
    cat, entry = make_catalog(tmp_path, {"path": "w.safetensors"})
    info = inspect_weights(entry, cat)
    assert info.parameters == 17  # float tensors only; integer buffers are not parameters
    assert info.weight_bytes == 12 * 4 + 5 * 2 + 4 * 8
    assert info.tensors == 3
    assert DigestCache().digest(info.files).startswith("sha256:")


def test_pickle_is_refused_and_never_unpickled(tmp_path, root):
    canary = tmp_path / "canary"
    write_evil_pickle(root / "w.bin", canary)
    cat, entry = make_catalog(tmp_path, {"path": "w.bin"}, fmt="pytorch")
    err = refused(cat, entry, "unsafe_weights")
    assert "trusted" in err.message
    cat, entry = make_catalog(tmp_path, {"path": "w.bin"}, fmt="safetensors")
    refused(cat, entry, "unsafe_weights")
    assert not canary.exists()


def test_trusted_pickle_loads_only_with_weights_only(tmp_path, root):
    canary = tmp_path / "canary"
    write_evil_pickle(root / "evil.pt", canary)
    torch.save({"w": torch.ones(2)}, root / "good.pt")
    cat, entry = make_catalog(tmp_path, {"path": "good.pt"}, fmt="pytorch", trusted=True)
    state = load_state_dict(inspect_weights(entry, cat), entry)
    assert torch.equal(state["w"], torch.ones(2))
    cat, entry = make_catalog(tmp_path, {"path": "evil.pt"}, fmt="pytorch", trusted=True)
    with pytest.raises(WorkerError) as info:
        load_state_dict(inspect_weights(entry, cat), entry)
    assert info.value.code == "unsafe_weights"
    assert not canary.exists()


def test_hf_directory_with_only_pickle_is_refused(tmp_path, root):
    canary = tmp_path / "canary"
    (root / "hf").mkdir()
    write_evil_pickle(root / "hf" / "pytorch_model.bin", canary)
    data_cat, _ = make_catalog(tmp_path, {"path": "hf"})
    entry = data_cat.entries["m"].__class__(**{**data_cat.entries["m"].__dict__, "format": "hf-safetensors"})
    refused(data_cat, entry, "unsafe_weights")
    assert not canary.exists()


def test_dotdot_escape_is_refused(tmp_path, root):
    save_file({"a": torch.zeros(1)}, str(tmp_path / "outside.safetensors"))
    cat, entry = make_catalog(tmp_path, {"path": "../outside.safetensors"})
    refused(cat, entry, "path_outside_roots")


def test_absolute_path_outside_is_refused(tmp_path, root):
    save_file({"a": torch.zeros(1)}, str(tmp_path / "outside.safetensors"))
    cat, entry = make_catalog(tmp_path, {"path": str(tmp_path / "outside.safetensors")})
    err = refused(cat, entry, "path_outside_roots")
    assert "the source of 'm'" in err.message


def test_sibling_prefix_root_is_outside(tmp_path, root):
    sibling = tmp_path / "models_x"
    sibling.mkdir()
    save_file({"a": torch.zeros(1)}, str(sibling / "w.safetensors"))
    cat, entry = make_catalog(tmp_path, {"path": "../models_x/w.safetensors"})
    refused(cat, entry, "path_outside_roots")


def test_symlink_pointing_out_is_refused(tmp_path, root):
    save_file({"a": torch.zeros(1)}, str(tmp_path / "secret.safetensors"))
    os.symlink(tmp_path / "secret.safetensors", root / "link.safetensors")
    cat, entry = make_catalog(tmp_path, {"path": "link.safetensors"})
    refused(cat, entry, "path_outside_roots")


def test_symlinked_file_inside_a_model_directory_is_refused(tmp_path, root):
    (root / "hf").mkdir()
    save_file({"a": torch.zeros(1)}, str(tmp_path / "secret.safetensors"))
    os.symlink(tmp_path / "secret.safetensors", root / "hf" / "model.safetensors")
    cat, entry = make_catalog(tmp_path, {"path": "hf"})
    entry = entry.__class__(**{**entry.__dict__, "format": "hf-safetensors"})
    refused(cat, entry, "path_outside_roots")


def test_missing_file(tmp_path, root):
    cat, entry = make_catalog(tmp_path, {"path": "nope.safetensors"})
    err = refused(cat, entry, "weights_missing")
    assert "npm run setup" in err.message


def _raw_safetensors(path, header: bytes, data: bytes = b"", *, declared: int | None = None) -> None:
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(header) if declared is None else declared) + header + data)


@pytest.mark.parametrize(
    ("header", "data", "declared", "code"),
    [
        (b"garbage!", b"", None, "unsafe_weights"),
        (b"{}", b"", 10**12, "unsafe_weights"),  # header length larger than the file
        (
            json.dumps({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}).encode(),
            b"\0" * 8,
            None,
            "unsafe_weights",
        ),  # bytes do not match shape
        (
            json.dumps(
                {
                    "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                    "b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                }
            ).encode(),
            b"\0" * 8,
            None,
            "unsafe_weights",
        ),  # overlapping ranges
        (
            json.dumps({"a": {"dtype": "F32", "shape": [1000], "data_offsets": [0, 4000]}}).encode(),
            b"\0" * 16,
            None,
            "unsafe_weights",
        ),  # claims more data than the file holds
        (
            json.dumps({"a": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 1]}}).encode(),
            b"\0",
            None,
            "unsafe_weights",
        ),
        (json.dumps([1, 2]).encode(), b"", None, "unsafe_weights"),
    ],
)
def test_bad_safetensors_headers_are_refused_before_allocation(tmp_path, header, data, declared, code):
    path = tmp_path / "bad.safetensors"
    _raw_safetensors(path, header, data, declared=declared)
    with pytest.raises(WorkerError) as info:
        read_safetensors_header(str(path))
    assert info.value.code == code


def test_weights_over_the_limit_are_too_large(tmp_path):
    path = tmp_path / "w.safetensors"
    save_file({"a": torch.zeros(1024)}, str(path))
    with pytest.raises(WorkerError) as info:
        read_safetensors_header(str(path), max_total_bytes=1000)
    assert info.value.code == "weights_too_large"


def test_tiny_file_is_not_safetensors(tmp_path):
    path = tmp_path / "w.safetensors"
    path.write_bytes(b"\1\2")
    with pytest.raises(WorkerError) as info:
        read_safetensors_header(str(path))
    assert info.value.code == "unsafe_weights"


def test_digest_cache_recomputes_when_the_file_changes(tmp_path):
    path = tmp_path / "w.safetensors"
    save_file({"a": torch.zeros(4)}, str(path))
    cache = DigestCache()
    first = cache.digest((str(path),))
    assert cache.digest((str(path),)) == first
    save_file({"a": torch.ones(8)}, str(path))
    assert cache.digest((str(path),)) != first
