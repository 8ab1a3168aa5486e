"""Device probe: TorchTPU -> torch_xla -> CUDA -> CPU.

Each backend has a *gatherer* that touches the real libraries and returns plain `BackendFacts`
(never raising), and one pure function, `decide`, turns facts plus the `--device` request into
the chosen device and a probe log of `{backend, matched, reason}` steps. Tests inject facts.
"""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from .errors import WorkerError

GiB = 1024**3

# HBM per chip when the runtime does not report memory (public Cloud TPU figures).
TPU_HBM_BYTES = {"v4": 32 * GiB, "v5e": 16 * GiB, "v5p": 95 * GiB, "v6e": 32 * GiB, "v7": 192 * GiB}
# Devices a chip exposes to the runtime (TorchTPU hardware._DEVICES_PER_CHIP): v7 splits its two
# TensorCores into two devices, each with half the chip's HBM and half its peak.
TPU_DEVICES_PER_CHIP = {"v7": 2}

# Device kind (what --device names) -> backend that serves it, in probe order.
KIND_BACKEND = {"tpu": "torch_tpu", "xla": "torch_xla", "cuda": "cuda", "cpu": "cpu"}
PROBE_ORDER = ("tpu", "xla", "cuda", "cpu")


@dataclass
class BackendFacts:
    """What one backend looks like on this machine, gathered without raising."""

    kind: str
    importable: bool = True
    import_error: str | None = None
    available: bool = False
    unavailable_reason: str | None = None
    count: int = 0
    names: list[str] = field(default_factory=list)
    # (total, free) per device; None entries mean unknown.
    memory: list[tuple[int | None, int | None]] = field(default_factory=list)
    version: str | None = None
    # Index torch uses inside this process for the device the request names (one process per
    # chip: tpu:N is tpu:0 once TPU_VISIBLE_DEVICES=N); None = the same as the host index.
    local_index: int | None = None


@dataclass(frozen=True)
class DeviceRequest:
    kind: str  # "auto" or a key of KIND_BACKEND
    index: int | None = None


@dataclass
class ProbeResult:
    device: dict
    devices: list[dict]
    steps: list[dict]


def parse_device(text: str) -> DeviceRequest:
    m = re.fullmatch(r"(auto|cpu|cuda|tpu|xla)(?::(\d+))?", (text or "").strip())
    if not m:
        raise WorkerError(
            "unsupported_device",
            f"device {text!r} is not understood; use auto, cpu, cuda[:N], tpu[:N] or xla[:N]",
        )
    kind, idx = m.group(1), m.group(2)
    if kind in ("auto", "cpu") and idx not in (None, "0"):
        raise WorkerError("unsupported_device", f"{kind} takes no device index")
    return DeviceRequest(kind, int(idx) if idx is not None and kind != "cpu" else None)


def torch_device_string(device: dict) -> str:
    """The torch device string inside this process (`local_index`, when set, is what torch sees)."""
    if device["kind"] == "cpu":
        return "cpu"
    local = device.get("local_index")
    return f"{device['kind']}:{device['index'] if local is None else local}"


def device_label(device: dict) -> str:
    """The name the control plane uses: kind:host index (`cpu` for the CPU)."""
    return "cpu" if device["kind"] == "cpu" else f"{device['kind']}:{device['index']}"


def tpu_generation(name: str) -> str | None:
    """ "TPU v5 lite", "TPU v6e", "v5p"... -> a key of TPU_HBM_BYTES, or None."""
    n = name.lower().replace("-", " ")
    if "v5p" in n:
        return "v5p"
    if "v5e" in n or "v5 lite" in n or "v5lite" in n:
        return "v5e"
    if "v6e" in n or "v6 lite" in n or "v6" in n:
        return "v6e"
    if re.search(r"\bv7", n) or "7x" in n or "ironwood" in n:
        return "v7"
    if "v4" in n:
        return "v4"
    return None


def tpu_devices_per_chip(name: str) -> int:
    return TPU_DEVICES_PER_CHIP.get(tpu_generation(name) or "", 1)


