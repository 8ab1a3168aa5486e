"""CUDA (and ROCm through torch.cuda)."""

from __future__ import annotations

import torch

from .base import Platform


class CudaPlatform(Platform):
    kind = "cuda"
    peak_counter_kind = "cuda_max_memory_allocated"

    def synchronize(self, device: torch.device) -> None:
        torch.cuda.synchronize(device)

    def matmul_precision(self, device: torch.device) -> str:
        tf32 = torch.backends.cuda.matmul.allow_tf32
        cudnn = torch.backends.cudnn.allow_tf32
        return f"{'tf32' if tf32 else 'highest'} (cuda matmul allow_tf32={tf32}, cudnn allow_tf32={cudnn})"

    def memory_info(self, index: int | None) -> tuple[int | None, int | None]:
        try:
            free, total = torch.cuda.mem_get_info(index or 0)
        except Exception:  # noqa: BLE001
            return None, None
        return int(total), int(free)

    def empty_cache(self, device: torch.device) -> None:
        torch.cuda.empty_cache()

    def reset_peak(self, device: torch.device) -> None:
        torch.cuda.reset_peak_memory_stats(device)

    def memory_allocated(self, device: torch.device) -> int:
        return int(torch.cuda.memory_allocated(device))

    def max_memory_allocated(self, device: torch.device) -> int:
        return int(torch.cuda.max_memory_allocated(device))
