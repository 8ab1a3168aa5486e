"""Direct baseline: the same model, inputs and adapter code as the worker, with no server.

Loads a catalog model with tpu_worker's own adapter (PYTHONPATH=runtime/worker) and times what
the worker does for one `infer` — `adapter.prepare` (tokenisation) + `adapter.run_batch`
(padding, forward, pooling, copy to CPU) — in one thread, without the batcher, pipe or MCP.

It is a long-lived helper so the Node harness can interleave it with MCP calls: one JSON
command per stdin line, one JSON answer per stdout line.
  {"op": "infer", "texts": [...], "n": 1}  ->  {"ms": [...]}   (per-call wall time, ms)
  {"op": "info"}                          ->  {"pid", "torch_threads", ...}
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> int:
    catalog_path, model_id = sys.argv[1], sys.argv[2]
    # Same import-time switches as tpu_worker.__main__ (the OpenMP spin among them), and the
    # worker's torch thread count (the harness sets BENCH_TORCH_THREADS to the server's --threads).
    from tpu_worker.launch import OPENMP_SPIN

    os.environ.setdefault("GOMP_SPINCOUNT", OPENMP_SPIN)
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    threads = int(os.environ.get("BENCH_TORCH_THREADS", "0"))

    import torch
    from tpu_worker.adapters import build_adapter
    from tpu_worker.catalog import load_catalog
    from tpu_worker.loaders import inspect_weights

    if threads > 0:
        torch.set_num_threads(threads)
    catalog = load_catalog(catalog_path)
    entry = catalog.get(model_id)
    info = inspect_weights(entry, catalog)
    adapter = build_adapter(entry, catalog, info, torch.device("cpu"), entry.default_dtype)
    never = lambda: False

    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "info":
            reply = {"pid": os.getpid(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__}
        elif cmd["op"] == "infer":
            # Text models take `texts`; tensor models `shape` (float32 values from `values`,
            # repeated to fill it, so every side gets the same input).
            if "texts" in cmd:
                args, tensors = {"texts": cmd["texts"]}, []
            else:
                shape = cmd["shape"]
                values = torch.tensor(cmd["values"], dtype=torch.float32)
                numel = 1
                for d in shape:
                    numel *= d
                args = {}
                tensors = [values.repeat(numel // values.numel() + 1)[:numel].reshape(shape)]
            ms = []
            for _ in range(int(cmd.get("n", 1))):
                t0 = time.perf_counter()
                prepared = adapter.prepare(args, tensors)
                adapter.run_batch([prepared], never)
                ms.append((time.perf_counter() - t0) * 1000.0)
            reply = {"ms": ms}
        else:
            reply = {"error": f"unknown op {cmd['op']!r}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