def tpu_hbm_from_name(name: str) -> int | None:
    """HBM one device can address: the chip's HBM divided by the devices it exposes (v7: 2)."""
    gen = tpu_generation(name)
    return TPU_HBM_BYTES[gen] // TPU_DEVICES_PER_CHIP.get(gen, 1) if gen else None


def _device_dict(facts: BackendFacts, index: int) -> dict:
    total, free = facts.memory[index] if index < len(facts.memory) else (None, None)
    name = facts.names[index] if index < len(facts.names) else facts.kind
    if facts.kind == "tpu" and total is None:
        total = tpu_hbm_from_name(name)
    d = {
        "kind": facts.kind,
        "name": name,
        "index": index,
        "count": facts.count,
        "memory_total_bytes": total,
        "memory_free_bytes": free,
        "backend": KIND_BACKEND[facts.kind],
        "backend_version": facts.version,
    }
    if facts.kind == "tpu":
        d["devices_per_chip"] = tpu_devices_per_chip(name)
    return d


def _step(kind: str, matched: bool, reason: str) -> dict:
    return {"backend": KIND_BACKEND[kind], "matched": matched, "reason": reason}


def _unmatched_reason(f: BackendFacts) -> str | None:
    if not f.importable:
        return f"import failed: {f.import_error or 'module not installed'}"
    if not f.available:
        return f.unavailable_reason or "not available"
    if f.count < 1:
        return "available but reports 0 devices"
    return None


def decide(request: DeviceRequest, gather: Callable[[str], BackendFacts]) -> ProbeResult:
    """Pure decision: which backend serves this worker, and why each step matched or not.

    `gather(kind)` is only called for the backends that need looking at, so forcing
    `--device cpu` never gathers an accelerator (and __main__ keeps TorchTPU's autoload out of
    `import torch` for cpu, cuda and xla).
    """
    steps: list[dict] = []
    chosen: tuple[BackendFacts, int] | None = None
    for kind in PROBE_ORDER:
        if chosen is not None:
            steps.append(_step(kind, False, "skipped: an earlier backend matched"))
            continue
        if request.kind not in ("auto", kind):
            steps.append(_step(kind, False, f"skipped: --device {request.kind} requested"))
            continue
        facts = gather(kind)
        problem = _unmatched_reason(facts)
        if problem is None and request.index is not None and request.index >= facts.count:
            problem = f"device index {request.index} requested but only {facts.count} device(s) visible"
        if problem is not None:
            steps.append(_step(kind, False, problem))
            if request.kind == kind:
                raise UnsupportedDevice(
                    f"--device {request.kind} was requested but {KIND_BACKEND[kind]} is not usable: "
                    f"{problem}. Start the worker with --device auto or install the backend.",
                    steps,
                )
            continue
        index = request.index or 0
        name = facts.names[index] if index < len(facts.names) else kind
        steps.append(_step(kind, True, f"{facts.count} device(s); using index {index} ({name})"))
        chosen = (facts, index)
    if chosen is None:  # unreachable while CPU is always available; kept for clarity
        raise UnsupportedDevice("no usable device found", steps)
    facts, index = chosen
    devices = [_device_dict(facts, i) for i in range(facts.count)]
    if facts.kind == "tpu":
        # One process per chip: the others are served (or not) by their own workers.
        for d in devices:
            d["served_here"] = d["index"] == index
    device = devices[index]
    if facts.local_index is not None and facts.local_index != index:
        device["local_index"] = facts.local_index
    return ProbeResult(device=device, devices=devices, steps=steps)


class UnsupportedDevice(WorkerError):
    def __init__(self, message: str, steps: list[dict]) -> None:
        super().__init__("unsupported_device", message, recoverable=False)
        self.steps = steps


# ---------------------------------------------------------------------------------------------
# Gatherers: the only code here that touches real libraries.


def _err_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) < 300 else text[:297] + "..."


