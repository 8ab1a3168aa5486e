"""Small per-backend helpers: synchronize, compile backend, precision, execution mode, memory."""

from __future__ import annotations

import gc
import os

import torch


def synchronize(device: torch.device) -> None:
    """Waits for queued device work so a clock read measures it (no-op on the CPU)."""
    kind = device.type
    if kind == "cpu":
        return
    if kind == "cuda":
        torch.cuda.synchronize(device)
    elif kind == "xla":
        import torch_xla
        import torch_xla.core.xla_model as xm

        torch_xla.sync()
        xm.wait_device_ops()
    else:  # TorchTPU and any other accelerator registered with torch.accelerator
        torch.accelerator.synchronize()


def materialize(out, device: torch.device) -> int:
    """In TorchTPU's fused (deferred) eager mode, ops are promises until a result is read, and a
    device synchronize may not run an unmaterialised graph: before a clock read, fetch one
    element of every output tensor to the host. Elsewhere a no-op. Returns the tensors touched."""
    if device.type != "tpu" or tpu_eager_mode() != "DEFER_AND_FUSE":
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


def compile_backend(device: torch.device) -> str:
    override = os.environ.get("TPU_WORKER_COMPILE_BACKEND")
    if override:
        return override
    return {"tpu": "tpu", "xla": "openxla"}.get(device.type, "inductor")


# torch.get_float32_matmul_precision() on TorchTPU (which patches the getter and setter once the
# backend is initialised) -> what it means there: bf16 passes per float32 matmul.
TPU_PRECISION = {
    "medium": "medium (TorchTPU DEFAULT: 1 bf16 pass, fp32 accumulation)",
    "high": "high (TorchTPU HIGH: 3 bf16 passes)",
    "highest": "highest (TorchTPU HIGHEST: 6 bf16 passes)",
}
PRECISIONS = ("medium", "high", "highest")


def _quiet(fn, *args):
    """Calls a TorchTPU experimental API without its one-time UserWarning on stderr."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args)


def matmul_precision(device: torch.device) -> str:
    """The float32 matmul precision actually in force on this device."""
    kind = device.type
    if kind == "cuda":
        tf32 = torch.backends.cuda.matmul.allow_tf32
        cudnn = torch.backends.cudnn.allow_tf32
        return f"{'tf32' if tf32 else 'highest'} (cuda matmul allow_tf32={tf32}, cudnn allow_tf32={cudnn})"
    if kind == "tpu":
        # TorchTPU honours torch.set_float32_matmul_precision; its patched getter reads the
        # runtime's global precision back (medium = DEFAULT, high = HIGH, highest = HIGHEST).
        try:
            value = str(torch.get_float32_matmul_precision())
        except Exception as exc:  # noqa: BLE001
            return f"unknown (torch.get_float32_matmul_precision raised {type(exc).__name__})"
        return TPU_PRECISION.get(value, value)
    if kind == "xla":
        try:
            import torch_xla.backends as xb

            return str(xb.get_mat_mul_precision())
        except Exception:  # noqa: BLE001
            return "default (one-pass bf16, fp32 accumulation)"
    return torch.get_float32_matmul_precision()


def set_matmul_precision(value: str) -> None:
    """Sets the float32 matmul precision for this process (every model on this worker):
    torch.set_float32_matmul_precision, which TorchTPU maps to its global precision on TPU."""
    torch.set_float32_matmul_precision(value)


def execution_mode(device: torch.device) -> str:
    if device.type == "tpu":
        mode = tpu_eager_mode()
        return f"eager ({mode})" if mode else "eager"
    if device.type == "xla":
        try:
            import torch_xla

            return "eager" if torch_xla._XLAC._get_use_eager_mode() else "lazy"
        except Exception:  # noqa: BLE001
            return "lazy"
    return "eager"


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


def eager_mode_report(device: torch.device) -> dict | None:
    """{requested, expected, in_force, matches} for TorchTPU; None on other devices."""
    if device.type != "tpu":
        return None
    from .launch import EAGER_ENV, EAGER_MODES

    requested = os.environ.get(EAGER_ENV, "strict")
    expected = EAGER_MODES.get(requested, ({}, None))[1]
    in_force = tpu_eager_mode()
    return {"requested": requested, "expected": expected, "in_force": in_force, "matches": in_force == expected}


def tpu_cache_misses() -> int | None:
    """TorchTPU's own compile-cache misses so far (eager mode compiles per op and shape in a cache
    that dynamo's counters never see). Private API: None when it is not there."""
    fn = getattr(getattr(torch, "tpu", None), "_get_cache_misses", None)
    if fn is None:
        return None
    try:
        return int(fn())
    except Exception:  # noqa: BLE001
        return None


def shutdown_runtime(device: torch.device, grace_s: float = 10.0) -> None:
    """Lets TorchTPU finish before the worker's os._exit: a device synchronize, then its runtime
    shutdown (which its own atexit hook would do, and which flushes asynchronous tier-3 compile
    cache writes), bounded by grace_s so a wedged runtime cannot hold the exit."""
    if device.type != "tpu":
        return
    import threading

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


def rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def release_memory(device: torch.device) -> None:
    """Frees what the last model or run left behind: Python garbage, then the device's cache."""
    gc.collect()
    try:
        if device.type == "cuda":
            torch.cuda.empty_cache()
        elif device.type != "cpu":
            torch.accelerator.empty_cache()
    except Exception:  # noqa: BLE001 - freeing caches is best effort
        pass
