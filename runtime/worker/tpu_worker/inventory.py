"""`python -m tpu_worker inventory`: what devices this host has, for the pool to start one worker
per chip. Prints ONE JSON line on stdout and exits 0:

    {"kind": "tpu"|"cuda"|"xla"|"cpu", "count": N, "name": "TPU v6e", "devices_per_chip": 1,
     "problems": [...]}

It claims no chip and initialises no PJRT or CUDA context: TorchTPU's device count before its
runtime starts is the PCI/VFIO scan, and CUDA is counted through NVML. A broken TorchTPU install
(libtpu or pyzmq missing, torch outside its range) exits 2 with one line on stderr.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import warnings

from . import launch


def _tpu(problems: list[str]) -> dict | None:
    import torch

    acc = torch.accelerator.current_accelerator()
    if acc is None or acc.type != "tpu":
        problems.append("torch_tpu is installed but no TPU chip is exposed through VFIO on this host")
        return None
    count = int(torch.accelerator.device_count())  # PCI/VFIO count: the runtime is not started
    if count < 1:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # experimental-API notice
        name = str(torch.tpu.get_device_name())
    from .probe import tpu_devices_per_chip

    return {"kind": "tpu", "count": count, "name": name, "devices_per_chip": tpu_devices_per_chip(name)}


def _cuda(problems: list[str]) -> dict | None:
    import torch

    if torch.version.cuda is None:
        return None
    try:
        count = int(torch.cuda._device_count_nvml())  # NVML: no CUDA context
    except Exception:  # noqa: BLE001
        count = -1
    if count < 0:
        try:
            count = int(torch.cuda.device_count())
        except Exception as exc:  # noqa: BLE001
            problems.append(f"CUDA device count failed: {type(exc).__name__}: {exc}")
            return None
    if count < 1:
        return None
    name = "cuda"
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=name", "--format=csv,noheader"],
                check=False,
                capture_output=True,
                text=True,
                timeout=20,
            )
            first = out.stdout.strip().splitlines()
            if out.returncode == 0 and first:
                name = first[0].strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return {"kind": "cuda", "count": count, "name": name, "devices_per_chip": 1}


def inventory() -> tuple[dict | None, str | None]:
    """(the inventory, None) or (None, a one-line reason the install is broken)."""
    problems: list[str] = []
    tpu_installed = launch.torch_tpu_installed()
    broken = launch.torch_tpu_install_problems()
    if broken:
        return None, "; ".join(broken)
    if not tpu_installed:
        os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    import torch  # noqa: F401 - TorchTPU autoloads here when installed (PCI scan only)

    found = _tpu(problems) if tpu_installed else None
    if found is None and importlib.util.find_spec("torch_xla") is not None:
        problems.append(
            "torch_xla is installed: one worker drives its devices (no per-chip expansion without TorchTPU)"
        )
        found = {"kind": "xla", "count": 1, "name": "xla", "devices_per_chip": 1}
    if found is None:
        found = _cuda(problems)
    if found is None:
        found = {"kind": "cpu", "count": 1, "name": "cpu", "devices_per_chip": 1}
    found["problems"] = problems
    return found, None


def main(argv: list[str]) -> int:
    if argv:
        print(f"inventory takes no arguments; got {' '.join(argv)}", file=sys.stderr)
        return 2
    # stdout carries the one JSON line: whatever torch or TorchTPU print goes to stderr.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        found, broken = inventory()
    except Exception as exc:  # noqa: BLE001
        print(f"inventory failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    if broken:
        print(f"broken TorchTPU install: {broken}", file=sys.stderr)
        return 2
    out.write(json.dumps(found) + "\n")
    out.flush()
    return 0
