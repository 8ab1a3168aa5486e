"""`benchmark` on a vLLM-engine model: generation measured through the engine's streaming API,
after MLPerf LoadGen's scenarios, in the same report shape as tpu_worker.bench (fields that only
the worker's own adapters can measure, such as compile counters, FLOP/s and the float32 error,
are null). Per configuration: latency of a whole request, time to first token (ttft_ms),
inter-token latency (itl_ms, the gaps between a sequence's tokens as they arrive) and tokens/s.

  * single-stream: one request at a time, every batch size of the grid (a request carries
    `batch` prompts of `seq_len` random tokens).
  * offline: the largest batch, all prompts in one request each iteration; throughput is items
    over the measured wall time.
Every request decodes exactly max_new_tokens (EOS ignored), greedy or sampled with the request's
temperature and seed.
"""

from __future__ import annotations

import itertools
import platform
import time

import torch

from .. import __version__
from ..bench.args import plan
from ..bench.measure import latency_summary
from ..errors import Cancelled, WorkerError, invalid
from ..generation.params import GenParams
from ..protocol import now_iso
from .http import EngineHttpError

SEED = 0


def _prompts(batch: int, seq_len: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    low = min(1000, max(vocab - 1, 1))
    return torch.randint(low, vocab, (batch, seq_len), generator=g).tolist()


def _one(engine, prompts: list[list[int]], p, token) -> dict:
    """One request: its wall time, time to first token, per-sequence token arrival times."""
    g = GenParams(p.max_new, p.temperature, seed=p.seed)
    path, body = engine.request(g, prompts, ignore_eos=True)
    arrivals: dict[int, list[float]] = {}
    t0 = time.perf_counter()
    engine.counters.add(requests=1)
    try:
        for event in engine.stream(path, body, token, len(prompts)):
            now = time.perf_counter()
            for choice in event.get("choices") or []:
                n = len(choice.get("token_ids") or [])
                arrivals.setdefault(int(choice.get("index", 0)), []).extend([now] * n)
    except EngineHttpError as exc:
        engine.counters.add(failures=1)
        raise engine._engine_error(exc) from None
    end = time.perf_counter()
    firsts = [ts[0] for ts in arrivals.values() if ts]
    gaps = [b - a for ts in arrivals.values() for a, b in itertools.pairwise(ts)]
    tokens = sum(len(ts) for ts in arrivals.values())
    engine.counters.add(completion_tokens=tokens)
    return {"wall": end - t0, "ttft": (min(firsts) - t0) if firsts else None, "gaps": gaps, "tokens": tokens}


def _summary(seconds: list[float]) -> dict | None:
    return latency_summary(sorted(seconds)) if seconds else None


def _measure(e, p, batch: int, seq_len: int, scenario: str, ctx) -> dict:
    engine = e.engine
    vocab = engine.tokenizer.get_vocab_size()
    prompts = _prompts(batch, min(seq_len, engine.max_len), vocab, SEED)
    first_call = None
    for i in range(p.warmup):
        r = _one(engine, prompts, p, ctx.token)
        if i == 0:
            first_call = r["wall"]
    runs = []
    started = time.perf_counter()
    while True:
        runs.append(_one(engine, prompts, p, ctx.token))
        elapsed = time.perf_counter() - started
        if p.iterations is not None and len(runs) >= p.iterations:
            break
        if p.iterations is None and elapsed >= (p.duration or 0):
            break
    measured = time.perf_counter() - started
    walls = [r["wall"] for r in runs]
    tokens = sum(r["tokens"] for r in runs)
    mean = sum(walls) / len(walls)
    return {
        "batch": batch,
        "seq_len": seq_len,
        "dtype": e.dtype,
        "mode": e.mode,
        "scenario": scenario,
        "work": "generate",
        "device": e.device,
        "engine": "vllm",
        "warmup": p.warmup,
        "iterations": len(runs),
        "measured_s": round(measured, 6),
        "latency_ms": _summary(walls),
        "ttft_ms": _summary([r["ttft"] for r in runs if r["ttft"] is not None]),
        "itl_ms": _summary([g for r in runs for g in r["gaps"]]),
        "throughput_items_per_s": round(
            batch / mean if scenario == "single-stream" else batch * len(runs) / measured, 4
        ),
        "throughput_basis": "batch / mean latency" if scenario == "single-stream" else "items / measured wall time",
        "tokens_per_s": round(tokens / measured, 3) if measured > 0 else None,
        "first_call_s": round(first_call, 6) if first_call is not None else None,
        "compile_s": None,
        "graphs_compiled": None,
        "recompiles_in_window": None,
        "load_s": e.load_report().get("load_s"),
        "peak_memory_bytes": None,
        "peak_memory_increase_bytes": None,
        "max_abs_error_vs_fp32": None,
        "max_rel_error_vs_fp32": None,
        "cosine_similarity_vs_fp32": None,
        "flops_per_item": None,
        "achieved_flops_per_s": None,
        "peak_flops_per_s": None,
        "fraction_of_peak": None,
        "error": None,
    }


def run_engine_benchmark(e, args: dict, ctx) -> dict:
    p = plan(e.entry, args)
    if p.work != "generate":
        raise invalid(f"model {e.entry.id!r} runs in a vLLM engine, which is benchmarked with work 'generate'")
    if p.dtypes != [e.dtype] or p.modes != [e.mode]:
        raise invalid(
            f"the vLLM engine serves {e.entry.id!r} as {e.dtype}/{e.mode}: benchmark dtypes [{e.dtype!r}] and "
            f"modes [{e.mode!r}], or unload and load it in the other dtype or mode"
        )
    if p.scenario == "single-stream":
        points = [(b, s) for s in p.seq_lens for b in p.batch_sizes]
    else:
        points = [(max(p.batch_sizes), s) for s in p.seq_lens]
    manifest = {
        "model": e.entry.id,
        "catalog_id": e.entry.id,
        "engine": "vllm",
        "engine_version": e.engine.version,
        "device": e.device,
        "scenario": p.scenario,
        "work": p.work,
        "warmup": p.warmup,
        "iterations": p.iterations,
        "duration_s": p.duration,
        "max_new_tokens": p.max_new,
        "sampling": p.sampling_report,
        "python_version": platform.python_version(),
        "worker_version": __version__,
        "seed": SEED,
        "started_at": now_iso(),
    }
    configs: list[dict] = []
    cancelled = False
    ctx.progress(0, len(points), f"benchmarking {e.entry.id} on vLLM: {len(points)} configuration(s), {p.scenario}")
    for b, s in points:
        try:
            c = _measure(e, p, b, s, p.scenario, ctx)
        except Cancelled:
            cancelled = True
            break
        except WorkerError as exc:
            c = {
                "batch": b,
                "seq_len": s,
                "dtype": e.dtype,
                "mode": e.mode,
                "scenario": p.scenario,
                "work": p.work,
                "device": e.device,
                "latency_ms": None,
                "throughput_items_per_s": None,
                "error": exc.to_wire(),
            }
        configs.append(c)
        ctx.progress(len(configs), len(points), f"batch {b}, seq_len {s}: {c.get('tokens_per_s')} tokens/s")
    manifest["finished_at"] = now_iso()
    return {"manifest": manifest, "configs": configs, "cancelled": cancelled}
