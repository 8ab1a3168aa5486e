from __future__ import annotations

import copy
import json

import pytest

from conftest import BUILTIN_CATALOG
from tpu_worker.catalog import CatalogError, load_catalog, parse_catalog


def builtin_data() -> dict:
    with open(BUILTIN_CATALOG, encoding="utf-8") as fh:
        return json.load(fh)


def test_builtin_catalog_parses_and_roots_are_relative_to_the_file():
    cat = load_catalog(BUILTIN_CATALOG)
    assert set(cat.entries) == {
        "all-minilm-l6-v2",
        "tiny-gpt2",
        "mnist-cnn",
        "tiny-chat",
        "smollm2-135m-instruct",
    }
    assert cat.roots[0].endswith("/.data/models")
    assert cat.entries["mnist-cnn"].input.shape == (1, 28, 28)


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda d: d["models"][0].update(architecture="resnet"), "architecture"),
        (lambda d: d["models"][0].update(task="text-generation"), "task"),
        (lambda d: d["models"][0].update(format="onnx"), "format"),
        (lambda d: d["models"][0].update(dtypes=["float32", "int8"]), "dtypes"),
        (lambda d: d["models"][0].update(default_dtype="float64"), "default_dtype"),
        (lambda d: d["models"][0]["limits"].update(max_batch=0), "max_batch"),
        (lambda d: d["models"][1]["limits"].update(max_logprobs=6), "max_logprobs"),
        (lambda d: d["models"][0]["batching"].update(max_batch=1000), "batching.max_batch"),
        (lambda d: d["models"][0]["batching"].update(max_wait_ms=-1), "max_wait_ms"),
        (lambda d: d["models"][0].update(source={"hub": "org/name", "revision": "main"}), "revision"),
        (lambda d: d["models"][0].update(id="Bad Id!"), "id"),
        (lambda d: d["models"][2].pop("input"), "input"),
        (lambda d: d["models"].append(copy.deepcopy(d["models"][0])), "duplicate"),
        (lambda d: d.update(model_roots=[]), "model_roots"),
        (lambda d: d["models"][0].update(trusted="yes"), "trusted"),
        (lambda d: d["models"][1].update(shapes={"batch_buckets": [4, 2]}), "shapes.batch_buckets"),
        (lambda d: d["models"][1].update(shapes={"length_buckets": [8, 4096]}), "shapes.length_buckets"),
        (lambda d: d["models"][1].update(shapes={"batch": [1]}), "shapes"),
    ],
)
def test_invalid_fields_are_named(mutate, fragment):
    data = builtin_data()
    mutate(data)
    with pytest.raises(CatalogError) as info:
        parse_catalog(data, BUILTIN_CATALOG)
    assert fragment in str(info.value)


def test_unreadable_and_non_json_catalogs(tmp_path):
    with pytest.raises(CatalogError, match="cannot be read"):
        load_catalog(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(CatalogError, match="not valid JSON"):
        load_catalog(str(bad))


def test_a_shape_plan_comes_from_the_entry_or_the_defaults():
    from tpu_worker.shapes import ShapePlan

    data = builtin_data()
    gpt2 = next(m for m in data["models"] if m["id"] == "tiny-gpt2")
    gpt2["shapes"] = {"batch_buckets": [1, 8], "length_buckets": [32, 128]}
    entry = parse_catalog(data, BUILTIN_CATALOG).entries["tiny-gpt2"]
    plan = ShapePlan.for_model(entry.shapes.batch_buckets, entry.shapes.length_buckets, max_batch=16, max_len=128)
    assert plan.batches == (1, 8, 16) and plan.lengths == (32, 128)  # max_batch is always a bucket
    default = ShapePlan.for_model(None, None, max_batch=16, max_len=128, generation=True)
    assert default.batches == (1, 2, 4, 8, 16) and default.lengths == (8, 16, 32, 64, 128)
    assert default.prefill_batches == (1, 4, 16)  # the largest is the slots: one forward per length
    assert ShapePlan.for_model(None, None, max_batch=8, max_len=8, generation=True).prefill_batches == (1, 2, 8)
    # A decode step per batch bucket and window (the lengths; with max_new_tokens, the whole cache too).
    assert default.decode_lengths == default.lengths and default.decode_length(9) == 16
    assert default.size == 3 * 5 + 5 * 5 and default.batch(3) == 4 and default.length(100) == 128
    longer = ShapePlan.for_model(None, None, max_batch=16, max_len=128, generation=True, max_new_tokens=64)
    assert longer.decode_lengths == (8, 16, 32, 64, 128, 192) and longer.decode_length(150) == 192
