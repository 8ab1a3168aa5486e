"""Simulated TPU host: put this folder on PYTHONPATH (only the simulated-TPU tests do) to make
the REAL torch-tpu 0.2.0 wheel believe it runs on a TPU VM. It fakes only what needs a chip:

1. The PCI/VFIO scan. TorchTPU's own scan (`torch_tpu._internal.utils.hardware`) runs unchanged,
   but its `pathlib` is pointed at a fake sysfs tree: `/sys/bus/pci/devices` and `/dev/vfio`
   are read under $TPU_SIM_ROOT (made by tpu_sim.host.make_host: Google vendor id, a TPU PCI
   device id, an iommu_group link and a /dev/vfio/<group> node per chip).
2. The runtime calls that would start PJRT on a chip and claim it: torch's accelerator entry
   points into the C++ allocator and device guard (`torch._C._accelerator_getMemoryInfo`,
   `_getDeviceStats`, `_resetPeakStats`, `_emptyCache`, `_synchronizeDevice`,
   `_isAllocatorInitialized`) answer from the chip's published HBM when the accelerator is the
   TPU. The fakes can be told apart from a no-op, so that a worker that skips them fails a test:
   - memory: `$TPU_SIM_HBM_USED_BYTES` of the chip's HBM are in use (by another process, or
     earlier allocations): the memory query answers (total - used, total) and the device stats
     report them allocated, so a worker that reports total as free is caught;
   - synchronize: every synchronize finds `$TPU_SIM_SYNC_WORK_S` seconds of device work still
     queued and returns only when it has finished (and is logged), so a clock read after a
     synchronize measures at least that, and one without it does not.
   Tensor allocation and kernel execution are NOT faked: on this host the first tensor on
   `tpu` makes libtpu look for the chip and abort the process ("No jellyfish device found").

Set TPU_SIM_ROOT to enable; without it this file does nothing.
"""

import importlib.abc
import importlib.machinery
import os
import pathlib
import sys
import time

_ROOT = os.environ.get("TPU_SIM_ROOT")
_MAP = (
    ("/sys/bus/pci/devices", "sys/bus/pci/devices"),
    ("/dev/vfio", "dev/vfio"),
)


def _redirect(p: str) -> str:
    for real, fake in _MAP:
        if p == real or p.startswith(real + "/"):
            return os.path.join(_ROOT, fake) + p[len(real) :]
    return p


class _SimPath(type(pathlib.Path())):
    def __new__(cls, *parts):
        return super().__new__(cls, _redirect(str(pathlib.PurePosixPath(*parts))))


class _SimPathlib:
    """`pathlib` as the hardware scan sees it: Path redirected, everything else the real one."""

    Path = _SimPath

    def __getattr__(self, name):
        return getattr(pathlib, name)


def _fake_runtime(hardware) -> None:
    import torch

    C = torch._C
    real = {
        n: getattr(C, n)
        for n in (
            "_accelerator_getMemoryInfo",
            "_accelerator_getDeviceStats",
            "_accelerator_resetPeakStats",
            "_accelerator_emptyCache",
            "_accelerator_synchronizeDevice",
            "_accelerator_isAllocatorInitialized",
        )
    }
    calls = os.environ.get("TPU_SIM_CALL_LOG")

    def on_tpu():
        acc = C._accelerator_getAccelerator()
        return acc is not None and acc.type == "tpu"

    def log(name, *args):
        if calls:
            with open(calls, "a", encoding="utf-8") as fh:
                fh.write(f"{os.getpid()} {name} {' '.join(map(str, args))}\n")

    def total():
        return int(hardware.get_hbm_bytes_per_device() or 0)

    def used():
        return min(int(os.environ.get("TPU_SIM_HBM_USED_BYTES") or 0), total())

    def synchronize(i=None):
        # The device work still queued: a synchronize waits for it, as a real device queue would.
        time.sleep(float(os.environ.get("TPU_SIM_SYNC_WORK_S") or 0))

    def wrap(name, fake):
        def fn(*args):
            if not on_tpu():
                return real[name](*args)
            log(name, *args)
            return fake(*args)

        setattr(C, name, fn)

    wrap("_accelerator_getMemoryInfo", lambda i=None: (total() - used(), total()))
    wrap(
        "_accelerator_getDeviceStats",
        lambda i=None: {
            "allocated_bytes": {"all": {"current": used(), "peak": used(), "allocated": used(), "freed": 0}}
        },
    )
    wrap("_accelerator_resetPeakStats", lambda i=None: None)
    wrap("_accelerator_emptyCache", lambda: None)
    wrap("_accelerator_synchronizeDevice", synchronize)
    wrap("_accelerator_isAllocatorInitialized", lambda: True)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torch_tpu._internal.utils.hardware":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.pathlib = _SimPathlib()
            _fake_runtime(module)

        spec.loader.exec_module = exec_module
        return spec


if _ROOT:
    sys.meta_path.insert(0, _Finder())
