// The estimator's facts in (a call's work, its model, device and history) and its estimate out,
// with the device model's assumptions.
import type { MoneyCost } from "../limits/pricing.js";
import type { EstimateKind } from "../tool_policy.js";

export interface ModelFacts {
  id: string;
  parameters: number;
  /** Bytes of the weight files (what a load reads from storage). */
  weight_bytes: number;
  /**
   * The worker's memory pre-flight for a load and a first request, bytes by dtype: where present,
   * the memory of work that needs the weights in that dtype (the figure the worker's load checks).
   */
  load_memory_bytes?: Readonly<Record<string, number>>;
  /** Dtypes the catalog allows for this model; suggestions only name these. */
  dtypes: readonly string[];
  default_dtype?: string;
  /**
   * The forward shapes of the model's shape plan (the worker's describe: plan_shapes): a load in mode
   * "compile" compiles and runs each once, and no call compiles after it. Absent or null: no
   * plan (one graph per warm-up shape, and a call's first shape bucket compiles).
   */
  shape_plan?: readonly PlanShapeFacts[] | null;
  /**
   * The library the worker builds the model with (transformers), whose first import in a worker
   * costs seconds to a minute; absent: the worker builds it itself (plain torch).
   */
  library?: string;
  /**
   * The engine that serves the model (vllm), whose benchmark measures what was asked and never
   * extends an unstable series; absent (or torch): the worker's own benchmark, which does.
   */
  engine?: string;
}

/** One forward shape of a plan: `length` 1 for a decode step, 0 for items of a fixed shape. */
export interface PlanShapeFacts {
  batch: number;
  length: number;
}

export interface DeviceFacts {
  kind: string;
  /** null when the backend cannot tell (then memory never refuses a call). */
  memory_free_bytes: number | null;
  memory_total_bytes: number | null;
}

export interface LatencyRecord {
  model: string;
  device: string;
  batch: number;
  seq_len: number;
  dtype?: string;
  mode?: string;
  mean_latency_ms: number;
}

/**
 * A call the gate measured: the work it was (workOf: the arguments an estimate reads, reduced, no
 * texts or tensor data) and the device-seconds it took. Estimates scale the nearest such call of
 * the same class by the model's own ratio between the two shapes (estimateCost).
 */
export interface CallRecord {
  kind: EstimateKind;
  model: string;
  /** The device kind it ran on (cpu, cuda, tpu). */
  device: string;
  work: Work;
  seconds: number;
  /** When it started, ms since the epoch: calls since a model's load tell a cold call apart. */
  at: number;
  /**
   * What measured calls said it would take (before the host's drift): how much slower or faster
   * it really was tells how busy the host is now. Absent when only the device model priced it.
   */
  estimate_s?: number;
  /** workKey(kind, work), when the caller keeps it (estimates on the hot path read many calls). */
  key?: string;
}

/** What an estimate reads of a call's arguments (workOf), JSON-safe, kept with its measurement. */
export type Work = Record<string, unknown>;

export interface EstimateInput {
  /** The shape of work, from the tool's record (policies/tool_policy.ts), never its name. */
  kind: EstimateKind;
  args: Record<string, unknown>;
  model?: ModelFacts;
  device?: DeviceFacts;
  /** Models resident on the target device, with the bytes they hold. */
  loaded?: readonly { model: string; bytes: number }[];
  /** Past measurements (e.g. from benchmarks), so estimates learn from what really happened. */
  history?: readonly LatencyRecord[];
  /** Calls of this model the gate measured (newest first or not: order does not matter). */
  calls?: readonly CallRecord[];
  /** Inference: how the model is loaded (a compiled model compiles each new shape once)... */
  loaded_mode?: string;
  /** ...and since when (ms since the epoch): a shape no call has run since is cold. */
  loaded_at?: number;
  /** Now, ms since the epoch: only recent calls say how busy the host is (absent: any). */
  now?: number;
  /**
   * Libraries the worker has imported (its status): a load of a model whose library is not
   * among them is cold, and pays the import. Absent: not known (priced warm).
   */
  libraries_imported?: readonly string[];
  /**
   * Models the worker has built since it started (its status): 0 makes a load cold (its first
   * model build: torch's own first-use set-up, its first forward). Absent: not known (warm).
   */
  models_built?: number;
  /**
   * Benchmarks: the server's benchmark.max_duration_s, which also bounds a configuration's
   * stability extension (stability.py); absent: the extension is bounded by its factor alone.
   */
  max_duration_s?: number;
  assumptions?: Partial<EstimateAssumptions>;
}

/**
 * What device_seconds rests on: "measured", calls of the same class measured here; "requested",
 * the window the request fixes (a benchmark's duration_s); "default", the device model's
 * assumptions alone (FLOP rates, a cold load's allowance), which may be off either way.
 */
export type EstimateBasis = "measured" | "requested" | "default";

export interface CostEstimate {
  device_seconds: number;
  /**
   * What device_seconds rests on. The gate refuses a call over the whole budget as one that can
   * never fit only when it is not "default" (policies/gate/budget_lines.ts); absent: as measured.
   */
  basis?: EstimateBasis;
  /**
   * Benchmarks: the part of device_seconds that is the worst case of the stability extension
   * (every configuration unstable and run to its bound, EXTEND_FACTOR × its window); absent
   * for other work.
   */
  stability_extension_s?: number;
  /**
   * A model's first check in a fresh worker: charged to the principal's budget, not to the read
   * allowance (policies/gate/budget_lines.ts). Absent otherwise.
   */
  cold_start?: boolean;
  /** device_seconds in money at its device kind's price; present only with `pricing` set. */
  cost?: MoneyCost;
  memory_bytes: number;
  compile_s: number;
  weight_bytes: number;
  fits: boolean;
  reason?: string;
  suggestion?: string;
}

