"""The read-only reports: `describe` (the catalog as this worker sees it) and `status`."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import torch

from . import __version__
from .adapters.build import planned
from .adapters.text import model_chat_template
from .errors import WorkerError
from .kinds import implementation_for
from .memory import rss_bytes
from .probe import refresh_memory

# Libraries a model build may import on first use (adapters/build.py).
MODEL_LIBRARIES = ("transformers",)


def describe_models(worker) -> dict:
    """The `describe` op: every catalog entry, its weights checked and digested."""
    models = []
    for entry in [*worker.catalog.entries.values(), *worker.catalog.kept_entries().values()]:
        item: dict[str, Any] = {
            "id": entry.id,
            "task": entry.task,
            "architecture": entry.architecture,
            "description": entry.description,
            "format": entry.format,
            "parameters": None,
            "weight_bytes": None,
            "weight_digest": None,
            "dtypes": list(entry.dtypes),
            "default_dtype": entry.default_dtype,
            "limits": vars(entry.limits).copy(),
            "batching": vars(entry.batching).copy(),
            "input": {"shape": list(entry.input.shape), "dtype": entry.input.dtype} if entry.input else None,
            "loaded": entry.id in worker.served,
            "engine": entry.engine,
            "available": True,
            "problem": None,
        }
        try:
            _, info = worker.entry_and_weights(entry.id)
            item["parameters"] = info.parameters or None
            item["weight_bytes"] = info.weight_bytes
            item["weight_digest"] = worker.digests.digest(info.files)
            # The load's memory pre-flight per dtype, as this worker would compute it now (the
            # server's gate and placement use it: one estimate, memory.py).
            if implementation_for(entry).loads_in_worker:
                item["memory_bytes"] = {d: worker.estimate_load(entry, info, d) for d in entry.dtypes}
                # What a load in mode "compile" warms, one graph each: the server's estimator
                # prices that load by these (tools/support/estimate.ts), never by a copy of the plan.
                plan = planned(entry, worker.catalog, info.model_dir, worker.config_for(entry, info))
                item["plan_shapes"] = [{"kind": k, "batch": b, "length": n} for k, b, n in plan.forward_shapes()]
            if entry.task == "text-generation":
                # Read from the files, loaded or not: the server refuses `messages` for a model
                # without one before the call reaches this worker, and list_models shows it.
                item["chat_template"] = model_chat_template(info.model_dir, worker.catalog, entry) is not None
        except WorkerError as exc:
            item["available"], item["problem"] = False, exc.message
        served = worker.served.get(entry.id)
        if served is not None:
            item.update(served.describe())
        models.append(item)
    return {"models": models}


def _status_row(m, checksums: bool) -> dict:
    row = m.status_row()
    digest = m.weights_checksum() if checksums else None  # None: no weights in this process
    return {**row, "weights_checksum": digest} if digest else row


def worker_status(worker, *, checksums: bool = False) -> dict:
    """The `status` op: device memory now, loaded models, versions, uptime; with `checksums`, a
    checksum of each torch model's weights in memory (reads every weight: slow on large models)."""
    device = refresh_memory(worker.device_info)
    devices = [device if d["index"] == device["index"] else d for d in worker.probe.devices]
    loaded = [_status_row(m, checksums) for m in list(worker.served.values())]
    return {
        "device": device,
        "devices": devices,
        "probe": worker.probe.steps,
        "torch_version": torch.__version__,
        "backend_version": worker.device_info.get("backend_version"),
        "execution_mode": worker.platform.execution_mode(worker.device),
        "eager_mode": worker.platform.eager_mode_report(worker.device),
        "matmul_precision": worker.platform.matmul_precision(worker.device),
        "loaded": loaded,
        # The model libraries imported so far: the first load that needs one pays its import
        # (seconds to a minute on a busy host), which the server's estimate prices.
        "libraries": sorted(lib for lib in MODEL_LIBRARIES if lib in sys.modules),
        # None yet: the next load is this worker's first model build (priced as cold too).
        "models_built": worker.models_built,
        "rss_bytes": rss_bytes(),
        "uptime_s": round(time.monotonic() - worker.started, 3),
        "worker_version": __version__,
        "pid": os.getpid(),
    }
