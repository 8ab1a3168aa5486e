"""The worker's ops, reports and transport serve every kind of model through one surface
(served.Served): none of them names an engine or a batcher class, imports the engines, or asks
which kind a model is. A new kind of model is one implementation, not a branch in every op."""

from __future__ import annotations

import ast
import pathlib

import tpu_worker

PKG = pathlib.Path(tpu_worker.__file__).parent
KIND_BLIND = ["ops.py", "reports.py", "server.py"]
# Classes and modules of one kind of model: its implementation may name them, the ops may not.
KIND_NAMES = {
    "VllmEngine",
    "VllmSettings",
    "EngineModel",
    "TorchModel",
    "LoadedEngine",
    "Loaded",
    "DecodeLoop",
    "Batcher",
    "CausalLM",
    "run_engine_benchmark",
    "engine_model",
    "engines",
}


def _names(tree: ast.AST) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.ImportFrom):
            out.update(part for part in (node.module or "").split("."))
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(part for a in node.names for part in a.name.split("."))
    return out


def _kind_tests(tree: ast.AST) -> list[str]:
    """`x.engine == ...`, `... in x.engine`: asking which kind a model is (an isinstance of a
    kind's class names it, which the test above refuses)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr == "engine" for s in sides):
                found.append(f"line {node.lineno}: compares .engine")
    return found


def test_no_op_names_a_kind_of_model():
    for name in KIND_BLIND:
        tree = ast.parse((PKG / name).read_text())
        named = _names(tree) & KIND_NAMES
        assert not named, f"{name} names {sorted(named)}: go through served.Served instead"


def test_no_op_asks_which_kind_a_model_is():
    for name in KIND_BLIND:
        assert _kind_tests(ast.parse((PKG / name).read_text())) == [], name


def test_the_worker_keeps_one_dict_of_served_models(worker):
    from tpu_worker.ops import OpContext
    from tpu_worker.served import Served

    worker.handle("load", {"model": "mnist-cnn"}, [], OpContext("load"))
    holders = [
        k for k, v in vars(worker).items() if isinstance(v, dict) and any(isinstance(m, Served) for m in v.values())
    ]
    assert holders == ["served"] and list(worker.served) == ["mnist-cnn"]