export interface EstimateAssumptions {
  /** Multiplier on weight memory for allocator slack and buffers. */
  headroom: number;
  /** Fixed activation allowance (workspace, allocator pools). */
  activation_base_bytes: number;
  /** Activation bytes per token ≈ factor × sqrt(parameters) × dtype bytes (hidden size proxy). */
  activation_per_token_factor: number;
  /** Storage → host → device read rate for loads; low on purpose (cold caches, network disks). */
  load_bytes_per_s: number;
  /**
   * A cold load's first import of its model library (transformers) in the worker and its first
   * model build, seconds, on any device (it is host work). A check of a model not loaded pays it
   * too but is not priced so: the read allowance bounds it whatever its estimate.
   */
  library_import_s: number;
  /**
   * A load in a worker that has built no model yet (plain torch: torch's first module set-up,
   * allocator and first forward), seconds, until a cold load of the model has been measured.
   */
  first_build_s: number;
  /** Sustained matmul throughput, FLOP/s, by device kind; far below peak on purpose. */
  flops_per_s: Record<string, number>;
  /** Seconds to compile one graph (one shape bucket) in mode "compile", by device kind. */
  compile_s_per_graph: Record<string, number>;
  /** Fixed per-call overhead (dispatch, tokenisation, transfer), seconds. */
  call_overhead_s: number;
  /** Fixed overhead of one decoding step inside a generation (no dispatch, no transfer), s. */
  decode_step_overhead_s: number;
  /** Fixed cost of each configuration of a benchmark grid (set-up, memory reading, report), s. */
  benchmark_config_overhead_s: number;
  /** Fixed cost of a check_model call (the operator recorder, the report), seconds. */
  check_overhead_s: number;
  /** Tokens per character of input text (English BPE is ~0.25; 0.5 stays on the safe side). */
  tokens_per_char: number;
  /**
   * A pass's time in a dtype over its time in float32, by device kind; 1 where absent (no
   * measurement: reduced precision is never assumed faster). Applied to the FLOP model and to
   * history measured in another dtype; history in the call's own dtype needs none.
   */
  dtype_cost_factor: Record<string, Partial<Record<string, number>>>;
}

export const DEFAULT_ASSUMPTIONS: EstimateAssumptions = {
  headroom: 1.2,
  activation_base_bytes: 64 * 2 ** 20,
  activation_per_token_factor: 16,
  load_bytes_per_s: 200e6,
  // Measured 2026-12-01 on the 2-core development VM: a fresh worker's first tiny-gpt2 load
  // took 34–38 s at load average 17 (the next load of another transformers model 0.8–1.1 s,
  // mnist-cnn 0.02–0.1 s); issue 33 saw 28.8 s. Measured cold loads then price the next ones.
  library_import_s: 20,
  // Measured 2026-12-02 on the same VM: a fresh worker's first mnist-cnn load was charged 1.06 s
  // at slowdown 1.0 and 2.46 s at 2.6 (the next load after it 3 ms); issue 34 saw cold-worker
  // mnist-cnn checks of 8–16 s at load 6–10.
  first_build_s: 5,
  flops_per_s: { cpu: 100e9, cuda: 5e12, tpu: 20e12, xla: 20e12 },
  compile_s_per_graph: { cpu: 10, cuda: 20, tpu: 45, xla: 45 },
  call_overhead_s: 0.01,
  // Measured on the corpus of bench/estimates.ts (2026-12-01, the 2-core development VM):
  // tiny-gpt2 took 1–2 ms a new token, where a 10 ms call overhead per step priced 6–8× high;
  // benchmarks took 0.2–0.5 s a configuration beyond their passes; checks 0.1–0.9 s however small.
  decode_step_overhead_s: 0.001,
  benchmark_config_overhead_s: 0.2,
  check_overhead_s: 0.2,
  tokens_per_char: 0.5,
  dtype_cost_factor: {
    // CPU, measured 2026-12-01 with bench/dtype_cost.py (the worker's own adapters and op
    // recorder on the built-in models; CPU time, fastest of 3 rounds, 1 torch thread; torch
    // 2.13 on the 2-core development VM, a Xeon with AVX512-FP16 and AMX-BF16). Over float32,
    // at the compute-bound shapes (mnist-cnn b=256, all-minilm b=8 s=256, tiny-gpt2 b=16
    // s=128), plain forward / under check_model's recorder: float16 1.2/1.3, 1.0/1.1, 0.6/0.6;
    // bfloat16 1.0/1.0, 0.3/0.3, 0.6/0.6. The worst of each, never below 1. CPUs without native
    // half precision convert every op and have been seen 5× slower in float16 (issue 23): there
    // this prices float16 low until a benchmark in that dtype gives history, and a reader's
    // checks are bounded by the read allowance whatever the estimate (policies/gate/).
    cpu: { float32: 1, float16: 1.3, bfloat16: 1 },
  },
};

/** A benchmark's estimate is its worst case: say how much of it an unstable series may add. */
export function extensionNote(e: CostEstimate): string {
  return e.stability_extension_s
    ? ` (up to ${e.stability_extension_s} s of it if unstable series are extended)`
    : "";
}
