"""torch_xla (device type "xla"): lazy tensors, synchronised through torch_xla itself."""

from __future__ import annotations

import torch

from .accelerator import AcceleratorPlatform


def parse_xla_memory_info(info) -> tuple[int | None, int | None]:
    """torch_xla has reported {bytes_limit, bytes_used} and, in older releases, {kb_total, kb_free}."""
    if not isinstance(info, dict):
        return None, None
    if "bytes_limit" in info:
        total = int(info["bytes_limit"])
        return total, total - int(info.get("bytes_used", 0))
    if "kb_total" in info:
        return int(info["kb_total"]) * 1024, int(info.get("kb_free", 0)) * 1024
    return None, None


class XlaPlatform(AcceleratorPlatform):
    kind = "xla"

    def synchronize(self, device: torch.device) -> None:
        import torch_xla
        import torch_xla.core.xla_model as xm

        torch_xla.sync()
        xm.wait_device_ops()

    def default_compile_backend(self) -> str:
        return "openxla"

    def execution_mode(self, device: torch.device) -> str:
        try:
            import torch_xla

            return "eager" if torch_xla._XLAC._get_use_eager_mode() else "lazy"
        except Exception:  # noqa: BLE001
            return "lazy"

    def matmul_precision(self, device: torch.device) -> str:
        try:
            import torch_xla.backends as xb

            return str(xb.get_mat_mul_precision())
        except Exception:  # noqa: BLE001
            return "default (one-pass bf16, fp32 accumulation)"

    def memory_info(self, index: int | None) -> tuple[int | None, int | None]:
        try:
            import torch_xla.core.xla_model as xm

            info = xm.get_memory_info(torch.device(f"xla:{index or 0}"))
        except Exception:  # noqa: BLE001
            return None, None
        return parse_xla_memory_info(info)