def gather_tpu(local_index: int | None = None, host_index: int | None = None) -> BackendFacts:
    """TorchTPU through `torch.accelerator` (its torch.tpu.is_available/device_count/synchronize
    are internal from torch 2.11 and raise RuntimeError when user code calls them).

    `local_index`: the device this process is bound to (0 under TPU_VISIBLE_DEVICES=N), which the
    host calls `host_index`. Only that
    device's memory is queried: the first memory query initialises the PJRT runtime, which
    claims the chip, and a TorchTPU process cannot drive another one.
    """
    f = BackendFacts("tpu")
    from .launch import dist_version, torch_tpu_install_problems, torch_tpu_installed

    if not torch_tpu_installed():
        f.importable, f.import_error = False, "ModuleNotFoundError: No module named 'torch_tpu'"
        return f
    problems = torch_tpu_install_problems()
    if problems:  # importing it would abort or raise: say why instead
        f.importable, f.import_error = False, "; ".join(problems)
        return f
    try:
        import torch
        import torch_tpu  # noqa: F401 - loads the backend when autoload was off
    except Exception as exc:  # noqa: BLE001 - any failure is a reason to report, not to crash
        f.importable, f.import_error = False, _err_text(exc)
        return f
    from .platforms import PLATFORMS

    tpu_v, libtpu_v = dist_version("torch-tpu"), dist_version("libtpu")
    f.version = f"{tpu_v or '?'} (libtpu {libtpu_v or 'missing'})"
    try:
        acc = torch.accelerator.current_accelerator()
        if acc is None or acc.type != "tpu":
            f.unavailable_reason = (
                "TorchTPU found no TPU chip exposed through VFIO (torch.accelerator.current_accelerator() "
                f"is {acc.type if acc is not None else None})"
            )
            return f
        f.available = bool(torch.accelerator.is_available())
        if not f.available:
            f.unavailable_reason = "torch.accelerator.is_available() returned False (no TPU chips visible)"
            return f
        f.count = int(torch.accelerator.device_count())
    except Exception as exc:  # noqa: BLE001
        f.available, f.unavailable_reason = False, f"torch.accelerator raised {_err_text(exc)}"
        return f
    f.local_index = local_index
    tpu = getattr(torch, "tpu", None)
    for i in range(f.count):
        f.names.append(_call_name(tpu, i, "TPU"))
        f.memory.append((None, None))
    served = local_index if local_index is not None else _current_index(torch)
    slot = host_index if host_index is not None else served
    if served is not None and slot is not None and slot < f.count:
        f.memory[slot] = PLATFORMS["tpu"].memory_info(served)
    return f


def _current_index(torch) -> int | None:
    try:
        return int(torch.accelerator.current_device_index())
    except Exception:  # noqa: BLE001
        return None


def _call_name(mod, index: int, fallback: str) -> str:
    import warnings

    fn = getattr(mod, "get_device_name", None)
    if fn is None:
        return fallback
    for call in (lambda: fn(index), fn):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # experimental-API notice
                return str(call())
        except TypeError:
            continue
        except Exception:  # noqa: BLE001
            break
    return fallback


def gather_xla() -> BackendFacts:
    f = BackendFacts("xla")
    try:
        import torch_xla
        import torch_xla.core.xla_model
        import torch_xla.runtime as xr
    except Exception as exc:  # noqa: BLE001
        f.importable, f.import_error = False, _err_text(exc)
        return f
    from .platforms import PLATFORMS

    f.version = getattr(torch_xla, "__version__", None)
    try:
        hw = str(xr.device_type() or "")
    except Exception as exc:  # noqa: BLE001
        f.unavailable_reason = f"torch_xla.runtime.device_type() raised {_err_text(exc)}"
        return f
    if hw.upper() in ("", "CPU"):
        f.unavailable_reason = f"torch_xla runtime device type is {hw or 'unset'} (set PJRT_DEVICE=TPU on a TPU VM)"
        return f
    try:
        count_fn = getattr(xr, "addressable_runtime_device_count", None) or xr.global_runtime_device_count
        f.count = int(count_fn())
    except Exception as exc:  # noqa: BLE001
        f.unavailable_reason = f"device count raised {_err_text(exc)}"
        return f
    f.available = f.count > 0
    if not f.available:
        f.unavailable_reason = "torch_xla reports 0 devices"
    for i in range(f.count):
        f.names.append(f"{hw} (torch_xla)")
        f.memory.append(PLATFORMS["xla"].memory_info(i))
    return f


