"""What a dtype costs on this host's CPU, measured with the worker's own ops on the built-in models.

For each model and shape, runs the worker's `benchmark` op (plain forwards, mean latency) and its
`check` op (one forward under the op recorder, what check_model runs) in float32, bfloat16 and
float16, interleaved round by round, and prints each dtype's fastest time over float32's fastest
(the minimum, because a shared host only ever adds time). The estimator's `dtype_cost_factor` (policies/estimate.ts)
holds the result for device kind "cpu".

  PYTHONPATH=runtime/worker .venv/bin/python bench/dtype_cost.py [rounds]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

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
LIMITS = {"max_configs": 64, "max_iterations": 10_000, "max_duration_s": 600, "max_warmup": 100, "min_seq_len": 2}


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    from tpu_worker.catalog import load_catalog
    from tpu_worker.ops import OpContext, Worker
    from tpu_worker.probe import probe

    with open(os.path.join(REPO, "runtime", "catalog.builtin.json"), encoding="utf-8") as fh:
        data = json.load(fh)
    data["model_roots"] = [os.path.join(REPO, ".data", "models")]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(data, fh)
    worker = Worker(load_catalog(fh.name), probe("cpu"))
    bench: dict[tuple, list[float]] = {}
    check: dict[tuple, list[float]] = {}
    try:
        for _ in range(rounds):
            for model, batch, seq in SHAPES:
                for dtype in DTYPES:
                    shape = {"seq_lens": [seq]} if seq else {}
                    r = worker.handle(
                        "benchmark",
                        {
                            "model": model,
                            "batch_sizes": [batch],
                            "dtypes": [dtype],
                            "modes": ["eager"],
                            "scenario": "single-stream",
                            "work": "forward",
                            "iterations": 3,
                            "warmup": 1,
                            "limits": LIMITS,
                            **shape,
                        },
                        [],
                        OpContext("bench"),
                    )[0]
                    bench.setdefault((model, batch, seq, dtype), []).append(r["configs"][0]["latency_ms"]["min"])
                    c = worker.handle(
                        "check",
                        {"model": model, "batch": batch, "dtype": dtype, **({"seq_len": seq} if seq else {})},
                        [],
                        OpContext("check"),
                    )[0]
                    check.setdefault((model, batch, seq, dtype), []).append(c["forward_s"] * 1000)
    finally:
        worker.close()
    print(f"torch threads {__import__('torch').get_num_threads()}, {rounds} rounds, fastest in ms")
    for model, batch, seq in SHAPES:
        base_b = min(bench[(model, batch, seq, "float32")])
        base_c = min(check[(model, batch, seq, "float32")])
        parts = []
        for dtype in DTYPES:
            b = min(bench[(model, batch, seq, dtype)])
            c = min(check[(model, batch, seq, dtype)])
            parts.append(f"{dtype} bench {b:8.2f} ({b / base_b:4.1f}x) check {c:8.2f} ({c / base_c:4.1f}x)")
        print(f"{model:18} b={batch:<3} s={seq or '-':<4}| " + " | ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
