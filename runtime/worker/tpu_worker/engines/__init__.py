"""Engines: models served by another process beside the worker, behind the worker's ops (and so
behind the same gate). Today one: vLLM (docs/vllm.md).

Layout: settings.py (runtime.engines.vllm), vllm_process.py (start, supervise, stop the server),
http.py (JSON and event streams on loopback, cancellable), vllm.py (infer on the engine: the
arguments, text and stop sequences of generation/ as on the torch path), vllm_bench.py
(benchmark on the engine).
"""

from .settings import VllmSettings, parse_settings
from .vllm import VllmEngine
from .vllm_bench import run_engine_benchmark

__all__ = ["VllmEngine", "VllmSettings", "parse_settings", "run_engine_benchmark"]
