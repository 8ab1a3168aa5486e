"""What must happen before `import torch`: the environment TorchTPU and CUDA read at import time,
the chip binding (one process per chip), the TorchTPU install check and the tcmalloc preload;
and, first of all, stdout taken for the protocol.

Nothing here imports torch. TorchTPU 0.2.0 registers a `torch.backends` entry point, so a plain
`import torch` loads it whenever it is installed: with libtpu missing the process aborts (not
catchable), with pyzmq missing `import torch` raises. So the install is checked from package
metadata first, and TorchTPU is kept out (`TORCH_DEVICE_BACKEND_AUTOLOAD=0`) wherever it is not
wanted or cannot load.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import sys
from dataclasses import dataclass, field

# torch-tpu 0.2.0's METADATA: Requires-Dist: torch>=2.11.0,<=2.15.0
TORCH_TPU_TORCH_RANGE = ((2, 11, 0), (2, 15, 0))

# --tpu-eager value -> (variables to set, the torch.tpu.EagerMode name that must then be in force)
EAGER_MODES = {
    "strict": ({}, "DEFER_NEVER"),
    "fused": ({"TORCH_TPU_DEFER_AND_FUSE": "1"}, "DEFER_AND_FUSE"),
    # 0.2.0 reads TORCH_TPU_LAUNCH_BLOCKING; TPU_LAUNCH_BLOCKING (older builds) is set too.
    "blocking": ({"TORCH_TPU_LAUNCH_BLOCKING": "1", "TPU_LAUNCH_BLOCKING": "1"}, "DEFER_NEVER_AND_LAUNCH_BLOCKING"),
}
EAGER_ENV = "TPU_WORKER_TPU_EAGER"  # the requested mode, read back by TpuPlatform.eager_mode_report
PRELOADED_ENV = "TPU_WORKER_TCMALLOC_PRELOADED"  # set on the re-exec, so it happens once

# Where the worker looks for tcmalloc when TorchTPU will be loaded (Debian/Ubuntu paths).
TCMALLOC_PATHS = (
    "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
    "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4",
    "/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4",
    "/usr/lib64/libtcmalloc_minimal.so.4",
)

# Per-process bounds for a single-chip libtpu process (set only when the parent did not).
# TPU_VISIBLE_DEVICES is TorchTPU's source of truth; the bounds are libtpu's usual single-chip
# set, recognised by the 0.2.0 library; whether all are needed is to be confirmed on hardware.
SINGLE_CHIP_BOUNDS = {"TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1", "TPU_PROCESS_BOUNDS": "1,1,1"}
TPU_PROCESS_PORT_BASE = 8476


def _version_tuple(text: str) -> tuple[int, ...]:
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(g or 0) for g in m.groups()) if m else ()


def dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_tpu_installed() -> bool:
    return importlib.util.find_spec("torch_tpu") is not None


def torch_tpu_install_problems() -> list[str]:
    """Why an installed TorchTPU cannot load, in words (empty when it can, or is not installed)."""
    if not torch_tpu_installed():
        return []
    problems = []
    if importlib.util.find_spec("libtpu") is None:
        problems.append(
            "torch_tpu is installed but libtpu is missing (import torch would abort the process): "
            "pip install libtpu (see runtime/worker/extra/requirements-tpu.txt)"
        )
    if importlib.util.find_spec("zmq") is None:
        problems.append(
            "torch_tpu is installed but pyzmq is missing (import torch would fail with 'Failed to load "
            "the backend extension: torch_tpu'): pip install pyzmq"
        )
    tv = dist_version("torch")
    lo, hi = TORCH_TPU_TORCH_RANGE
    if tv is None:
        problems.append("torch is not installed")
    elif not lo <= _version_tuple(tv) <= hi:
        problems.append(
            f"torch {tv} is outside torch-tpu {dist_version('torch-tpu') or '?'}'s supported range "
            f"(>=2.11.0,<=2.15.0): install torch==2.13.0"
        )
    return problems


@dataclass
class Binding:
    """Which device this process serves: `index` is the host's index (what the control plane
    names), `local` the index torch sees inside this process."""

    kind: str
    index: int | None
    local: int | None
    env: dict[str, str] = field(default_factory=dict)


def bind_device(kind: str, index: int | None, environ: dict[str, str]) -> Binding:
    """One process per chip: `--device tpu:N` sets TPU_VISIBLE_DEVICES=N (and the single-chip
    bounds) unless the parent already set them, so the chip is `tpu:0` inside the process;
    `--device cuda:N` does the same with CUDA_VISIBLE_DEVICES. Returns the variables to set."""
    var = {"tpu": "TPU_VISIBLE_DEVICES", "cuda": "CUDA_VISIBLE_DEVICES"}.get(kind)
    if var is None:
        return Binding(kind, index, index)
    if index is None:
        # `--device tpu` under a parent that made exactly one chip visible: that chip, as tpu:0.
        only = environ.get(var, "").strip()
        if only.isdigit():
            return Binding(kind, int(only), 0)
        return Binding(kind, None, None)
    env: dict[str, str] = {}
    current = environ.get(var)
    if current is None or current.strip() == "":
        env[var] = str(index)
        local = 0
    else:
        visible = [v.strip() for v in current.split(",") if v.strip()]
        # The parent chose the visible set: N is a host index when it is in that set.
        local = visible.index(str(index)) if str(index) in visible else index
    if kind == "tpu":
        for k, v in SINGLE_CHIP_BOUNDS.items():
            if k not in environ:
                env[k] = v
        if "TPU_PROCESS_PORT" not in environ:
            env["TPU_PROCESS_PORT"] = str(TPU_PROCESS_PORT_BASE + index)
        env.setdefault("TPU_WORKER_HOST_INDEX", str(index))
    else:
        env.setdefault("TPU_WORKER_HOST_INDEX", str(index))
    return Binding(kind, index, local, env)


def take_stdout():
    """A private binary handle on the real stdout, for the protocol; fd 1 and sys.stdout then
    point at stderr, so stray prints (also from C extensions, Ray's core) cannot corrupt frames.
    Used by the worker and by the Ray fleet driver."""
    sys.stdout.flush()
    proto = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return proto


# How long an idle OpenMP thread of torch's CPU kernels busy-waits for the next parallel region
# (GNU libgomp, which the torch wheels use; read when torch loads it). libgomp's default is 300,000
# spins, about a millisecond: between the short forwards of small models the worker's idle threads
# burned CPU the Node control plane needs. On the 2-core development VM, 32 mnist-cnn callers with
# 2 torch threads cost the worker 1.6 ms of CPU per call at the default and 0.7-0.8 ms at 10,000
# spins (~640 -> ~1,100 calls/s). Fewer spins (1,000) made a batch-1 forward slower: each
# operator then waits for sleeping threads to wake. An operator's own value wins.
OPENMP_SPIN = "10000"


def import_env(kind: str, tpu_eager: str, environ: dict[str, str], compile_cache: str | None = None) -> dict[str, str]:
    """The variables to set before `import torch` for a worker that asks for `kind`; TorchTPU's
    persistent (tier-3) compile cache goes under `compile_cache` (--compile-cache, the server's
    data_dir/compile-cache) unless the environment names one."""
    env: dict[str, str] = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    for k, v in (
        ("HF_HUB_DISABLE_TELEMETRY", "1"),
        ("TOKENIZERS_PARALLELISM", "false"),
        ("GOMP_SPINCOUNT", OPENMP_SPIN),
    ):
        if k not in environ:
            env[k] = v
    env[EAGER_ENV] = tpu_eager
    if not torch_tpu_installed():
        return env
    if kind in ("cpu", "cuda", "xla") and "TORCH_DEVICE_BACKEND_AUTOLOAD" not in environ:
        # TorchTPU is not wanted: keep its autoload (and a broken install) out of `import torch`.
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
        return env
    if torch_tpu_install_problems():
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # diagnosed in words by the probe instead
        return env
    cache = environ.get("TPU_WORKER_COMPILATION_CACHE") or os.path.join(
        compile_cache or os.path.join(os.path.expanduser("~"), ".cache", "tpu-mcp"), "torch_tpu"
    )
    if "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT" not in environ:
        os.makedirs(cache, exist_ok=True)
        env["TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"] = cache
    env.update(EAGER_MODES[tpu_eager][0])
    return env


def tcmalloc_preload(kind: str, environ: dict[str, str]) -> str | None:
    """The tcmalloc library to preload (TorchTPU warns without it), or None: only when TorchTPU
    will load, tcmalloc is present and not already preloaded, and TPU_WORKER_TCMALLOC != 0."""
    if kind not in ("auto", "tpu") or environ.get("TPU_WORKER_TCMALLOC") == "0":
        return None
    if environ.get(PRELOADED_ENV) or "tcmalloc" in environ.get("LD_PRELOAD", "") or not torch_tpu_installed():
        return None
    override = environ.get("TPU_WORKER_TCMALLOC")
    for path in (override,) if override and override != "1" else TCMALLOC_PATHS:
        if path and os.path.exists(path):
            return path
    return None
