"""Preflight check: one forward on the target device under a TorchDispatchMode that records
every ATen op, whether it ran on the device, fell back to the host, or failed.

Result: {model, device, dtype, batch, seq_len, attention, ops: [{op, category, count, on_device,
fell_back, failed}], categories: {category: calls}, total_ops, unique_ops, verdict,
estimated_memory_bytes, measured_peak_memory_bytes, measured_memory_kind, parameters,
weight_bytes, forward_s, output_shape, fallback_detection, shape_report, error}. The forward runs
at the shape plan's bucket; `shape_report` is that shape, its padding and the shape-stability
verdict of shape_audit.py. `on_device`, `fell_back` and
`failed` are call counts per op (0 = never). verdict: "supported" (every op ran on the device),
"partial" (some ops fell back to the host) or "unsupported" (the forward failed).

`attention`: "default" records what the dispatcher really runs on this device (on the CPU a fused
scaled-dot-product attention kernel); "math" forces attention through its unfused math path
(batched matmuls + softmax), which is what a backend without a fused kernel runs.
"""

from __future__ import annotations

import contextlib
import re
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from . import logs
from .cancel import NEVER, CancelToken
from .errors import WorkerError, invalid
from .memory import MemoryProbe
from .platforms import platform_for
from .shape_audit import audit, unaudited
from .shapes import ShapeCounter

_PATH_RE = re.compile(r"(/[\w.+-]+){2,}")

ATTENTION = ("default", "math")

# ATen op name (without "aten::" and overload) -> category; first match wins.
_CATEGORIES: list[tuple[str, str]] = [
    (r"scaled_dot_product|flash_attention|efficient_attention|_attention", "attention"),
    (r"^(mm|addmm|bmm|baddbmm|matmul|linear|_int_mm|addmv|mv|dot|einsum)$", "matmul"),
    (r"convolution|conv\d?d|cudnn_conv|mkldnn_conv", "convolution"),
    (r"layer_norm|group_norm|batch_norm|rms_norm|instance_norm", "normalization"),
    (r"softmax", "softmax"),
    (r"^(gelu|relu|silu|tanh|sigmoid|hardtanh|elu|leaky_relu|mish|threshold)", "activation"),
    (r"embedding", "embedding"),
    (r"pool", "pooling"),
    (r"^(sum|mean|amax|amin|max|min|argmax|argmin|all|any|norm|linalg_vector_norm|var|std|cumsum|prod)", "reduction"),
    (
        r"^(view|_unsafe_view|reshape|t|transpose|permute|expand|slice|select|unsqueeze|squeeze|"
        r"contiguous|clone|cat|stack|split|gather|index|_to_copy|copy_|as_strided|detach|alias|flatten)",
        "data_movement",
    ),
]


def op_category(name: str) -> str:
    base = name.split("::", 1)[-1].split(".", 1)[0]
    for pattern, cat in _CATEGORIES:
        if re.search(pattern, base):
            return cat
    return "elementwise" if base else "other"


def _tensor_devices(tree) -> set[str]:
    leaves, _ = tree_flatten(tree)
    return {t.device.type for t in leaves if isinstance(t, torch.Tensor)}


class OpRecorder(TorchDispatchMode):
    """Counts ATen ops and classifies where each call ran. With a cancel token, a cancelled
    request stops at the next op instead of running the whole forward (a slow dtype's forward
    can take minutes; the server stops a check when the caller's read allowance runs out)."""

    def __init__(self, target: torch.device, token: CancelToken = NEVER) -> None:
        super().__init__()
        self.target = target.type
        self.token = token
        self.stats: dict[str, list[int]] = {}  # op -> [count, on_device, fell_back, failed]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.token.check()
        kwargs = kwargs or {}
        name = func.name() if hasattr(func, "name") else str(func)
        rec = self.stats.setdefault(name, [0, 0, 0, 0])
        rec[0] += 1
        try:
            out = func(*args, **kwargs)
        except Exception:
            rec[3] += 1
            raise
        outs = _tensor_devices(out)
        ins = _tensor_devices((args, kwargs))
        if self.target == "cpu" or (not outs and not ins):
            rec[1] += 1
        elif outs and self.target not in outs and self.target in ins:
            rec[2] += 1  # inputs were on the device, results came back on the host
        elif outs <= {self.target} or (not outs and self.target in ins):
            rec[1] += 1
        else:
            rec[2] += 1
        return out

    def table(self) -> list[dict]:
        rows = [
            {"op": k, "category": op_category(k), "count": v[0], "on_device": v[1], "fell_back": v[2], "failed": v[3]}
            for k, v in self.stats.items()
        ]
        rows.sort(key=lambda r: (-r["failed"], -r["fell_back"], -r["count"], r["op"]))
        return rows


def _safe_error(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    text = _PATH_RE.sub("<path>", text)[:300]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _attention(kind: str):
    if kind != "math":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.MATH])


