from __future__ import annotations

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
