"""Why an actor could not run, in one line an operator can act on (no Ray import; unit-tested).

Ray reports an actor that failed on its node as an exception whose text is a whole remote
traceback (and its workers print more). The causes we know are named here with their fix; the
rest keep their last informative line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_MISSING_MODULE = re.compile(r"No module named '([A-Za-z0-9_.]+)'")
_DEVICE = re.compile(
    r"unsupported_device|--device (tpu|cuda)\S* was requested|torch_tpu is not usable|no TPU chips", re.I
)
_DEVICE_WHY = re.compile(r"torch_tpu is not usable: [^.\"]*|no TPU chips[^;\"\n]*")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
MAX_LINE = 400


@dataclass(frozen=True)
class Diagnosis:
    code: str
    message: str


def import_fix(module: str) -> str:
    return (
        f"the actors cannot import {module!r} on their node (ModuleNotFoundError): install the worker package "
        "on every Ray node (`pip install ./runtime/worker` in the Python that `ray start` runs), or start every "
        "node's `ray start` with PYTHONPATH naming runtime/worker; then restart the server"
    )


def device_fix(device: str, why: str) -> str:
    return (
        f"the actors ask for device {device!r} but their node cannot provide it ({why}): on hosts without TPUs "
        'set runtime.ray.actor.device: "cpu" (on a cluster without "TPU" resources also placement.mode "count"), '
        "or add TPU hosts to the cluster; "
        "then restart the server"
    )


def last_line(text: str) -> str:
    """The last line that says something (Ray puts the cause at the end of a traceback)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if not ln.startswith(("File ", "^", "~", "Traceback", "(")) and not ln.startswith("raise "):
            return ln[:MAX_LINE]
    return (lines[-1] if lines else "")[:MAX_LINE]


def explain(text: str, device: str) -> Diagnosis | None:
    """A known cause in `text` (an actor's or a check's error), else None. `device`: what the
    actors ask for, as the operator would read it (preflight.device_label)."""
    if _DEVICE.search(text):  # first: a missing torch_tpu is the device's problem, not our package's
        why = _DEVICE_WHY.search(text)
        return Diagnosis(
            "ray_actor_device_unavailable",
            device_fix(device, why.group(0) if why else "the worker found no usable TPU"),
        )
    m = _MISSING_MODULE.search(text)
    if m:
        return Diagnosis("ray_actor_import_failed", import_fix(m.group(1)))
    return None


def reason(text: str, device: str) -> tuple[str | None, str]:
    """(code or None, one line) for an actor that died with `text`."""
    text = _ANSI.sub("", text)
    d = explain(text, device)
    return (d.code, d.message) if d else (None, last_line(text) or "actor died")
