"""Memory estimates made before loading, so a model that cannot fit is refused up front, and the
peak memory measured over a window (benchmark and check)."""

from __future__ import annotations

import contextlib
import os
import re
import sys

import torch

from .catalog import Entry
from .generation.prefix import pool_bytes
from .generation.slots import kv_layout, max_positions, slot_cache_bytes
from .platforms import platform_for
from .shapes import generation_plan

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GiB = 1024**3
MiB = 1024**2

# What a load adds to a worker beyond the model's tensors, measured 2026-12-07 on the CPU (torch
# 2.13, transformers 5.25, the 2-core development VM) as a fresh worker's resident-set growth
# (test_memory_estimate.py). The modules a first load imports, charged while not yet imported:
# torch._dynamo (the compile machinery, with sympy) with the first load of any model, 68–77 MiB;
# transformers' modelling modules with the first model it builds, 60–95 MiB more.
# llguidance (structured output), which a generation model's warm-up imports with its first
# MaskBuilder (generation/loop.py `seal`): 45–50 MiB measured in the worker, charged at 56.
FIRST_USE_BYTES = (
    ("torch._dynamo", 72 * MiB),
    ("transformers.modeling_utils", 84 * MiB),
    ("llguidance", 56 * MiB),
)
# The model's objects beside its tensors (tokenizer, module objects) and a first request's working
# set at batch 1, measured as above: 11–24 MiB on mnist-cnn and all-MiniLM.
REQUEST_BYTES = 24 * MiB
# A text-generation model's first request adds per vocabulary entry: its prefill's logits rows and
# the sampling's buffers (float32 whatever the dtype), and its tokenizer's tables; measured 7 MiB
# over REQUEST_BYTES on tiny-gpt2 (30,522 entries) and 17 MiB on SmolLM2 (49,152) once the caches
# were counted as allocated (2026-12-07), so ~700 B an entry, charged at 768.
VOCAB_ENTRY_BYTES = 768
# The load's warm-up of the token choice at every batch bucket (generation/loop.py `seal`,
# sampling.py `choose`): float32 and int64 temporaries [B, V] (the sort's values and indices,
# softmax, cumulative sums, log-probabilities, the grammar mask's copy). Its growth at the largest
# bucket, measured as above (2026-12-07): 66 B a row entry on SmolLM2 (8 x 49,152), 84 on
# tiny-gpt2 (16 x 30,522), the allocator keeping freed buffers; charged at 128.
CHOICE_ENTRY_BYTES = 128
# The same load's measured peak moves by about 1 % from run to run (SmolLM2 float32: 1,803-1,824
# MiB, 2026-12-07, against an estimate of 1,808 without this): the resident part is charged 2 % over.
RESIDENT_SLACK = 1.02


def kv_cache_bytes(entry: Entry, config: dict | None, dtype: str) -> int:
    """The static KV cache a text-generation model allocates at its load: SlotCache's tensors at
    the plan's slots and columns (generation/slots.py, rows.py), from the same config and plan."""
    if entry.task != "text-generation" or not config:
        return 0
    plan = generation_plan(entry, min(entry.limits.max_seq_len, max_positions(config)))
    return slot_cache_bytes(
        config,
        slots=plan.cache_slots,
        length=plan.cache_columns(entry.limits.max_new_tokens),
        itemsize=DTYPE_BYTES[dtype],
    )


def prefix_cache_bytes(entry: Entry, config: dict | None, dtype: str) -> int:
    """The prefix cache's pool a text-generation model allocates at its load beside the KV cache
    (generation/prefix.py `reserve`, rows.py), where its plan prefills behind cached prefixes."""
    if entry.task != "text-generation" or entry.engine != "torch" or not config:
        return 0
    if not generation_plan(entry, min(entry.limits.max_seq_len, max_positions(config))).cached_lengths:
        return 0
    layers, heads, dim = kv_layout(config)
    spec = entry.prefix_cache
    return pool_bytes(spec.max_bytes, spec.block_tokens, layers, heads, dim, DTYPE_BYTES[dtype])


def vocabulary_bytes(entry: Entry, config: dict | None) -> int:
    """What a text-generation model's first request adds per vocabulary entry (VOCAB_ENTRY_BYTES)."""
    if entry.task != "text-generation" or not config:
        return 0
    cfg = config.get("text_config") or config
    return int(cfg.get("vocab_size") or 0) * VOCAB_ENTRY_BYTES


