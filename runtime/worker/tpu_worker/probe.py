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
    if device["kind"] == "cpu":
        return "cpu"
    return f"{device['kind']}:{device['index']}"


def tpu_hbm_from_name(name: str) -> int | None:
    """Maps a TPU device name ("TPU v5 lite", "TPU v6e", "v5p"...) to its HBM per chip."""
    n = name.lower().replace("-", " ")
    if "v5p" in n:
        return TPU_HBM_BYTES["v5p"]
    if "v5e" in n or "v5 lite" in n or "v5lite" in n:
        return TPU_HBM_BYTES["v5e"]
    if "v6e" in n or "v6 lite" in n or "v6" in n:
        return TPU_HBM_BYTES["v6e"]
    if re.search(r"\bv7", n) or "7x" in n or "ironwood" in n:
        return TPU_HBM_BYTES["v7"]
    if "v4" in n:
        return TPU_HBM_BYTES["v4"]
    return None


def _device_dict(facts: BackendFacts, index: int) -> dict:
    total, free = facts.memory[index] if index < len(facts.memory) else (None, None)
    name = facts.names[index] if index < len(facts.names) else facts.kind
    if facts.kind == "tpu" and total is None:
        total = tpu_hbm_from_name(name)
    return {
        "kind": facts.kind,
        "name": name,
        "index": index,
        "count": facts.count,
        "memory_total_bytes": total,
        "memory_free_bytes": free,
        "backend": KIND_BACKEND[facts.kind],
        "backend_version": facts.version,
    }


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
    `--device cpu` never imports TorchTPU or touches an accelerator.
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
    return ProbeResult(device=devices[index], devices=devices, steps=steps)


class UnsupportedDevice(WorkerError):
    def __init__(self, message: str, steps: list[dict]) -> None:
        super().__init__("unsupported_device", message, recoverable=False)
        self.steps = steps


# ---------------------------------------------------------------------------------------------
# Gatherers: the only code here that touches real libraries.


def _err_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) < 300 else text[:297] + "..."


def gather_tpu() -> BackendFacts:
    f = BackendFacts("tpu")
    try:
        import torch
        import torch_tpu
    except Exception as exc:  # noqa: BLE001 - any failure is a reason to report, not to crash
        f.importable, f.import_error = False, _err_text(exc)
        return f
    f.version = getattr(torch_tpu, "__version__", None)
    tpu = getattr(torch, "tpu", None)
    if tpu is None:
        f.available, f.unavailable_reason = False, "torch_tpu imported but torch.tpu is missing"
        return f
    try:
        f.available = bool(tpu.is_available())
    except Exception as exc:  # noqa: BLE001
        f.available, f.unavailable_reason = False, f"torch.tpu.is_available() raised {_err_text(exc)}"
        return f
    if not f.available:
        f.unavailable_reason = "torch.tpu.is_available() returned False (no TPU chips visible to this process)"
        return f
    try:
        count_fn = getattr(tpu, "device_count", None) or torch.accelerator.device_count
        f.count = int(count_fn())
    except Exception as exc:  # noqa: BLE001
        f.available, f.unavailable_reason = False, f"device_count() raised {_err_text(exc)}"
        return f
    for i in range(f.count):
        f.names.append(_call_name(tpu, i, "TPU"))
        f.memory.append(_accelerator_memory(i))
    return f


def _call_name(mod, index: int, fallback: str) -> str:
    fn = getattr(mod, "get_device_name", None)
    if fn is None:
        return fallback
    for call in (lambda: fn(index), fn):
        try:
            return str(call())
        except TypeError:
            continue
        except Exception:  # noqa: BLE001
            break
    return fallback


def _accelerator_memory(index: int) -> tuple[int | None, int | None]:
    try:
        import torch

        free, total = torch.accelerator.get_memory_info(index)
        return int(total), int(free)
    except Exception:  # noqa: BLE001 - not every backend implements it
        return None, None


def gather_xla() -> BackendFacts:
    f = BackendFacts("xla")
    try:
        import torch_xla
        import torch_xla.core.xla_model as xm
        import torch_xla.runtime as xr
    except Exception as exc:  # noqa: BLE001
        f.importable, f.import_error = False, _err_text(exc)
        return f
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
        f.memory.append(_xla_memory(xm, i))
    return f


def _xla_memory(xm, index: int) -> tuple[int | None, int | None]:
    try:
        import torch

        info = xm.get_memory_info(torch.device(f"xla:{index}"))
    except Exception:  # noqa: BLE001
        return None, None
    return parse_xla_memory_info(info)


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
    f.count = torch.cuda.device_count()
    for i in range(f.count):
        f.names.append(torch.cuda.get_device_name(i))
        try:
            free, total = torch.cuda.mem_get_info(i)
            f.memory.append((int(total), int(free)))
        except Exception:  # noqa: BLE001
            f.memory.append((None, None))
    return f


def read_meminfo(path: str = "/proc/meminfo") -> tuple[int | None, int | None]:
    """(MemTotal, MemAvailable) in bytes from /proc/meminfo; None when unreadable."""
    values: dict[str, int] = {}
    try:
        with open(path, encoding="ascii") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts and parts[0].isdigit():
                    values[key] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    except OSError:
        return None, None
    return values.get("MemTotal"), values.get("MemAvailable")


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

    return BackendFacts(
        "cpu",
        available=True,
        count=1,
        names=[f"{_cpu_name()} ({os.cpu_count() or 1} cores, {torch.get_num_threads()} torch threads)"],
        memory=[read_meminfo()],
        version=torch.__version__,
    )


GATHERERS: dict[str, Callable[[], BackendFacts]] = {
    "tpu": gather_tpu,
    "xla": gather_xla,
    "cuda": gather_cuda,
    "cpu": gather_cpu,
}


def probe(device: str = "auto") -> ProbeResult:
    return decide(parse_device(device), lambda kind: GATHERERS[kind]())


def refresh_memory(device: dict) -> dict:
    """A copy of `device` with current free/total memory (called by status and load)."""
    kind, idx = device["kind"], device["index"]
    total, free = device.get("memory_total_bytes"), None
    if kind == "cpu":
        total, free = read_meminfo()
    elif kind == "cuda":
        try:
            import torch

            free, total = (int(v) for v in torch.cuda.mem_get_info(idx))
        except Exception:  # noqa: BLE001
            pass
    elif kind == "tpu":
        t, fr = _accelerator_memory(idx)
        total, free = t or total, fr
    elif kind == "xla":
        try:
            import torch_xla.core.xla_model as xm

            t, fr = _xla_memory(xm, idx)
            total, free = t or total, fr
        except Exception:  # noqa: BLE001
            pass
    return {**device, "memory_total_bytes": total, "memory_free_bytes": free}
