"""The `benchmark` op: warmup + timed iterations over batch x seq_len x dtype x mode, after MLPerf
LoadGen's scenarios, with compile time, recompilations, peak memory, precision against a float32
CPU reference and achieved FLOP/s reported for every configuration.

Arguments (the `benchmark` op): model, device?, batch_sizes, seq_lens?, dtypes, modes,
scenario ("single-stream" | "offline"), work ("forward" | "generate"), iterations?, duration_s?,
warmup, max_new_tokens?, extend_factor. The old spelling scenario="forward"/"generate" still means that work in
the single-stream scenario.

Scenarios:
  * single-stream: one query at a time, each configuration of the grid measured; latency
    percentiles are the figures of merit, throughput is batch / mean latency.
  * offline: for every (seq_len, dtype, mode) the largest requested batch that fits (larger ones
    that run out of memory, or that the memory estimate says cannot fit, are skipped and named);
    throughput is items / wall time of the whole measured window.
Work: `forward` (one forward of a synthetic batch; prefill for causal LMs) or `generate` (decoding of
max_new_tokens after each prompt by the decode loop that serves callers, decode.py;
text-generation models only).

Result: {manifest, configs: [...], cancelled}. Each configuration:
  batch, seq_len, dtype, mode, scenario, work, device, warmup, iterations, measured_s,
  latency_ms {p50, p90, p99, mean, min, max}, throughput_items_per_s, throughput_basis,
  tokens_per_s and decode_loop (generate), first_call_s, compile_s, graphs_compiled, recompiles_in_window,
  recompiled, graph_breaks, load_s, peak_memory_bytes, peak_memory_increase_bytes,
  peak_memory_kind, matmul_precision, precision_reference, max_abs_error_vs_fp32,
  mean_abs_error_vs_fp32, max_rel_error_vs_fp32, cosine_similarity_vs_fp32, nonfinite_outputs,
  flops_per_item, achieved_flops_per_s, peak_flops_per_s, peak_flops_source, fraction_of_peak,
  offline_skipped_batches (offline), stability ({stable, reason, mad_ms, p50_ci_ms,
  iterations_requested, extended, loadavg_1m, steal_pct, cpus}), error ({code, message,
  recoverable} or null).

Timing: every clock read is preceded by a device synchronize and the iteration's output is kept
alive across it, so asynchronous backends (TPU, CUDA) are measured honestly. Warmup is never
counted; in compile mode one extra uncounted call compiles the shape even with warmup 0.
compile_s is that first call's excess over the steady mean; any graph compiled inside the
measured window is counted (dynamo's counters) and flags the configuration `recompiled`. On
TorchTPU, `xla_compiles_in_window` counts its own compile-cache misses in the window (eager mode
compiles per op and shape; private API, null where absent) and flags `recompiled` as well.

Layout: args.py checks the request (the server resolved every default and bound), engine.py
walks the grid, measure.py times one configuration, reference.py computes the float32 outputs;
stats.py (MAD, bootstrap CI), host.py (/proc load and steal) and stability.py (the verdict, and
the extension of an unstable series) say how sure each configuration's figures are.
"""

from .engine import run_benchmark

__all__ = ["run_benchmark"]
