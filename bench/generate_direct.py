"""Direct generation baselines, no server: what the MCP-level generation bench compares against.

  PYTHONPATH=runtime/worker .venv/bin/python bench/generate_direct.py \
      [--catalog runtime/catalog.builtin.json] [--model tiny-gpt2] [--batch 8] [--max-new-tokens 32] \
      [--repeats 5] [--threads N] [--prompts '["a", "b", ...]']

Prints one JSON object (stdout) with, for the same model files, dtype, prompts and torch threads:
  hf_generate_batch        Hugging Face `model.generate` (greedy) on all prompts as one batch:
                           the ceiling for concurrent callers
  hf_generate_sequential   the same, one prompt at a time: the direct sequential baseline
  worker_decode_sequential the worker's decode loop in process, one request at a time
  worker_decode_concurrent the worker's decode loop in process, every prompt from its own thread
                           at once (continuous batching, no transport)
  ratios                   concurrent/sequential and batch-ceiling figures, side by side
Each section reports tokens generated, wall seconds (median of the repeats) and tokens/s. The
sections run interleaved: a warm-up call each, then every repeat runs all four, the order
rotating, so a shared host's load falls on all of them alike.
Timing is never asserted anywhere: these are figures to print side by side in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_PROMPTS = [
    "The weather today is",
    "Once upon a time",
    "In a distant galaxy",
    "The best way to learn",
    "My favourite recipe uses",
    "The history of the city",
    "A short poem about the sea",
    "Tips for a good night's sleep",
]


def _interleaved(sections: dict, repeats: int) -> dict[str, tuple[float, int]]:
    """Every section once (warm-up), then `repeats` rounds of every section, the order rotating
    each round, so a shared host's load changes fall on every section alike: per section the
    median wall seconds of its rounds and the tokens of one call."""
    names = list(sections)
    tokens = {k: sections[k]() for k in names}
    times: dict[str, list[float]] = {k: [] for k in names}
    for r in range(repeats):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            t0 = time.perf_counter()
            tokens[k] = sections[k]()
            times[k].append(time.perf_counter() - t0)
    return {k: (statistics.median(times[k]), tokens[k]) for k in names}


def _section(seconds: float, tokens: int, **extra) -> dict:
    return {
        "tokens": tokens,
        "seconds": round(seconds, 6),
        "tokens_per_s": round(tokens / seconds, 3),
        **extra,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--catalog", default=os.path.join(ROOT, "runtime", "catalog.builtin.json")
    )
    ap.add_argument("--model", default="tiny-gpt2")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--threads", type=int, default=0, help="torch threads (0: torch's default)"
    )
    ap.add_argument(
        "--prompts",
        help="JSON list of prompts (default: 8 built-in ones, cycled to --batch)",
    )
    args = ap.parse_args(argv)
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.path.insert(0, os.path.join(ROOT, "runtime", "worker"))
    from tpu_worker.launch import OPENMP_SPIN

    # The worker's import-time switches (tpu_worker.launch): the same OpenMP spin as the server's
    # worker, set before torch starts its threads.
    os.environ.setdefault("GOMP_SPINCOUNT", OPENMP_SPIN)

    import torch
    import transformers
    from tpu_worker.adapters import build_adapter
    from tpu_worker.cancel import CancelToken
    from tpu_worker.catalog import load_catalog
    from tpu_worker.generation.loop import DecodeLoop
    from tpu_worker.loaders import inspect_weights

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    base = json.loads(args.prompts) if args.prompts else DEFAULT_PROMPTS
    prompts = [base[i % len(base)] for i in range(args.batch)]
    n = args.max_new_tokens
    catalog = load_catalog(args.catalog)
    entry = catalog.get(args.model)
    adapter = build_adapter(
        entry,
        catalog,
        inspect_weights(entry, catalog),
        torch.device("cpu"),
        entry.default_dtype,
    )
    model = adapter.eager_model
    ids = [
        e.ids or [adapter.bos_id]
        for e in adapter.tokenizer.encode_batch(prompts, add_special_tokens=False)
    ]

    def hf_generate(rows: list[list[int]]) -> int:
        width = max(len(r) for r in rows)
        inp = torch.full((len(rows), width), adapter.pad_id, dtype=torch.long)
        mask = torch.zeros_like(inp)
        for i, r in enumerate(rows):  # left padding, as the worker does
            inp[i, width - len(r) :] = torch.tensor(r)
            mask[i, width - len(r) :] = 1
        with torch.no_grad():
            out = model.generate(
                input_ids=inp,
                attention_mask=mask,
                max_new_tokens=n,
                do_sample=False,
                pad_token_id=adapter.pad_id,
                eos_token_id=adapter.eos_id,
            )
        new = out[:, width:].tolist()
        return sum(len(_until_eos(r, adapter.eos_id, adapter.pad_id)) for r in new)

    loop = DecodeLoop(
        entry.id, adapter, max_batch=max(args.batch, entry.batching.max_batch)
    )
    loop.seal()  # as a load does: the step's work warmed, then new op shapes are counted

    def worker_one(text: str) -> int:
        prepared = adapter.prepare({"texts": [text], "max_new_tokens": n}, [])
        out = loop.submit(prepared, CancelToken()).result(timeout=600)
        return sum(out.result["new_tokens"])

    def worker_concurrent() -> int:
        counts = [0] * len(prompts)
        start = threading.Barrier(len(prompts))

        def call(i: int) -> None:
            start.wait()
            counts[i] = worker_one(prompts[i])

        threads = [
            threading.Thread(target=call, args=(i,)) for i in range(len(prompts))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sum(counts)

    sections = {
        "hf_batch": lambda: hf_generate(ids),
        "hf_seq": lambda: sum(hf_generate([r]) for r in ids),
        "worker_seq": lambda: sum(worker_one(p) for p in prompts),
        "worker_con": worker_concurrent,
    }
    try:
        steps0, joins0 = loop.stats.steps, loop.stats.joins
        timed = _interleaved(sections, args.repeats)
        steps = loop.stats.steps - steps0
        joins = loop.stats.joins - joins0
    finally:
        loop.close("bench over")
    s_batch, t_batch = timed["hf_batch"]
    s_seq, t_seq = timed["hf_seq"]
    s_wseq, t_wseq = timed["worker_seq"]
    s_wcon, t_wcon = timed["worker_con"]
    # The concurrent section's steps and joins per call: the sequential one's steps are its
    # prompts' own (max_new_tokens - 1 each, at most), the rest are the concurrent calls'.
    calls = args.repeats + 1
    steps = max(0, steps - calls * len(prompts) * (n - 1)) // calls
    joins = joins / calls
    hf_batch = _section(s_batch, t_batch, batch=len(ids))
    hf_seq = _section(s_seq, t_seq, calls=len(ids))
    w_seq = _section(s_wseq, t_wseq, calls=len(ids))
    w_con = _section(s_wcon, t_wcon, callers=len(ids), decode_steps=steps, joins=joins)
    report = {
        "model": entry.id,
        "dtype": entry.default_dtype,
        "device": "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "max_new_tokens": n,
        "prompts": prompts,
        "repeats": args.repeats,
        "hf_generate_batch": hf_batch,
        "hf_generate_sequential": hf_seq,
        "worker_decode_sequential": w_seq,
        "worker_decode_concurrent": w_con,
        # Op shapes first run after the warm-up around the step's forward (target 0, census.py).
        "census": loop.census.report(),
        "ratios": {
            "worker_concurrent_vs_worker_sequential": round(
                w_con["tokens_per_s"] / w_seq["tokens_per_s"], 3
            ),
            "worker_concurrent_vs_hf_batch": round(
                w_con["tokens_per_s"] / hf_batch["tokens_per_s"], 3
            ),
            "hf_batch_vs_hf_sequential": round(
                hf_batch["tokens_per_s"] / hf_seq["tokens_per_s"], 3
            ),
            "worker_sequential_vs_hf_sequential": round(
                w_seq["tokens_per_s"] / hf_seq["tokens_per_s"], 3
            ),
        },
    }
    print(json.dumps(report, indent=1))
    return 0


def _until_eos(row: list[int], eos: int | None, pad: int) -> list[int]:
    out = []
    for t in row:
        out.append(t)
        if t == eos:
            break
    return out


if __name__ == "__main__":
    sys.exit(main())