def run_check(worker, args: dict, ctx) -> dict:
    entry = worker.catalog.get(args.get("model"))
    device = worker.target_device(args.get("device"))
    dtype = worker.dtype_arg(entry, args.get("dtype"))
    batch = args.get("batch", 1)
    if not isinstance(batch, int) or isinstance(batch, bool) or not 1 <= batch <= entry.limits.max_batch:
        raise invalid(f"args.batch must be an integer in 1..{entry.limits.max_batch}")
    seq_len = None
    if entry.limits.max_seq_len:
        seq_len = args.get("seq_len", min(32, entry.limits.max_seq_len))
        if not isinstance(seq_len, int) or isinstance(seq_len, bool) or not 2 <= seq_len <= entry.limits.max_seq_len:
            raise invalid(f"args.seq_len must be an integer in 2..{entry.limits.max_seq_len}")
    attention = args.get("attention", "default")
    if attention not in ATTENTION:
        raise invalid(f"args.attention must be one of {', '.join(ATTENTION)}")
    # The dynamo trace costs seconds (more than the forward itself): it runs only when asked.
    traced = args.get("shape_audit", False)
    if not isinstance(traced, bool):
        raise invalid("args.shape_audit must be true or false")
    _, info = worker.entry_and_weights(entry.id)
    with worker.adapter_for(entry, info, device, dtype, "eager", ctx.token) as lease:
        ctx.token.check()
        ran = _record(lease.adapter, device, batch, seq_len, attention, entry.id, ctx.token)
        parameters = lease.adapter.parameters()
        if not traced:
            stability = unaudited("not asked (shape_audit: true traces the forward with dynamo)")
        elif ran["error"] is not None:
            stability = unaudited("the forward failed")
        else:
            stability = audit(
                lease.adapter.forward_example, ran["at_bucket"], token=ctx.token, blocked=_audit_blocked(worker)
            )
    ctx.token.check()
    return {
        "model": entry.id,
        "device": str(device),
        "dtype": dtype,
        "batch": batch,
        "seq_len": seq_len,
        "attention": attention,
        "ops": ran["ops"],
        "categories": ran["categories"],
        "total_ops": sum(r["count"] for r in ran["ops"]),
        "unique_ops": len(ran["ops"]),
        "verdict": ran["verdict"],
        "estimated_memory_bytes": lease.estimated_bytes,
        "measured_peak_memory_bytes": ran["peak"],
        "measured_memory_kind": ran["memory_kind"],
        "parameters": parameters,
        "weight_bytes": info.weight_bytes,
        "forward_s": ran["forward_s"],
        "output_shape": ran["output_shape"],
        "fallback_detection": platform_for(device).fallback_detection,
        "shape_report": {**_shape_report(ran["shapes"]), **stability},
        "error": ran["error"],
    }


def _audit_blocked(worker) -> str | None:
    """Why the dynamo trace cannot run now: it resets every compiled graph of the process."""
    compiled = sorted(k for k, m in list(worker.served.items()) if getattr(m, "mode", None) == "compile")
    if not compiled:
        return None
    return (
        f"not traced while {', '.join(compiled)} is served compiled (dynamo's trace would drop its graphs); "
        "unload it, or check on a worker without one"
    )


def _shape_report(shapes: dict) -> dict:
    """The shapes the check's forward ran at (the plan's bucket for its batch and length) and how
    much of that padded work was real."""
    return {
        "distinct_shapes": shapes["distinct_shapes"],
        "shapes": [[s["batch"], s["length"]] for s in shapes["shapes"]],
        "real_to_padded": shapes["real_to_padded"],
        "padding_waste": shapes["padding_waste"],
    }


def _record(
    adapter, device, batch: int, seq_len: int | None, attention: str, model: str, token: CancelToken = NEVER
) -> dict:
    """One forward under the op recorder and the memory probe."""
    recorder = OpRecorder(device, token)
    error = None
    output_shape = None
    probe = MemoryProbe(device)
    probe.start()
    t0 = time.perf_counter()
    shapes = ShapeCounter()
    padded = None
    try:
        inputs = adapter.example(batch, seq_len, seed=0)
        # The forward a request of this shape runs: padded to the plan's bucket (outside the
        # recorder, as the batcher pads before the forward), the padding cut from its output.
        padded = inputs
        if adapter.plan is not None:
            padded, bucket, length, real = adapter.pad_to_plan(inputs)
            shapes.record("forward", bucket, length, real)
        with torch.no_grad(), _attention(attention), recorder:
            out = adapter.forward_example(padded)
        platform_for(device).synchronize(device)
        if adapter.plan is not None:
            out = adapter.unpad(out, inputs)
        if isinstance(out, torch.Tensor):
            output_shape = list(out.shape)
    except Exception as exc:
        if isinstance(exc, WorkerError):
            raise
        error = _safe_error(exc)
        logs.warn("check forward failed", model=model, device=str(device), error=f"{type(exc).__name__}: {exc}")
    forward_s = time.perf_counter() - t0
    peak, _, memory_kind = probe.result()
    ops = recorder.table()
    categories: dict[str, int] = {}
    for r in ops:
        categories[r["category"]] = categories.get(r["category"], 0) + r["count"]
    if error is not None:
        verdict = "unsupported"
    elif any(r["fell_back"] for r in ops):
        verdict = "partial"
    else:
        verdict = "supported"
    return {
        "ops": ops,
        "categories": categories,
        "verdict": verdict,
        "peak": peak,
        "memory_kind": memory_kind,
        "forward_s": round(forward_s, 6),
        "output_shape": output_shape,
        "shapes": shapes.report(),
        "at_bucket": padded,
        "error": error,
    }
