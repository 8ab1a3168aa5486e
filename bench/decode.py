"""Decode step cost: the static slot cache's step against a dynamic-cache step, side by side.

  PYTHONPATH=runtime/worker .venv/bin/python bench/decode.py \
      [--model smollm2-135m-instruct] [--contexts 64,512,2048] [--batches 1,8] [--steps 8] \
      [--repeats 5] [--threads 1]

For each (batch, context): `batch` rows holding `context` tokens each, then `--steps` decode
steps, timed per step, in two ways:
  static   the worker's static rows (generation/rows.py StaticRows.step): the slot cache's
           bookkeeping and the forward over the step's window (generation/slots.py)
  dynamic  transformers' DynamicCache grown by one column a step (the worker's dynamic rows,
           adapters/text.py CausalLM.step): what a plain transformers loop runs
The two alternate within every repeat (which goes first alternates too), so a shared host's load
falls on both alike. Prints one JSON object: per point the median step milliseconds of each and
their ratio (static / dynamic; the target is at most 1.1). Nothing is asserted on time here.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--catalog", default=os.path.join(ROOT, "runtime", "catalog.builtin.json")
    )
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--contexts", default="64,512,2048")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--threads", type=int, default=1, help="torch threads (0: torch's default)"
    )
    args = ap.parse_args(argv)
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    sys.path.insert(0, os.path.join(ROOT, "runtime", "worker"))
    from tpu_worker.launch import OPENMP_SPIN

    os.environ.setdefault("GOMP_SPINCOUNT", OPENMP_SPIN)

    import torch
    from tpu_worker.adapters import build_adapter
    from tpu_worker.catalog import load_catalog
    from tpu_worker.generation.rows import StaticRows, rows_for
    from tpu_worker.loaders import inspect_weights

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    catalog = load_catalog(args.catalog)
    entry = catalog.get(args.model)
    adapter = build_adapter(
        entry,
        catalog,
        inspect_weights(entry, catalog),
        torch.device("cpu"),
        entry.default_dtype,
    )
    rows = rows_for(adapter, max_new_tokens=entry.limits.max_new_tokens)
    if not isinstance(rows, StaticRows):
        print(json.dumps({"error": f"{entry.id} has no static cache: {rows.reason}"}))
        return 1
    slots = rows.slots
    gen = torch.Generator().manual_seed(0)
    points = []
    for b in [int(x) for x in args.batches.split(",")]:
        for ctx in [int(x) for x in args.contexts.split(",")]:
            if ctx + args.steps > slots.length or b > slots.slots:
                points.append(
                    {"batch": b, "context": ctx, "skipped": "beyond the static cache"}
                )
                continue
            token = [
                int(t) for t in torch.randint(100, adapter.vocab, (b,), generator=gen)
            ]
            prompts = torch.randint(
                100, adapter.vocab, (b, ctx), generator=gen
            ).tolist()

            def static_steps(b=b, ctx=ctx, token=token) -> list[float]:
                # `b` rows of `ctx` columns each, packed from column 0 (what a join leaves).
                slots.reset()
                slots.column = ctx
                slots.mask[:b, :ctx] = 1
                slots.pos[:b] = ctx - 1
                rows.rows = b
                out = []
                for _ in range(args.steps):
                    t0 = time.perf_counter()
                    rows.step(token)
                    out.append(time.perf_counter() - t0)
                return out

            with torch.no_grad():
                _, cache0, mask0, pos0 = adapter.prefill(prompts, args.steps)

            def dynamic_steps(
                token=token, cache0=cache0, mask0=mask0, pos0=pos0
            ) -> list[float]:
                cache, mask, pos = cache0, mask0, pos0
                extra = int(cache.get_seq_length()) - mask0.shape[1]
                if (
                    extra > 0
                ):  # back to the prefill's columns: the previous repeat's steps go
                    cache.crop(-extra)
                fed = torch.tensor(token, dtype=torch.long)
                out = []
                for _ in range(args.steps):
                    t0 = time.perf_counter()
                    _, cache, mask, pos = adapter.step(fed, cache, mask, pos)
                    out.append(time.perf_counter() - t0)
                return out

            times: dict[str, list[float]] = {"static": [], "dynamic": []}
            with torch.no_grad():
                static_steps(), dynamic_steps()  # warm-up: first-call allocations
                for r in range(args.repeats):
                    order = (
                        ["static", "dynamic"] if r % 2 == 0 else ["dynamic", "static"]
                    )
                    for kind in order:
                        times[kind] += (
                            static_steps() if kind == "static" else dynamic_steps()
                        )
            st, dy = (
                statistics.median(times["static"]),
                statistics.median(times["dynamic"]),
            )
            window = slots.window(ctx + args.steps)
            points.append(
                {
                    "batch": b,
                    "context": ctx,
                    "static_ms": round(st * 1e3, 3),
                    "dynamic_ms": round(dy * 1e3, 3),
                    "static_vs_dynamic": round(st / dy, 3),
                    "static_window": window,
                }
            )
            print(json.dumps(points[-1]), file=sys.stderr, flush=True)
    slots.reset()
    report = {
        "model": entry.id,
        "dtype": entry.default_dtype,
        "device": "cpu",
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "steps": args.steps,
        "repeats": args.repeats,
        "cache_columns": slots.length,
        "decode_windows": list(slots.windows),
        "points": points,
        "worst_ratio": max(
            (p["static_vs_dynamic"] for p in points if "static_vs_dynamic" in p),
            default=None,
        ),
    }
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
