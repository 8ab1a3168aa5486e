"""What every backend answers the same way, whatever the device (after vLLM's `platforms/`).

One Platform object per backend (cpu, cuda, tpu = TorchTPU, xla = torch_xla, and any other
accelerator registered with torch.accelerator); `platform_for(device)` picks it. Callers ask it
instead of branching on `device.type`. The probe (probe.py) decides which backend serves and says
why; this layer only operates the one it picked.
"""

from __future__ import annotations

import contextlib
import gc
import os

import torch


class Platform:
    kind = "base"
    # dynamo's `dynamic=` for a compiled causal LM (None: let dynamo decide; False: static graphs).
    compile_dynamic: bool | None = None
    # How `check` can tell an op that fell back to the host (reported as `fallback_detection`).
    fallback_detection = "per call: inputs on the device and results on the host count as a fallback to the CPU"
    # The `peak_memory_kind` of device counters after a reset (None: no such counters).
    peak_counter_kind: str | None = None

    # -- execution ------------------------------------------------------------------------------
    def synchronize(self, device: torch.device) -> None:
        """Waits for queued device work so a clock read measures it."""

    def materialize(self, out, device: torch.device) -> int:
        """Forces deferred outputs to run before a clock read; returns the tensors touched."""
        return 0

    def compile_backend(self, device: torch.device) -> str:
        return os.environ.get("TPU_WORKER_COMPILE_BACKEND") or self.default_compile_backend()

    def default_compile_backend(self) -> str:
        return "inductor"

    def execution_mode(self, device: torch.device) -> str:
        return "eager"

    def eager_mode_report(self, device: torch.device) -> dict | None:
        """{requested, expected, in_force, matches} where the backend has eager modes (TorchTPU)."""
        return None

    def compile_cache_misses(self) -> int | None:
        """The backend's own compile-cache misses so far, where it keeps such a count."""
        return None

    def compile_cache_dir(self) -> str | None:
        """The backend's own persistent compile cache (TorchTPU's tier-3), None where it keeps none."""
        return None

    def compile_cache_stats(self) -> dict | None:
        """The backend's own compile-cache counts so far ({requests, hits, compilations}), None
        where it keeps none."""
        return None

    def matmul_precision(self, device: torch.device) -> str:
        """The float32 matmul precision actually in force on this device."""
        return torch.get_float32_matmul_precision()

    def shutdown(self, device: torch.device, grace_s: float) -> None:
        """Lets the backend finish before the worker's os._exit."""

    # -- memory ---------------------------------------------------------------------------------
    def memory_info(self, index: int | None) -> tuple[int | None, int | None]:
        """(total, free) bytes of device `index` now; None where the backend cannot say."""
        return None, None

    def empty_cache(self, device: torch.device) -> None:
        """Returns the allocator's cached blocks to the device."""

    def release_memory(self, device: torch.device) -> None:
        """Frees what the last model or run left behind: Python garbage, then the device's cache."""
        gc.collect()
        with contextlib.suppress(Exception):  # freeing caches is best effort
            self.empty_cache(device)

    def reset_peak(self, device: torch.device) -> None:
        """Restarts the peak-memory counter (raises where there is none)."""
        raise NotImplementedError

    def memory_allocated(self, device: torch.device) -> int:
        raise NotImplementedError

    def max_memory_allocated(self, device: torch.device) -> int:
        raise NotImplementedError
