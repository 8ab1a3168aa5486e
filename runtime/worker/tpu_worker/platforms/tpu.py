"""TorchTPU (`torch_tpu`, device type "tpu").

Its torch.tpu.is_available / device_count / synchronize are internal from torch 2.11 and raise
when user code calls them: detection and counting go through torch.accelerator (probe.py),
synchronize and memory too (AcceleratorPlatform). TorchTPU drives one chip per process.
"""

from __future__ import annotations

import os
import threading
import warnings

import torch

from .accelerator import AcceleratorPlatform

# torch.get_float32_matmul_precision() on TorchTPU (which patches the getter and setter once the
# backend is initialised) -> what it means there: bf16 passes per float32 matmul.
TPU_PRECISION = {
    "medium": "medium (TorchTPU DEFAULT: 1 bf16 pass, fp32 accumulation)",
    "high": "high (TorchTPU HIGH: 3 bf16 passes)",
    "highest": "highest (TorchTPU HIGHEST: 6 bf16 passes)",
}


def _quiet(fn, *args):
    """Calls a TorchTPU experimental API without its one-time UserWarning on stderr."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args)


def tpu_eager_mode() -> str | None:
    """The TorchTPU eager mode in force, read back from torch.tpu.eager_mode (None if unreadable)."""
    tpu = getattr(torch, "tpu", None)
    try:
        mode = _quiet(lambda: tpu.eager_mode)
    except Exception:  # noqa: BLE001
        try:
            from torch_tpu._internal import execution_mode as em

            mode = em.eager_mode
        except Exception:  # noqa: BLE001
            return None
    if mode is None:
        return None
    return str(getattr(mode, "name", mode))


class TpuPlatform(AcceleratorPlatform):
    kind = "tpu"
    # The KV cache grows every step: elsewhere dynamo marks that dimension dynamic. TorchTPU
    # sends dynamic graphs to its bucketing DynamicCompiler (no warm restart) and refuses
    # dynamic=True, so on TPU the graphs stay static, one per length, like TorchTPU's default.
    compile_dynamic = False
    # TorchTPU's CPU fallback is off by default (an unsupported op raises: counted as failed);
    # when enabled it runs inside the C++ kernel and returns tensors on `tpu`.
    fallback_detection = (
        "per call: an op that raises counts as failed; TorchTPU's CPU fallback (off by default) "
        "happens inside its kernels and is not visible per call"
    )

    def materialize(self, out, device: torch.device) -> int:
        """In TorchTPU's fused (deferred) eager mode, ops are promises until a result is read, and
        a device synchronize may not run an unmaterialised graph: before a clock read, fetch one
        element of every output tensor to the host. In the other modes a no-op."""
        if tpu_eager_mode() != "DEFER_AND_FUSE":
            return 0
        seen = 0
        stack = [out]
        while stack:
            x = stack.pop()
            if isinstance(x, torch.Tensor):
                if x.numel():
                    x.reshape(-1)[:1].to("cpu")
                    seen += 1
            elif isinstance(x, (list, tuple)):
                stack.extend(x)
            elif isinstance(x, dict):
                stack.extend(x.values())
            elif hasattr(x, "to_tuple"):  # transformers ModelOutput
                stack.extend(x.to_tuple())
        return seen

    def default_compile_backend(self) -> str:
        return "tpu"

    def execution_mode(self, device: torch.device) -> str:
        mode = tpu_eager_mode()
        return f"eager ({mode})" if mode else "eager"

    def eager_mode_report(self, device: torch.device) -> dict | None:
        from ..launch import EAGER_ENV, EAGER_MODES

        requested = os.environ.get(EAGER_ENV, "strict")
        expected = EAGER_MODES.get(requested, ({}, None))[1]
        in_force = tpu_eager_mode()
        return {"requested": requested, "expected": expected, "in_force": in_force, "matches": in_force == expected}

    def compile_cache_misses(self) -> int | None:
        """TorchTPU's own compile-cache misses (eager mode compiles per op and shape in a cache
        that dynamo's counters never see). Private API: None when it is not there."""
        fn = getattr(getattr(torch, "tpu", None), "_get_cache_misses", None)
        if fn is None:
            return None
        try:
            return int(fn())
        except Exception:  # noqa: BLE001
            return None

    def compile_cache_dir(self) -> str | None:
        # Read by TorchTPU at import (launch.import_env sets it before `import torch`).
        return os.environ.get("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT")

    def compile_cache_stats(self) -> dict | None:
        """TorchTPU's PerfStats: cache requests, hits (any tier: in memory, or tier-3 on disk)
        and the XLA compilations they cost. Private API: None when it is not there."""
        fn = getattr(getattr(torch, "tpu", None), "_get_cache_stats", None)
        if fn is None:
            return None
        try:
            s = fn()
            return {
                "requests": int(s.num_cache_reqs),
                "hits": int(s.num_cache_hits),
                "compilations": int(s.num_compilations),
            }
        except Exception:  # noqa: BLE001
            return None

    def matmul_precision(self, device: torch.device) -> str:
        # TorchTPU honours torch.set_float32_matmul_precision; its patched getter reads the
        # runtime's global precision back (medium = DEFAULT, high = HIGH, highest = HIGHEST).
        try:
            value = str(torch.get_float32_matmul_precision())
        except Exception as exc:  # noqa: BLE001
            return f"unknown (torch.get_float32_matmul_precision raised {type(exc).__name__})"
        return TPU_PRECISION.get(value, value)

    def shutdown(self, device: torch.device, grace_s: float) -> None:
        """A device synchronize, then TorchTPU's runtime shutdown (which its own atexit hook would
        do, and which flushes asynchronous tier-3 compile cache writes), bounded by grace_s so a
        wedged runtime cannot hold the exit."""

        def run() -> None:
            try:
                tpu = torch.tpu
                if not tpu.is_initialized():
                    return
                torch.accelerator.synchronize()
                tpu._shutdown_runtime()
            except Exception:  # noqa: BLE001 - shutting down is best effort
                pass

        t = threading.Thread(target=run, name="tpu-shutdown", daemon=True)
        t.start()
        t.join(grace_s)
