"""How the worker reaches vLLM (`runtime.engines.vllm` in the server's config, passed as
`--engine-vllm JSON`): a Python with vLLM installed that the worker starts and supervises, or an
operator-run endpoint (url + key file)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from ..errors import WorkerError

# runtime/worker/tpu_worker/engines -> the repository root.
REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
DEFAULT_PYTHON = os.path.join(REPO_ROOT, ".venv-vllm", "bin", "python")


@dataclass(frozen=True)
class VllmSettings:
    python: str = DEFAULT_PYTHON
    args: tuple[str, ...] = ()
    url: str | None = None  # an operator-run endpoint instead of a process of our own
    key_file: str | None = None
    start_timeout_s: float = 300.0
    max_restarts: int = 5
    restart_window_s: float = 300.0
    kv_cache_gib: float = 1.0  # VLLM_CPU_KVCACHE_SPACE on a CPU host (vLLM's default is 4)

    def endpoint_key(self) -> str | None:
        if self.key_file is None:
            return None
        try:
            with open(self.key_file, encoding="utf-8") as fh:
                return fh.read().strip() or None
        except OSError:
            raise WorkerError(
                "engine_unavailable", "the vLLM endpoint's key file (runtime.engines.vllm.key_file) cannot be read"
            ) from None


def parse_settings(text: str | None) -> VllmSettings:
    """Settings from the command line's JSON (already validated by the server's config schema)."""
    if not text:
        return VllmSettings()
    raw = json.loads(text)
    if not isinstance(raw, dict):
        raise ValueError("--engine-vllm must be a JSON object")
    return VllmSettings(
        python=str(raw.get("python") or DEFAULT_PYTHON),
        args=tuple(str(a) for a in raw.get("args") or ()),
        url=(str(raw["url"]).rstrip("/") if raw.get("url") else None),
        key_file=(str(raw["key_file"]) if raw.get("key_file") else None),
        start_timeout_s=float(raw.get("start_timeout_s", 300.0)),
        max_restarts=int(raw.get("max_restarts", 5)),
        restart_window_s=float(raw.get("restart_window_s", 300.0)),
        kv_cache_gib=float(raw.get("kv_cache_gib", 1.0)),
    )
