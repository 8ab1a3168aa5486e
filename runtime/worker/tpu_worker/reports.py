"""The read-only reports: `describe` (the catalog as this worker sees it) and `status`."""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

import torch

from . import __version__
from .adapters.text import model_chat_template
from .errors import WorkerError
from .memory import rss_bytes
from .probe import refresh_memory


def describe_models(worker) -> dict:
    """The `describe` op: every catalog entry, its weights checked and digested."""
    models = []
    for entry in worker.catalog.entries.values():
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
            "loaded": entry.id in worker.loaded or entry.id in worker.engines,
            "engine": entry.engine,
            "available": True,
            "problem": None,
        }
        try:
            _, info = worker.entry_and_weights(entry.id)
            item["parameters"] = info.parameters or None
            item["weight_bytes"] = info.weight_bytes
            item["weight_digest"] = worker.digests.digest(info.files)
            if entry.task == "text-generation":
                # Read from the files, loaded or not: the server refuses `messages` for a model
                # without one before the call reaches this worker, and list_models shows it.
                item["chat_template"] = model_chat_template(info.model_dir, worker.catalog, entry) is not None
        except WorkerError as exc:
            item["available"], item["problem"] = False, exc.message
        models.append(item)
    return {"models": models}


def weights_checksum(module: torch.nn.Module) -> str:
    """SHA-256 over the module's state (names, dtypes, shapes and bytes) as it is in memory now:
    what `status` reports when asked, so a client can see that nothing wrote to a served model."""
    h = hashlib.sha256()
    for name, t in module.state_dict().items():
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return "sha256:" + h.hexdigest()


def worker_status(worker, *, checksums: bool = False) -> dict:
    """The `status` op: device memory now, loaded models, versions, uptime; with `checksums`, a
    checksum of each torch model's weights in memory (reads every weight: slow on large models)."""
    device = refresh_memory(worker.device_info)
    devices = [device if d["index"] == device["index"] else d for d in worker.probe.devices]
    loaded = [
        {
            "model": m.entry.id,
            "device": m.device,
            "dtype": m.dtype,
            "mode": m.mode,
            "parameters": m.adapter.parameters(),
            "bytes_on_device": m.adapter.bytes_on_device(),
            "queue_depth": m.batcher.queue_depth,
            "batching": {**m.batcher.describe(), **vars(m.batcher.stats)},
            "loaded_at": m.loaded_at,
            **({"weights_checksum": weights_checksum(m.adapter.eager_model)} if checksums else {}),
        }
        for m in list(worker.loaded.values())
    ]
    loaded += [
        {
            "model": e.entry.id,
            "device": e.device,
            "dtype": e.dtype,
            "mode": e.mode,
            "parameters": e.engine.parameters(),
            "bytes_on_device": e.engine.bytes_on_device(),
            "queue_depth": e.engine.counters.in_flight,
            "loaded_at": e.loaded_at,
            # The engine, its version and health: what get_runtime_status and doctor show.
            "engine": e.engine.status(),
        }
        for e in list(worker.engines.values())
    ]
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
        "rss_bytes": rss_bytes(),
        "uptime_s": round(time.monotonic() - worker.started, 3),
        "worker_version": __version__,
        "pid": os.getpid(),
    }
