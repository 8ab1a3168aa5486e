"""The `selftest` op: the device checks that need no model (for `tpu-mcp doctor --tpu`)."""

from __future__ import annotations

import contextlib
import time

import torch

from .platforms import PRECISIONS, set_matmul_precision
from .probe import refresh_memory


def run_selftest(worker) -> dict:
    """The device checks that need no model (for `tpu-mcp doctor --tpu`): memory read,
    synchronize, each float32 matmul precision set and read back (then restored), and the
    eager mode requested against the one in force."""
    steps: list[dict] = []

    def step(name: str, fn) -> None:
        t0 = time.perf_counter()
        try:
            detail, ok = fn()
        except Exception as exc:  # noqa: BLE001 - a failed check is a result, not a crash
            detail, ok = f"{type(exc).__name__}: {exc}"[:300], False
        steps.append({"step": name, "ok": ok, "detail": detail, "seconds": round(time.perf_counter() - t0, 6)})

    def memory():
        d = refresh_memory(worker.device_info)
        total, free = d["memory_total_bytes"], d["memory_free_bytes"]
        return {"total_bytes": total, "free_bytes": free}, bool(total)

    def sync():
        worker.platform.synchronize(worker.device)
        return "device synchronized", True

    step("memory", memory)
    step("synchronize", sync)
    before = torch.get_float32_matmul_precision()
    for value in PRECISIONS:

        def precision(value=value):
            set_matmul_precision(value)
            reported = worker.platform.matmul_precision(worker.device)
            return {"set": value, "reported": reported}, reported.split(" ")[0] == value

        step(f"matmul_precision {value}", precision)
    with contextlib.suppress(Exception):
        set_matmul_precision(before)
    eager = worker.platform.eager_mode_report(worker.device)
    if eager is not None:
        steps.append({"step": "eager_mode", "ok": bool(eager["matches"]), "detail": eager, "seconds": 0.0})
    return {
        "device": worker.label(worker.device),
        "name": worker.device_info.get("name"),
        "execution_mode": worker.platform.execution_mode(worker.device),
        "compile_backend": worker.platform.compile_backend(worker.device),
        "steps": steps,
    }
