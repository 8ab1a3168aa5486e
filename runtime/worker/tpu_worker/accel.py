"""Small per-backend helpers: synchronize, compile backend, precision, execution mode, memory."""

from __future__ import annotations

import os
import resource

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


def compile_backend(device: torch.device) -> str:
    override = os.environ.get("TPU_WORKER_COMPILE_BACKEND")
    if override:
        return override
    return {"tpu": "tpu", "xla": "openxla"}.get(device.type, "inductor")


def matmul_precision(device: torch.device) -> str:
    """The float32 matmul precision actually in force on this device."""
    kind = device.type
    if kind == "cuda":
        tf32 = torch.backends.cuda.matmul.allow_tf32
        cudnn = torch.backends.cudnn.allow_tf32
        return f"{'tf32' if tf32 else 'highest'} (cuda matmul allow_tf32={tf32}, cudnn allow_tf32={cudnn})"
    if kind == "tpu":
        tpu = getattr(torch, "tpu", None)
        for name in ("get_precision", "current_precision", "get_matmul_precision"):
            fn = getattr(tpu, name, None)
            if callable(fn):
                try:
                    return str(fn())
                except Exception:  # noqa: BLE001
                    break
        return "default (one-pass bf16, fp32 accumulation)"
    if kind == "xla":
        try:
            import torch_xla.backends as xb

            return str(xb.get_mat_mul_precision())
        except Exception:  # noqa: BLE001
            return "default (one-pass bf16, fp32 accumulation)"
    return torch.get_float32_matmul_precision()


def execution_mode(device: torch.device) -> str:
    if device.type == "tpu":
        try:
            from torch_tpu._internal import execution_mode as em

            mode = em.eager_mode
            return f"eager ({getattr(mode, 'name', mode)})"
        except Exception:  # noqa: BLE001
            return "eager"
    if device.type == "xla":
        try:
            import torch_xla

            return "eager" if torch_xla._XLAC._get_use_eager_mode() else "lazy"
        except Exception:  # noqa: BLE001
            return "lazy"
    return "eager"


def rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_memory(device: torch.device) -> None:
    try:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        elif device.type == "tpu":
            torch.accelerator.reset_peak_memory_stats(device.index or 0)
    except Exception:  # noqa: BLE001 - peak memory is best effort
        pass


def peak_memory_bytes(device: torch.device) -> int | None:
    """Peak device memory since the last reset; on the CPU the process peak RSS."""
    try:
        if device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(device))
        if device.type == "tpu":
            return int(torch.accelerator.max_memory_allocated(device.index or 0))
    except Exception:  # noqa: BLE001
        return None
    if device.type == "cpu":
        return peak_rss_bytes()
    return None
