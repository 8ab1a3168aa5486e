"""The worker's modules import each other in one direction: no circle, not even one hidden behind
an import inside a function (which only moves the failure to the first call that takes it)."""

from __future__ import annotations

import ast
import os

PACKAGE = "tpu_worker"
ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), PACKAGE)


def _module_name(path: str) -> str:
    rel = os.path.relpath(path, os.path.dirname(ROOT))[: -len(".py")].split(os.sep)
    if rel[-1] == "__init__":
        rel = rel[:-1]
    return ".".join(rel)


def _modules() -> dict[str, str]:
    out = {}
    for folder, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                out[_module_name(path)] = path
    return out


def _resolve(name: str, known: set[str]) -> str | None:
    """The package module `name` loads: itself, or the nearest package above it that exists."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(missing: list[str] | None = None) -> dict[str, set[str]]:
    """module -> the package modules it imports anywhere in its body (module or function level).
    Imports of package modules that do not exist are appended to `missing`."""
    mods = _modules()
    known = set(mods)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        is_pkg = path.endswith("__init__.py")
        base = mod if is_pkg else mod.rpartition(".")[0]
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), path)
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = base.split(".")
                    anchor = ".".join(parts[: len(parts) - (node.level - 1)])
                    src = f"{anchor}.{node.module}" if node.module else anchor
                else:
                    src = node.module or ""
                # `from . import x` imports the submodule x when there is one.
                targets = [f"{src}.{a.name}" if f"{src}.{a.name}" in known else src for a in node.names]
            for t in targets:
                if t == PACKAGE or t.startswith(PACKAGE + "."):
                    if t not in known and missing is not None:
                        missing.append(f"{mod}:{node.lineno} imports {t}")
                    dep = _resolve(t, known)
                    if dep and dep != mod:
                        graph[mod].add(dep)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for d in sorted(graph.get(n, ())):
            if state.get(d) == 1:
                return [*path[path.index(d) :], d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        path.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_the_graph_sees_module_and_function_level_imports():
    g = import_graph()
    assert "tpu_worker.ops" in g["tpu_worker.server"]  # module level
    assert "tpu_worker.serve" in g["tpu_worker.__main__"]  # inside main()
    assert "tpu_worker.launch" in g["tpu_worker.probe"]  # inside gather_tpu()


def test_the_cycle_finder_finds_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_circle_in_the_worker():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_every_package_import_names_a_module_that_exists():
    """A relative import left behind when code moves fails only when its line runs; this finds it."""
    missing: list[str] = []
    import_graph(missing)
    assert missing == []