def choice_bytes(entry: Entry, config: dict | None) -> int:
    """The load's warm-up of the token choice at the plan's largest batch (CHOICE_ENTRY_BYTES)."""
    if entry.task != "text-generation" or entry.engine != "torch" or not config:
        return 0
    cfg = config.get("text_config") or config
    plan = generation_plan(entry, min(entry.limits.max_seq_len, max_positions(config)))
    return max(plan.batches) * int(cfg.get("vocab_size") or 0) * CHOICE_ENTRY_BYTES


def first_use(entry: Entry) -> list[str]:
    """The modules a load of `entry` would import first in this process (FIRST_USE_BYTES)."""
    needs = ["torch._dynamo"]
    if entry.task in ("embedding", "text-generation"):
        needs.append("transformers.modeling_utils")
    if entry.task == "text-generation" and entry.engine == "torch":
        needs.append("llguidance")
    return [m for m in needs if m not in sys.modules]


def estimate_parts(
    parameters: int,
    entry: Entry,
    config: dict | None,
    dtype: str,
    *,
    weight_bytes: int | None = None,
    first: list[str] | tuple[str, ...] = (),
) -> dict[str, int]:
    """The pre-flight's terms, bytes: what a load and a first request add to the worker."""
    weights = parameters * DTYPE_BYTES[dtype]
    # Weights stored in another dtype are converted at load: the mapped file and the converted
    # copy are resident at once (the load's own peak, before the cache is allocated).
    converting = bool(weight_bytes and parameters) and round(weight_bytes / parameters) != DTYPE_BYTES[dtype]
    return {
        "first_use": sum(n for m, n in FIRST_USE_BYTES if m in first),
        "weights": weights,
        "conversion": weight_bytes if converting else 0,
        "kv_cache": kv_cache_bytes(entry, config, dtype),
        "prefix_cache": prefix_cache_bytes(entry, config, dtype),
        "choice": choice_bytes(entry, config),
        "request": REQUEST_BYTES + vocabulary_bytes(entry, config),
    }


def estimate_bytes(
    parameters: int,
    entry: Entry,
    config: dict | None,
    dtype: str,
    *,
    weight_bytes: int | None = None,
    first: list[str] | tuple[str, ...] = (),
) -> int:
    """The memory a load of `entry` as `dtype` and its first request add at their peak: the
    modules it imports first, the larger of the load's own peak (weights, and the file they are
    converted from) and what stays resident (weights, KV cache, the prefix cache's pool) with the warm-up's token
    choice at the largest batch, and
    the model's objects with a first request. Larger batches' activations are not in it: they
    are the benchmark's check (activation_bytes) and, on the CPU, the host's swap."""
    p = estimate_parts(parameters, entry, config, dtype, weight_bytes=weight_bytes, first=first)
    load = p["weights"] + p["conversion"]
    serving = p["weights"] + p["kv_cache"] + p["prefix_cache"] + p["choice"]
    return p["first_use"] + round(max(load, serving) * RESIDENT_SLACK) + p["request"]


def activation_bytes(entry: Entry, config: dict | None, dtype: str) -> int:
    """A deliberately generous allowance for activations at the entry's largest batch, which the
    benchmark scales to the batch it tries (bench/engine.py).

    Text encoders: ~16 live hidden-sized tensors per token plus one attention score matrix per
    head. Generation adds the KV cache as the load allocates it. Tensor models: the input and a
    few feature maps per item.
    """
    lim = entry.limits
    b = DTYPE_BYTES[dtype]
    cfg = config or {}
    if entry.task in ("embedding", "text-generation"):
        hidden = int(cfg.get("hidden_size") or cfg.get("n_embd") or 768)
        heads = int(cfg.get("num_attention_heads") or cfg.get("n_head") or 12)
        seq = lim.max_seq_len + lim.max_new_tokens
        act = lim.max_batch * seq * hidden * b * 16 + lim.max_batch * heads * seq * seq * 4
        if entry.task == "text-generation":
            act += kv_cache_bytes(entry, config, dtype)
            act += lim.max_batch * int(cfg.get("vocab_size", 32000)) * 4 * 2  # logits of the last step
        return int(act)
    items = 1
    for d in entry.input.shape if entry.input else (1,):
        items *= d
    return int(lim.max_batch * items * 4 * 64)


