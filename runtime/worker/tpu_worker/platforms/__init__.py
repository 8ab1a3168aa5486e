"""One Platform object per backend; see base.py."""

from __future__ import annotations

from .accelerator import AcceleratorPlatform
from .base import Platform
from .cpu import CpuPlatform
from .cuda import CudaPlatform
from .tpu import TpuPlatform
from .xla import XlaPlatform

PLATFORMS: dict[str, Platform] = {
    "cpu": CpuPlatform(),
    "cuda": CudaPlatform(),
    "tpu": TpuPlatform(),
    "xla": XlaPlatform(),
}
_OTHER = AcceleratorPlatform()  # any other backend registered with torch.accelerator

# float32 matmul precisions a request may set (torch.set_float32_matmul_precision; TorchTPU maps
# them to 1, 3 or 6 bf16 passes).
PRECISIONS = ("medium", "high", "highest")


def platform_for(device) -> Platform:
    """The backend of `device` (a torch.device, or anything with a `type`, or a kind string)."""
    kind = device if isinstance(device, str) else device.type
    return PLATFORMS.get(kind, _OTHER)


def set_matmul_precision(value: str) -> None:
    """Sets the float32 matmul precision for this process (every model on this worker):
    torch.set_float32_matmul_precision, which TorchTPU maps to its global precision on TPU."""
    import torch

    torch.set_float32_matmul_precision(value)


__all__ = ["PLATFORMS", "PRECISIONS", "Platform", "platform_for", "set_matmul_precision"]
