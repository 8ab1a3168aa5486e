"""Whether a model's forward is shape-stable under its plan: traced once by dynamo
(`torch._dynamo.explain`) at the plan's bucket, a forward is stable when it is one graph, with
no graph break. A break is why a TPU would not run it as one compiled graph per shape: a host
read of a tensor's value (`.item()`), an op whose output shape depends on the data
(`nonzero`), a Python branch on a tensor's value, or anything else dynamo cannot trace (its
reason kept).

The trace is bounded: past `limit_s`, or on a cancel, a watchdog raises `AuditStopped` in the
tracing thread and the verdict is unknown (None). The trace costs seconds, so `check_model` runs
it only when asked (`shape_audit: true`). `explain` resets dynamo's caches, which would
drop the compiled graphs of a model served in mode "compile" (and make it recompile): the worker
does not audit while one is served (`blocked`).
"""

from __future__ import annotations

import ctypes
import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from .cancel import NEVER, CancelToken

LIMIT_S = 60.0  # the longest trace: the built-ins take 1-16 s on a 2-core CPU
MAX_BREAKS = 8  # the breaks listed (all are counted)
_PATH_RE = re.compile(r"(/[\w.+-]+){2,}")


class AuditStopped(BaseException):
    """Raised into the tracing thread (a BaseException, so dynamo's `except Exception` lets it by)."""


def break_kind(reason: str) -> str:
    """What a graph break means for a TPU, from dynamo's reason text."""
    if "Tensor.item()" in reason or "capture_scalar_outputs" in reason:
        return "item_call"
    if "Dynamic shape operator" in reason or "dynamic_output_shape" in reason:
        return "data_dependent_shape"
    if "generic_jump" in reason or "Data-dependent" in reason or "data-dependent" in reason:
        return "data_dependent_branch"
    return "graph_break"


def _where(stack) -> str | None:
    if not stack:
        return None
    f = stack[-1]
    return f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} in {f.name}"


def _break(r) -> dict:
    text = (str(r.reason).strip().splitlines() or [""])[0]
    return {
        "kind": break_kind(str(r.reason)),
        "reason": _PATH_RE.sub("<path>", text)[:200],
        "where": _where(r.user_stack),
    }


def unaudited(why: str, audit_s: float | None = None) -> dict:
    """A report without a verdict, and why."""
    out = {"shape_stable": None, "graphs": None, "graph_breaks": None, "breaks": [], "unaudited": why}
    return out if audit_s is None else {**out, "audit_s": audit_s}


def audit(
    fn: Callable[[Any], Any],
    inputs: Any,
    *,
    limit_s: float = LIMIT_S,
    token: CancelToken = NEVER,
    blocked: str | None = None,
) -> dict:
    """{shape_stable: bool | None, graphs, graph_breaks, breaks: [{kind, reason, where}],
    audit_s, unaudited: why the verdict is None}."""
    if blocked:
        return unaudited(blocked)
    ident = threading.get_ident()
    lock = threading.Lock()
    state = {"done": False, "stopped": None}

    def watch() -> None:
        deadline = time.monotonic() + limit_s
        while True:
            time.sleep(0.02)
            with lock:
                if state["done"]:
                    return
                if token.cancelled or time.monotonic() > deadline:
                    state["stopped"] = "cancelled" if token.cancelled else f"the trace ran past {limit_s:g} s"
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(AuditStopped))
                    return

    quiet = logging.getLogger("torch._dynamo")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # dynamo warns of each break on stderr; the report says it
    t0 = time.perf_counter()
    watchdog = threading.Thread(target=watch, name="shape-audit-watchdog", daemon=True)
    out = None
    try:
        try:
            watchdog.start()
            with torch.no_grad():
                out = torch._dynamo.explain(fn)(inputs)
        finally:
            with lock:
                state["done"] = True
    except AuditStopped:
        torch._dynamo.reset()  # drop what the cut trace left
    except Exception as exc:  # noqa: BLE001 - a forward dynamo cannot run at all: no verdict
        state["stopped"] = f"dynamo could not trace the forward ({type(exc).__name__})"
    finally:
        quiet.setLevel(level)
        watchdog.join()
    took = round(time.perf_counter() - t0, 3)
    if out is None:
        return unaudited(state["stopped"] or "the trace was stopped", took)
    breaks = [_break(r) for r in out.break_reasons]
    return {
        "shape_stable": out.graph_count == 1 and not breaks,
        "graphs": out.graph_count,
        "graph_breaks": len(breaks),
        "breaks": breaks[:MAX_BREAKS],
        "audit_s": took,
    }