def fmt_bytes(n: int | float | None) -> str:
    if n is None:
        return "unknown"
    if n >= GiB:
        return f"{n / GiB:.2f} GiB"
    return f"{n / 1024**2:.1f} MiB"


def refusal_message(
    *,
    model: str,
    dtype: str,
    need: int,
    free: int,
    device: str,
    alternatives: dict[str, int],
    loaded: list[tuple[str, int]],
) -> str:
    """Says what would fit: a smaller dtype, or which loaded models to unload."""
    msg = f"loading {model!r} as {dtype} needs about {fmt_bytes(need)} but {device} has {fmt_bytes(free)} free"
    fits = [d for d, n in sorted(alternatives.items(), key=lambda kv: kv[1]) if d != dtype and n <= free]
    hints = []
    if fits:
        d = fits[0]
        hints.append(f"use dtype {d} (needs about {fmt_bytes(alternatives[d])})")
    freed, names = 0, []
    for name, size in sorted(loaded, key=lambda kv: -kv[1]):
        if free + freed >= need:
            break
        freed += size
        names.append(name)
    if names and free + freed >= need:
        hints.append("unload " + ", ".join(repr(n) for n in names))
    if not hints:
        hints.append("use a device with more memory or a smaller model")
    return msg + ": " + " or ".join(hints)


def _proc_status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            m = re.search(rf"^{field}:\s+(\d+)\s+kB", fh.read(), re.M)
        return int(m.group(1)) if m else None
    except OSError:
        return None


def rss_bytes() -> int | None:
    """This process's resident set now."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class MemoryProbe:
    """Peak memory over a window, by the best means the device's platform offers.

    Devices with peak counters (cuda: torch.cuda, tensors only; tpu and other accelerators:
    torch.accelerator): the maximum allocated after a reset. Where the reset fails: memory in use
    (the platform's total - free) sampled between iterations.
    cpu: the process's resident set. VmHWM is a process-lifetime high-water mark, so it is reset
    to the current RSS through /proc/self/clear_refs at the start of the window; where that is
    not allowed, VmRSS is sampled between iterations (a lower bound). The increase is the peak
    minus the resident size at the start; on the CPU it is a lower bound too, since the allocator
    reuses memory the process already holds.
    """

    SAMPLED = "accelerator_memory_in_use_sampled"

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.platform = platform_for(device)
        self.kind = "unavailable"
        self.base: int | None = None
        self.peak: int | None = None

    def _in_use(self) -> int:
        total, free = self.platform.memory_info(self.device.index or 0)
        if total is None or free is None:
            raise RuntimeError("the platform reports no memory in use")
        return int(total - free)

    def start(self) -> None:
        d, plat = self.device, self.platform
        self.base = self.peak = None
        try:
            if d.type == "cpu":
                try:
                    with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
                        fh.write("5")
                    self.kind = "cpu_peak_rss"
                except OSError:
                    self.kind = "cpu_sampled_rss"
                rss = _proc_status_kib("VmRSS")
                self.base = self.peak = rss * 1024 if rss is not None else None
                return
            try:
                plat.reset_peak(d)
                self.base = plat.memory_allocated(d)
                self.kind = plat.peak_counter_kind or "unavailable"
            except Exception:  # noqa: BLE001 - fall back to sampling the memory in use
                self.base = self.peak = self._in_use()
                self.kind = self.SAMPLED
        except Exception:  # noqa: BLE001 - peak memory is best effort
            self.kind = "unavailable"

    def sample(self) -> None:
        if self.kind == "cpu_sampled_rss":
            rss = _proc_status_kib("VmRSS")
            if rss is not None:
                self.peak = max(self.peak or 0, rss * 1024)
        elif self.kind == self.SAMPLED:
            with contextlib.suppress(Exception):
                self.peak = max(self.peak or 0, self._in_use())

    def result(self) -> tuple[int | None, int | None, str]:
        """(peak bytes, increase over the start of the window, kind)."""
        peak = self.peak
        try:
            if self.kind == "cpu_peak_rss":
                hwm = _proc_status_kib("VmHWM")
                peak = hwm * 1024 if hwm is not None else None
            elif self.kind == self.platform.peak_counter_kind:
                peak = self.platform.max_memory_allocated(self.device)
            else:
                self.sample()
                peak = self.peak
        except Exception:  # noqa: BLE001
            return None, None, "unavailable"
        inc = max(0, peak - self.base) if peak is not None and self.base is not None else None
        return peak, inc, self.kind
