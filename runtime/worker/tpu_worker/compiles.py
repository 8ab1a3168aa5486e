"""Counting a model's compiles, and keeping compile artefacts across worker restarts.

`counted_backend` wraps the platform's compile backend (platforms/: inductor on the CPU, "tpu"
on TorchTPU) so that every graph dynamo hands it for this model is counted: the graphs a load's
warm-up compiled, and any compile after it (a recompile: a shape outside the warmed plan, or a
guard that failed), which is logged as a warning and flagged in status. These counts are the
CPU's proxy for TPU compiles (docs/tpu-vm.md): a graph dynamo compiles on the CPU is a graph
TorchTPU would compile too.

`use_cache_dir` points inductor's FX graph cache (and its other on-disk caches) at a folder the
server keeps under its data_dir (TPU_WORKER_COMPILE_CACHE), so a restarted worker loads compiled
graphs from disk instead of compiling them again; `cache_hits` says whether a load was warm.
TorchTPU keeps a persistent compile cache of its own (tier-3, TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT,
set before `import torch` by launch.import_env, under the same folder); `compile_cache_report`
says whether a load was warm in either.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any

from . import logs
from .errors import WorkerError

CACHE_ENV = "TPU_WORKER_COMPILE_CACHE"


@dataclass
class CompileCounter:
    model: str
    strict: bool = False  # shapes.strict: a compile after the warm-up fails its call
    graphs: int = 0  # graphs compiled since load began
    at_load: int | None = None  # graphs compiled by the end of the load's warm-up
    census: Any = None  # the decode loop's ShapeCensus (census.py): new op shapes after warm-up
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self) -> None:
        with self._lock:
            self.graphs += 1
            after = self.at_load is not None
        if after:
            logs.warn(
                "recompile after warm-up: a forward took a shape or path the load did not warm",
                model=self.model,
                recompiles_since_load=self.recompiles_since_load,
                strict=self.strict,
            )
            if self.strict:
                raise WorkerError(
                    "recompile_after_load",
                    f"model {self.model!r} had to compile its forward again after its load (a shape or path "
                    "the load did not warm), and its catalog entry sets shapes.strict: true; set "
                    "shapes.strict: false to serve it (counted in recompiles_since_load) and report the call",
                )

    def loaded(self) -> None:
        with self._lock:
            self.at_load = self.graphs

    @property
    def recompiles_since_load(self) -> int:
        """Graphs compiled after the warm-up, and the op shapes first run after it around the
        forward (each a compile on an eager TPU backend)."""
        graphs = self.graphs - (self.at_load or 0) if self.at_load is not None else 0
        return graphs + (self.census.new_since_load if self.census is not None else 0)

    def report(self) -> dict:
        n = self.recompiles_since_load
        out = {"graphs_compiled": self.at_load, "recompiles_since_load": n, "recompiled": n > 0}
        if self.census is not None:
            out["op_shapes_since_load"] = self.census.new_since_load
        return out


def counted_backend(name: str, counter: CompileCounter):
    """The compile backend `name` (a torch.compile backend name), counting each graph."""
    import torch._dynamo

    inner = torch._dynamo.lookup_backend(name)

    def backend(gm, example_inputs):
        counter.count()
        return inner(gm, example_inputs)

    backend.platform_backend = name  # what it counts for (the TPU-sim suite reads it)

    return backend


def allow_graphs(n: int) -> None:
    """Lets dynamo keep `n` graphs of one function (one per shape) before it gives up on it."""
    import torch._dynamo.config as cfg

    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(cfg, name) and getattr(cfg, name) < n:
            setattr(cfg, name, n)


_cache_dir: str | None = None


def use_cache_dir() -> str | None:
    """Points inductor's on-disk caches at $TPU_WORKER_COMPILE_CACHE (once per process); returns
    the folder, or None when none is set."""
    global _cache_dir
    path = os.environ.get(CACHE_ENV)
    if not path:
        return None
    if _cache_dir is None:
        os.makedirs(path, exist_ok=True)
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(path, "inductor"))
        try:
            import torch._inductor.config as inductor_config

            inductor_config.fx_graph_cache = True
        except Exception:  # noqa: BLE001 - a torch without inductor: nothing to persist
            pass
        _cache_dir = path
    return _cache_dir


def cache_hits() -> int:
    """Inductor's FX graph cache hits so far in this process."""
    try:
        from torch._dynamo.utils import counters

        return int(counters["inductor"]["fxgraph_cache_hit"])
    except Exception:  # noqa: BLE001
        return 0


def compile_cache_report(cache_dir: str | None, inductor_hits: int, plat, backend_before: dict | None) -> dict:
    """A compiled load's `compile_cache`: where graphs persist, and whether this load found them
    there (`state` warm or cold). Inductor: warm when its FX graph cache hit. A backend with a
    cache of its own (TorchTPU: platform.compile_cache_stats): warm when the load's requests
    cost it no compilation."""
    warm = inductor_hits > 0
    out: dict = {"dir": cache_dir, "hits": inductor_hits}
    after = plat.compile_cache_stats()
    if backend_before is not None and after is not None:
        delta = {k: after[k] - backend_before.get(k, 0) for k in after}
        backend_warm = delta["requests"] > 0 and delta["compilations"] == 0
        out["backend"] = {"dir": plat.compile_cache_dir(), **delta, "warm": backend_warm}
        warm = warm or backend_warm
    out["warm"] = warm
    out["state"] = "warm" if warm else "cold"
    return out
