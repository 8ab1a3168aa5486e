"""Any backend registered with torch.accelerator (TorchTPU builds on this one)."""

from __future__ import annotations

import torch

from .base import Platform


class AcceleratorPlatform(Platform):
    kind = "accelerator"
    peak_counter_kind = "accelerator_max_memory_allocated"

    def synchronize(self, device: torch.device) -> None:
        torch.accelerator.synchronize()

    def memory_info(self, index: int | None) -> tuple[int | None, int | None]:
        try:
            free, total = torch.accelerator.get_memory_info(index or 0)
        except Exception:  # noqa: BLE001 - not every backend implements it
            return None, None
        if not total:  # TorchTPU answers (0, 0) when PJRT cannot report allocator stats
            return None, None
        return int(total), int(free)

    def empty_cache(self, device: torch.device) -> None:
        torch.accelerator.empty_cache()

    def reset_peak(self, device: torch.device) -> None:
        torch.accelerator.reset_peak_memory_stats(device.index or 0)

    def memory_allocated(self, device: torch.device) -> int:
        return int(torch.accelerator.memory_allocated(device.index or 0))

    def max_memory_allocated(self, device: torch.device) -> int:
        return int(torch.accelerator.max_memory_allocated(device.index or 0))
