"""What a dtype costs on this host's CPU, measured with the worker's own adapters on the built-in models.

For each model and shape, builds the model in float32, bfloat16 and float16 the way the worker
does (`Worker.adapter_for`, as `check` and `benchmark` get it) and times its forward
(`forward_example`, what both ops run), plainly and under check_model's op recorder, round by
round with the dtypes interleaved. Times are CPU seconds of the process (every torch thread),
the fastest of all rounds: on a shared host the wall clock measures the neighbours, the CPU time
the work. Prints each dtype's time over float32's. The estimator's `dtype_cost_factor`
(policies/estimate.ts) holds the result for device kind "cpu".

  PYTHONPATH=runtime/worker .venv/bin/python bench/dtype_cost.py [rounds] [threads]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DTYPES = ("float32", "bfloat16", "float16")
# (model, batch, seq_len): the check's default shape and a larger one per model.
SHAPES = [
    ("mnist-cnn", 1, None),
    ("mnist-cnn", 256, None),
    ("all-minilm-l6-v2", 1, 32),
    ("all-minilm-l6-v2", 8, 256),
    ("tiny-gpt2", 1, 32),
    ("tiny-gpt2", 16, 128),
]


def cpu_ms(fn, n: int) -> float:
    best = float("inf")
    for _ in range(n):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best * 1000


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    import torch
    from tpu_worker.cancel import NEVER
    from tpu_worker.catalog import load_catalog
    from tpu_worker.check import OpRecorder
    from tpu_worker.ops import Worker
    from tpu_worker.probe import probe

    torch.set_num_threads(threads)
    with open(os.path.join(REPO, "runtime", "catalog.builtin.json"), encoding="utf-8") as fh:
        data = json.load(fh)
    data["model_roots"] = [os.path.join(REPO, ".data", "models")]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(data, fh)
    worker = Worker(load_catalog(fh.name), probe("cpu"))
    cpu = torch.device("cpu")
    plain: dict[tuple, float] = {}
    recorded: dict[tuple, float] = {}
    try:
        for _ in range(rounds):
            for model, batch, seq in SHAPES:
                entry, info = worker.entry_and_weights(model)
                for dtype in DTYPES:
                    key = (model, batch, seq, dtype)
                    with worker.adapter_for(entry, info, cpu, dtype, "eager", NEVER) as lease:
                        adapter = lease.adapter
                        inputs = adapter.example(batch, seq, seed=0)

                        def forward(adapter=adapter, inputs=inputs):
                            with torch.no_grad():
                                adapter.forward_example(inputs)

                        def under_recorder(adapter=adapter, inputs=inputs):
                            with torch.no_grad(), OpRecorder(cpu):
                                adapter.forward_example(inputs)

                        forward()  # warmup
                        plain[key] = min(plain.get(key, float("inf")), cpu_ms(forward, 3))
                        recorded[key] = min(recorded.get(key, float("inf")), cpu_ms(under_recorder, 1))
    finally:
        worker.close()
    print(f"torch {torch.__version__}, {threads} thread(s), {rounds} rounds; fastest CPU ms, ratio to float32")
    for model, batch, seq in SHAPES:
        base_p = plain[(model, batch, seq, "float32")]
        base_r = recorded[(model, batch, seq, "float32")]
        parts = []
        for dtype in DTYPES:
            p = plain[(model, batch, seq, dtype)]
            r = recorded[(model, batch, seq, dtype)]
            parts.append(f"{dtype} {p:8.2f} ({p / base_p:4.1f}x) rec {r:8.2f} ({r / base_r:4.1f}x)")
        print(f"{model:17} b={batch:<3} s={seq or '-':<4}| " + " | ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