def gather_cuda() -> BackendFacts:
    f = BackendFacts("cuda")
    try:
        import torch
    except Exception as exc:  # noqa: BLE001
        f.importable, f.import_error = False, _err_text(exc)
        return f
    f.version = torch.version.cuda
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        f.unavailable_reason = f"torch {torch.__version__} was built without CUDA"
        return f
    try:
        f.available = bool(torch.cuda.is_available())
    except Exception as exc:  # noqa: BLE001
        f.unavailable_reason = f"torch.cuda.is_available() raised {_err_text(exc)}"
        return f
    if not f.available:
        f.unavailable_reason = "torch.cuda.is_available() returned False (no driver or no visible GPU)"
        return f
    from .platforms import PLATFORMS

    f.count = torch.cuda.device_count()
    for i in range(f.count):
        f.names.append(torch.cuda.get_device_name(i))
        f.memory.append(PLATFORMS["cuda"].memory_info(i))
    return f


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def gather_cpu() -> BackendFacts:
    import torch

    from .platforms import PLATFORMS

    return BackendFacts(
        "cpu",
        available=True,
        count=1,
        names=[f"{_cpu_name()} ({os.cpu_count() or 1} cores, {torch.get_num_threads()} torch threads)"],
        memory=[PLATFORMS["cpu"].memory_info(None)],
        version=torch.__version__,
    )


GATHERERS: dict[str, Callable[[], BackendFacts]] = {
    "tpu": gather_tpu,
    "xla": gather_xla,
    "cuda": gather_cuda,
    "cpu": gather_cpu,
}


def probe(device: str = "auto", binding=None) -> ProbeResult:
    """`binding` (launch.Binding): the chip this process was bound to before import."""
    req = parse_device(device)
    if binding is not None and req.kind == binding.kind and req.index is None and binding.index is not None:
        req = DeviceRequest(req.kind, binding.index)  # the one chip the parent made visible

    def gather(kind: str) -> BackendFacts:
        if kind == "tpu":
            if binding is not None and binding.kind == "tpu":
                return gather_tpu(binding.local, binding.index)
            return gather_tpu()
        f = GATHERERS[kind]()
        if kind == "cuda" and binding is not None and binding.kind == "cuda" and binding.index is not None:
            f = _rebase_cuda(f, binding)
        return f

    return decide(req, gather)


def _rebase_cuda(f: BackendFacts, binding) -> BackendFacts:
    """Under CUDA_VISIBLE_DEVICES=N the process sees one GPU as cuda:0; the host calls it cuda:N."""
    if not f.available or f.count < 1 or binding.local is None or binding.local >= f.count:
        return f
    i, n = binding.local, binding.index
    pad = max(n + 1, f.count)
    names = [f.names[i] if k == n else f"{f.names[i]} (another worker's)" for k in range(pad)]
    memory = [f.memory[i] if k == n else (None, None) for k in range(pad)]
    return BackendFacts(
        "cuda",
        available=True,
        count=pad,
        names=names,
        memory=memory,
        version=f.version,
        local_index=i,
    )


def refresh_memory(device: dict) -> dict:
    """A copy of `device` with current free/total memory (called by status and load), asked of
    its platform (for cuda and tpu by the index inside this process)."""
    from .platforms import PLATFORMS

    local = device.get("local_index")
    index = device["index"] if local is None or device["kind"] == "xla" else local
    total, free = PLATFORMS[device["kind"]].memory_info(index)
    return {**device, "memory_total_bytes": total or device.get("memory_total_bytes"), "memory_free_bytes": free}
