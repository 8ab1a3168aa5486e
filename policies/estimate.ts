// Cost estimates from plain facts (no runtime import): the tools layer passes what it knows about
// the model, the device and past benchmarks, and gets device-seconds, memory and compile time
// back. The numbers are deliberately conservative: they drive approvals, budgets and refusals,
// so erring high costs a prompt while erring low costs an out-of-memory crash on the device.
import {
  DEFAULT_ITERATIONS,
  DEFAULT_MAX_NEW_TOKENS,
  DEFAULT_SEQ_LEN,
  DEFAULT_WARMUP,
  EXTEND_FACTOR,
} from "../lib/benchmark_defaults.js";
import { deviceKind } from "../lib/device.js";
import { DTYPE_ITEMSIZE, isTensorDtype } from "../lib/dtypes.js";
import { formatBytes } from "../lib/units.js";
import type { EstimateKind } from "./tool_policy.js";
import type { MoneyCost } from "./limits/pricing.js";

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

/**
 * What makes two calls the same work (exact) and the same class (comparable), in one string:
 * the class, then the work. Kept with a record so an estimate does not recompute it per call.
 */
export function workKey(kind: EstimateKind, work: Work): string {
  return `${classOf(kind, work)}\u0000${JSON.stringify(work)}`;
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

export function dtypeBytes(dtype: string): number {
  return isTensorDtype(dtype) ? DTYPE_ITEMSIZE[dtype] : 4;
}

function nums(v: unknown): number[] {
  return Array.isArray(v) ? v.filter((x): x is number => typeof x === "number" && x > 0) : [];
}
function strs(v: unknown): string[] {
  return Array.isArray(v) ? v.filter((x): x is string => typeof x === "string") : [];
}
function num(v: unknown): number | undefined {
  return typeof v === "number" && Number.isFinite(v) && v >= 0 ? v : undefined;
}
function kindOf(input: EstimateInput): string {
  const d = input.device?.kind ?? String(input.args.device ?? "cpu");
  return deviceKind(d) || "cpu";
}

/** Weights + headroom + activations for `tokens` tokens at once, in bytes. */
export function memoryFor(
  parameters: number,
  dtype: string,
  tokens: number,
  a: EstimateAssumptions = DEFAULT_ASSUMPTIONS,
): number {
  const b = dtypeBytes(dtype);
  const weights = parameters * b * a.headroom;
  const activations =
    a.activation_base_bytes +
    Math.max(1, tokens) * a.activation_per_token_factor * Math.sqrt(parameters) * b;
  return Math.ceil(weights + activations);
}

/** The memory of work that needs the model's weights as `dtype`: the worker's figure, else ours. */
function weightsMemory(
  model: ModelFacts | undefined,
  dtype: string,
  tokens: number,
  a: EstimateAssumptions,
): number {
  return model?.load_memory_bytes?.[dtype] ?? memoryFor(model?.parameters ?? 0, dtype, tokens, a);
}

/** What a pass in `dtype` costs on a device of this kind, relative to float32 (1 if unknown). */
export function dtypeCostFactor(kind: string, dtype: string, a: EstimateAssumptions): number {
  const f = a.dtype_cost_factor[kind]?.[dtype];
  return typeof f === "number" && f > 0 ? f : 1;
}

/**
 * Per-call latency (ms) for batch × seq_len: from history when there is a record for this model
 * and device (scaled linearly by tokens from the nearest one; a record in another dtype also by
 * the two dtypes' cost factors), else from parameters and FLOP/s times the dtype's cost factor.
 */
export function latencyMs(
  input: EstimateInput,
  batch: number,
  seqLen: number,
  dtype: string,
  a: EstimateAssumptions,
  overheadS: number = a.call_overhead_s,
): number {
  const tokens = Math.max(1, batch) * Math.max(1, seqLen);
  const device = String(input.args.device ?? input.device?.kind ?? "cpu");
  const kind = kindOf(input);
  const measured = (input.history ?? []).filter(
    (h) =>
      h.model === input.model?.id &&
      (h.device === device || deviceKind(h.device) === kind) &&
      h.mean_latency_ms > 0,
  );
  // History in the call's own dtype wins; another dtype's is the next best thing.
  const own = measured.filter((h) => h.dtype === undefined || h.dtype === dtype);
  const same = own.length > 0 ? own : measured;
  if (same.length > 0) {
    const nearest = same.reduce((best, h) => {
      const d = Math.abs(Math.log((h.batch * Math.max(1, h.seq_len)) / tokens));
      const bd = Math.abs(Math.log((best.batch * Math.max(1, best.seq_len)) / tokens));
      return d < bd ? h : best;
    });
    const ratio = tokens / (Math.max(1, nearest.batch) * Math.max(1, nearest.seq_len));
    const fromDtype = nearest.dtype ?? dtype;
    const convert =
      fromDtype === dtype
        ? 1
        : dtypeCostFactor(kind, dtype, a) / dtypeCostFactor(kind, fromDtype, a);
    // Never scale below the measured latency: small batches rarely get proportionally faster.
    return nearest.mean_latency_ms * Math.max(1, ratio) * convert;
  }
  const params = input.model?.parameters ?? 0;
  const flops = 2 * params * tokens;
  const rate = a.flops_per_s[kind] ?? a.flops_per_s.cpu ?? 100e9;
  return (flops / rate) * 1000 * dtypeCostFactor(kind, dtype, a) + overheadS * 1000;
}

/** Powers of two, as the worker buckets shapes for compiled models. */
function bucket(n: number): number {
  return 2 ** Math.ceil(Math.log2(Math.max(1, n)));
}

/**
 * The work a call is, reduced to what an estimate reads (JSON-safe: no texts, no tensor data):
 * what a measured call is kept as, and what estimateCost models. An inference on a compiled model
 * is `cold` when no call of its shape bucket has run since the model was loaded (it compiles).
 */
export function workOf(input: EstimateInput): Work {
  const a: EstimateAssumptions = { ...DEFAULT_ASSUMPTIONS, ...input.assumptions };
  const { args, model } = input;
  const dtype = String(args.dtype ?? model?.default_dtype ?? "float32");
  // The device too when named: it decides which history and FLOP rate apply.
  const keep = (...keys: string[]): Work =>
    Object.fromEntries(
      ["device", ...keys].filter((k) => args[k] !== undefined).map((k) => [k, args[k]]),
    );
  switch (input.kind) {
    case "load": {
      const mode = String(args.mode ?? "eager");
      const plan = model?.shape_plan;
      return {
        dtype,
        mode,
        ...keep("warmup_shapes", "warmup"),
        // A compiled load warms its plan: a measured one of another plan's size is scaled, not taken.
        ...(mode === "compile" && plan ? { graphs: plan.length } : {}),
        ...(coldLibrary(input) || freshWorker(input) ? { cold: true } : {}),
      };
    }
    case "check":
      return {
        dtype,
        batch: num(args.batch) ?? 1,
        seq_len: num(args.seq_len) ?? DEFAULT_SEQ_LEN,
        ...keep("attention", "mode"),
        ...(args.cold === true ? { cold: true } : {}),
        ...(args.shape_audit === true ? { shape_audit: true } : {}),
      };
    case "benchmark":
      return {
        dtype,
        ...keep(
          "batch_sizes",
          "seq_lens",
          "dtypes",
          "modes",
          "mode",
          "scenario",
          "work",
          "max_new_tokens",
          "optimizer",
          "iterations",
          "duration_s",
          "warmup",
          "extend_factor",
        ),
      };
    case "inference": {
      // Already reduced (a stored call's work): as it is.
      if (typeof args.items === "number") return { ...args };
      const texts = Array.isArray(args.texts) ? args.texts : [];
      const tensors = Array.isArray(args.tensors) ? args.tensors : [];
      let items = texts.length;
      let seq = 1;
      if (texts.length > 0) {
        const maxChars = Math.max(...texts.map((t) => (typeof t === "string" ? t.length : 0)));
        seq = Math.max(1, Math.ceil(maxChars * a.tokens_per_char));
      } else if (tensors.length > 0) {
        const shape = nums((tensors[0] as Record<string, unknown>)?.shape);
        items = shape[0] ?? 1;
      }
      items = Math.max(1, items);
      const mode = input.loaded_mode ?? "eager";
      const since = input.loaded_at;
      // A model with a shape plan compiled all of it at load: no call of it compiles.
      const cold =
        mode === "compile" &&
        model?.shape_plan == null &&
        since !== undefined &&
        !(input.calls ?? []).some(
          (c) =>
            c.kind === "inference" &&
            c.model === model?.id &&
            c.at >= since &&
            bucket(Number(c.work.items)) === bucket(items) &&
            bucket(Number(c.work.seq)) === bucket(seq),
        );
      return {
        ...keep(),
        dtype,
        items,
        seq,
        max_new_tokens: num(args.max_new_tokens) ?? 0,
        mode,
        cold,
      };
    }
  }
}

/** Calls of one class can stand for each other after scaling; other classes never do. */
export function classOf(kind: EstimateKind, w: Work): string {
  const sorted = (v: unknown) => strs(v).slice().sort().join(",");
  switch (kind) {
    case "inference":
      return [
        kind,
        w.dtype,
        w.mode,
        Number(w.max_new_tokens) > 0 ? "generate" : "forward",
        w.cold ? "cold" : "warm",
      ].join("|");
    case "check":
      // A cold check (a fresh worker's first) is a class of its own; warm ones keep their key.
      return [
        kind,
        w.dtype,
        w.attention ?? "default",
        ...(w.cold ? ["cold"] : []),
        ...(w.shape_audit ? ["audit"] : []),
      ].join("|");
    case "load":
      return [kind, w.dtype, w.mode, w.cold ? "cold" : "warm"].join("|");
    case "benchmark":
      return [
        kind,
        w.dtype,
        w.work ?? "forward",
        w.scenario ?? "single-stream",
        sorted(w.dtypes),
        sorted(w.modes) || String(w.mode ?? "eager"),
      ].join("|");
  }
}

interface Modelled {
  /** As asked: every configuration's requested window (a benchmark's stable case). */
  deviceSeconds: number;
  /**
   * A benchmark's worst-case stability extension beyond that: of timed passes (which scale with
   * what measured calls say a pass costs here), and of wall time (duration_s windows, which do
   * not).
   */
  extension: { passesS: number; wallS: number };
  /** Bytes beyond weights and activations: a training copy's weights, gradients and optimizer state. */
  extraBytes: number;
  compileS: number;
  tokens: number;
  weightBytes: number;
  needsWeights: boolean;
  dtype: string;
}

/** The model's library is not yet imported in the worker (known from its status). */
function coldLibrary(input: EstimateInput): boolean {
  const lib = input.model?.library;
  return lib !== undefined && input.libraries_imported !== undefined
    ? !input.libraries_imported.includes(lib)
    : false;
}

/** The worker has built no model since it started (known from its status). */
function freshWorker(input: EstimateInput): boolean {
  return input.models_built === 0;
}

/**
 * The worst case of a configuration's stability extension beyond its requested window, as the
 * worker's Goal (tpu_worker/bench/stability.py) bounds it: an unstable series doubles its window
 * until it reaches `factor` × what was asked, and never past max_duration_s from its start (an
 * iteration run is bounded in time too once extended). `passS` is one timed pass.
 */
export function extensionS(
  window: { iterations?: number; duration_s?: number },
  passS: number,
  factor: number,
  maxDurationS = Infinity,
): number {
  if (factor <= 1) return 0;
  if (window.duration_s !== undefined) {
    const d = window.duration_s;
    return Math.max(0, Math.min(maxDurationS, factor * d) - d);
  }
  const asked = (window.iterations ?? DEFAULT_ITERATIONS) * passS;
  return Math.max(0, Math.min((factor - 1) * asked, maxDurationS - asked));
}

/** Device-seconds and the rest from the model of the device (FLOP/s, history of latencies). */
function modelled(input: EstimateInput, args: Work, a: EstimateAssumptions): Modelled {
  const { model } = input;
  input = { ...input, args };
  const kind = kindOf(input);
  const dtype = String(args.dtype ?? model?.default_dtype ?? "float32");
  const compileGraph = a.compile_s_per_graph[kind] ?? a.compile_s_per_graph.cpu ?? 10;
  const alreadyLoaded = (input.loaded ?? []).some((l) => l.model === model?.id);

  let deviceSeconds = 0;
  let compileS = 0;
  let tokens = 1;
  let weightBytes = 0;
  let needsWeights = false;
  let extraBytes = 0;
  const extension = { passesS: 0, wallS: 0 };
  switch (input.kind) {
    case "load": {
      weightBytes = model?.weight_bytes ?? 0;
      needsWeights = true;
      // Warmup shapes ({batch, seq_len}) under either name the tools layer may use.
      const listed = Array.isArray(args.warmup_shapes) ? args.warmup_shapes : args.warmup;
      const warmup = Array.isArray(listed) ? listed : [];
      const shapes = warmup.length > 0 ? warmup : [{ batch: 1, seq_len: DEFAULT_SEQ_LEN }];
      let warm = 0;
      for (const s of shapes) {
        const sh = (s ?? {}) as Record<string, unknown>;
        const b = num(sh.batch) ?? 1;
        const l = num(sh.seq_len) ?? DEFAULT_SEQ_LEN;
        tokens = Math.max(tokens, b * l);
        warm += latencyMs(input, b, l, dtype, a) / 1000;
      }
      // A model with a shape plan compiles and runs every shape of it at load (and none later):
      // the estimate grows with the plan's buckets (MiniLM's 7 × 6 is 42 graphs). A measured
      // load's work keeps its plan's size (`graphs`); its warm-up is priced as that many of the
      // current plan's shapes on average, so a load of another plan scales by the two sizes.
      const plan = args.mode === "compile" ? model?.shape_plan : undefined;
      const graphs = plan ? (num(args.graphs) ?? plan.length) : shapes.length;
      if (plan && plan.length > 0) {
        let planWarm = 0;
        for (const s of plan) {
          tokens = Math.max(tokens, s.batch * Math.max(1, s.length));
          planWarm += latencyMs(input, s.batch, Math.max(1, s.length), dtype, a) / 1000;
        }
        warm += (planWarm * graphs) / plan.length;
      }
      compileS = args.mode === "compile" ? compileGraph * graphs : 0;
      // A cold load: the worker's first import of the model's library (which includes its first
      // build), or else the worker's first model build at all.
      const coldS = args.cold ? (model?.library ? a.library_import_s : a.first_build_s) : 0;
      deviceSeconds = coldS + weightBytes / a.load_bytes_per_s + compileS + warm;
      break;
    }
    case "check": {
      weightBytes = alreadyLoaded ? 0 : (model?.weight_bytes ?? 0);
      needsWeights = !alreadyLoaded;
      compileS = args.mode === "compile" ? compileGraph : 0;
      const b = num(args.batch) ?? 1;
      const l = num(args.seq_len) ?? DEFAULT_SEQ_LEN;
      tokens = b * l;
      // One recorded forward pass: operator interception costs about as much again. A shape
      // audit (a dynamo trace, no code generated) is charged as one graph's compile.
      deviceSeconds =
        a.check_overhead_s +
        weightBytes / a.load_bytes_per_s +
        compileS +
        (args.shape_audit === true ? compileGraph : 0) +
        (2 * latencyMs(input, b, l, dtype, a)) / 1000;
      break;
    }
    case "benchmark": {
      const batches = nums(args.batch_sizes);
      const seqs = nums(args.seq_lens);
      const dtypes = strs(args.dtypes);
      const modes = strs(args.modes);
      const bs = batches.length ? batches : [1];
      const ls = seqs.length ? seqs : [DEFAULT_SEQ_LEN];
      const ds = dtypes.length ? dtypes : [dtype];
      const ms = modes.length ? modes : [String(args.mode ?? "eager")];
      const iterations = num(args.iterations) ?? DEFAULT_ITERATIONS;
      const warmup = num(args.warmup) ?? DEFAULT_WARMUP;
      const duration = num(args.duration_s);
      // How far an unstable series may be extended (the tool resolves it: 1 keeps a duration_s
      // run inside duration_s); an engine other than the worker's own never extends.
      const factor =
        model?.engine && model.engine !== "torch" ? 1 : (num(args.extend_factor) ?? EXTEND_FACTOR);
      // Generation: the prompt's forward pass plus one decoding step (batch × 1 token, with a KV
      // cache) per new token, for every iteration, warmup and reference pass alike.
      const newTokens =
        args.work === "generate" ? (num(args.max_new_tokens) ?? DEFAULT_MAX_NEW_TOKENS) : 0;
      const step = a.decode_step_overhead_s;
      // A training step: forward, backward (about twice the forward) and the optimizer's update,
      // a few elementwise passes over the float32 weights (AdamW ~4, SGD with momentum ~2).
      const training = args.work === "train_step";
      const params = input.model?.parameters ?? 0;
      const rate = a.flops_per_s[kind] ?? a.flops_per_s.cpu ?? 100e9;
      const optimizerS = training ? ((args.optimizer === "sgd" ? 2 : 4) * 4 * params) / rate : 0;
      const pass = (b: number, l: number, d: string) =>
        training
          ? (3 * latencyMs(input, b, l, d, a)) / 1000 + optimizerS
          : (latencyMs(input, b, l, d, a) + newTokens * latencyMs(input, b, 1, d, a, step)) / 1000;
      // Offline measures the largest batch per series only.
      const points = args.scenario === "offline" ? [Math.max(...bs)] : bs;
      for (const d of ds) {
        for (const m of ms) {
          for (const b of points) {
            for (const l of ls) {
              const per = pass(b, l, d);
              const timed = duration !== undefined ? duration : iterations * per;
              // "compile", or a training step compiled whole ("compile_step"): one graph each.
              const graph = m !== "eager" ? compileGraph : 0;
              compileS += graph;
              deviceSeconds += graph + warmup * per + timed + a.benchmark_config_overhead_s;
              // An unstable configuration runs longer (the worker's stability extension): its
              // worst case is part of what is approved and reserved.
              const more = extensionS(
                duration !== undefined ? { duration_s: duration } : { iterations },
                per,
                factor,
                input.max_duration_s,
              );
              if (duration !== undefined) extension.wallS += more;
              else extension.passesS += more;
            }
          }
        }
      }
      // The fp32 reference for precision error: one eager pass per (batch, seq_len) point; a
      // training grid counts the FLOPs of one forward and one forward + backward instead.
      for (const b of points)
        for (const l of ls)
          deviceSeconds += training
            ? (4 * latencyMs(input, b, l, "float32", a)) / 1000
            : pass(b, l, "float32");
      // A float32 copy of the weights, its gradients and the optimizer's state (AdamW two moments,
      // SGD one momentum buffer), beside the served model.
      if (training) extraBytes = params * 4 * (2 + (args.optimizer === "sgd" ? 1 : 2));
      tokens = Math.max(...bs) * (Math.max(...ls) + newTokens);
      needsWeights = !alreadyLoaded;
      weightBytes = alreadyLoaded ? 0 : (model?.weight_bytes ?? 0);
      break;
    }
    case "inference": {
      const items = num(args.items) ?? 1;
      const seq = num(args.seq) ?? 1;
      const newTokens = num(args.max_new_tokens) ?? 0;
      // Decoding costs one forward over the batch per new token (with a KV cache: ~1 token each).
      deviceSeconds =
        latencyMs(input, items, seq, dtype, a) / 1000 +
        newTokens * (latencyMs(input, items, 1, dtype, a, a.decode_step_overhead_s) / 1000);
      // A compiled model's first call of a shape compiles it before it runs.
      if (args.cold) {
        compileS = compileGraph;
        deviceSeconds += compileGraph;
      }
      tokens = items * (seq + newTokens);
      break;
    }
  }
  return {
    deviceSeconds,
    extension,
    extraBytes,
    compileS,
    tokens,
    weightBytes,
    needsWeights,
    dtype,
  };
}

/**
 * From the calls the gate measured, those of the same class (kind, dtype, mode, forward or
 * generate, cold or warm): calls of this very work if any (the median of the newest three, so one
 * noisy measurement does not decide alone; the upper middle of two, erring high), else the one
 * whose modelled cost is nearest, scaled by the ratio of the two modelled costs (the model says
 * how cost grows with batch, length and tokens; the measurement what a call costs here, overheads
 * included). Undefined without any; `at` is when the newest of those used ran.
 */
function fromCalls(
  input: EstimateInput,
  work: Work,
  own: number,
  a: EstimateAssumptions,
): { seconds: number; at: number } | undefined {
  if (!(own > 0)) return undefined;
  const kind = kindOf(input);
  const key = workKey(input.kind, work);
  const cls = key.slice(0, key.indexOf("\u0000") + 1);
  const same: CallRecord[] = [];
  const repeats: CallRecord[] = [];
  for (const c of input.calls ?? []) {
    if (c.kind !== input.kind || c.model !== input.model?.id || !(c.seconds > 0)) continue;
    if ((deviceKind(c.device) || c.device) !== kind) continue;
    const k = c.key ?? workKey(c.kind, c.work);
    if (!k.startsWith(cls)) continue;
    same.push(c);
    if (k === key) repeats.push(c);
  }
  if (same.length === 0) return undefined;
  if (repeats.length > 0) {
    repeats.sort((x, y) => y.at - x.at);
    const values = repeats
      .slice(0, 3)
      .map((c) => c.seconds)
      .sort((x, y) => x - y);
    return { seconds: values[Math.floor(values.length / 2)], at: repeats[0].at };
  }
  let best: { seconds: number; at: number; d: number } | undefined;
  for (const c of same) {
    const m = modelled(input, c.work, a).deviceSeconds;
    if (!(m > 0)) continue;
    const d = Math.abs(Math.log(m / own));
    if (!best || d < best.d || (d === best.d && c.at > best.at))
      best = { seconds: (c.seconds * own) / m, at: c.at, d };
  }
  return best && { seconds: best.seconds, at: best.at };
}

/** Recent calls, newest first, that say how busy the host is; how long they stay recent. */
const DRIFT_CALLS = 5;
const DRIFT_WINDOW_MS = 10 * 60_000;
/**
 * Calls estimated shorter than this say nothing of the host: a few milliseconds of scheduling
 * jitter on a busy host make them 3–10× off either way (measured on the estimate corpus).
 */
const DRIFT_MIN_S = 0.05;

/**
 * How much slower (> 1) or faster the model's calls since `since` ran than measured calls said
 * they would: on a shared host, neighbours' load comes and goes, and the calls that ran after the
 * measurement an estimate rests on know how the host changed since. The median of the newest
 * few (within ten minutes of `now`, estimated at 50 ms or more), bounded to 4× either way; 1
 * with fewer than three.
 */
export function hostDrift(input: EstimateInput, since = -Infinity): number {
  const now = input.now;
  const recent = (input.calls ?? [])
    .filter(
      (c) =>
        c.model === input.model?.id &&
        c.at > since &&
        (c.estimate_s ?? 0) >= DRIFT_MIN_S &&
        c.seconds > 0 &&
        (now === undefined || c.at >= now - DRIFT_WINDOW_MS),
    )
    .sort((x, y) => y.at - x.at)
    .slice(0, DRIFT_CALLS)
    .map((c) => c.seconds / c.estimate_s!)
    .sort((x, y) => x - y);
  if (recent.length < 3) return 1;
  return Math.min(4, Math.max(0.25, recent[Math.floor(recent.length / 2)]));
}

/** An estimate and what it was made of: the work, and what measured calls alone said. */
export interface EstimateDetail {
  estimate: CostEstimate;
  work: Work;
  /** From measured calls of the same class, before the host's drift; absent without any. */
  measured_s?: number;
}

export function estimateCost(input: EstimateInput): CostEstimate {
  return estimateDetail(input).estimate;
}

export function estimateDetail(input: EstimateInput): EstimateDetail {
  const a: EstimateAssumptions = { ...DEFAULT_ASSUMPTIONS, ...input.assumptions };
  const work = workOf(input);
  const m = modelled(input, work, a);
  const { dtype, tokens, needsWeights } = m;
  const params = input.model?.parameters ?? 0;
  const fromMeasured = fromCalls(input, work, m.deviceSeconds, a);
  const measuredS = fromMeasured?.seconds;
  // Measured calls say what the work as asked costs here (the drift: how busy the host is now);
  // a pass of the extension costs what the measured passes did, by the same ratio to the model.
  const scale =
    fromMeasured !== undefined && m.deviceSeconds > 0
      ? (fromMeasured.seconds * hostDrift(input, fromMeasured.at)) / m.deviceSeconds
      : 1;
  const asked = m.deviceSeconds * scale;
  const extensionSeconds = m.extension.passesS * scale + m.extension.wallS;
  const deviceSeconds = asked + extensionSeconds;
  const memoryBytes =
    m.extraBytes +
    (needsWeights
      ? weightsMemory(input.model, dtype, tokens, a)
      : memoryFor(0, dtype, 0, a) +
        Math.ceil(tokens * a.activation_per_token_factor * Math.sqrt(params) * dtypeBytes(dtype)));
  const est: CostEstimate = {
    // Never below one call's overhead: under it, a busy host's scheduling jitter decides (calls
    // measured at 2–4 ms took 8–20 ms the next time on the estimate corpus).
    device_seconds: Math.max(a.call_overhead_s, round3(deviceSeconds)),
    basis:
      measuredS !== undefined
        ? "measured"
        : input.kind === "benchmark" && num(work.duration_s) !== undefined
          ? "requested"
          : "default",
    ...(input.kind === "benchmark" ? { stability_extension_s: round3(extensionSeconds) } : {}),
    memory_bytes: memoryBytes,
    compile_s: round3(m.compileS),
    weight_bytes: m.weightBytes,
    fits: true,
  };
  return {
    estimate: withFit(est, input, dtype, tokens, needsWeights, a),
    work,
    ...(measuredS !== undefined ? { measured_s: measuredS } : {}),
  };
}

function round3(x: number): number {
  return Math.round(x * 1000) / 1000;
}

function withFit(
  est: CostEstimate,
  input: EstimateInput,
  dtype: string,
  tokens: number,
  needsWeights: boolean,
  a: EstimateAssumptions,
): CostEstimate {
  const free = input.device?.memory_free_bytes;
  if (free === null || free === undefined || est.memory_bytes <= free) return est;

  const total = input.device?.memory_total_bytes ?? null;
  const reason = `needs ${formatBytes(est.memory_bytes)}, device has ${formatBytes(free)} free`;
  const model = input.model;
  const options: string[] = [];

  // 1. A smaller dtype the catalog allows, if that alone fits.
  const smaller =
    needsWeights && model
      ? ["bfloat16", "float16"].filter(
          (d) => model.dtypes.includes(d) && dtypeBytes(d) < dtypeBytes(dtype),
        )
      : [];
  for (const d of smaller) {
    const m = weightsMemory(model, d, tokens, a);
    if (m <= free) {
      options.push(`use dtype ${d} (needs ${formatBytes(m)})`);
      break;
    }
  }
  // 2. Unloading other resident models, largest first, until it fits.
  if (options.length === 0) {
    const others = [...(input.loaded ?? [])]
      .filter((l) => l.model !== model?.id)
      .sort((x, y) => y.bytes - x.bytes);
    let gained = free;
    const names: string[] = [];
    for (const o of others) {
      if (gained >= est.memory_bytes) break;
      gained += o.bytes;
      names.push(o.model);
    }
    if (names.length > 0 && gained >= est.memory_bytes) {
      options.push(`unload ${names.join(", ")} (frees ${formatBytes(gained - free)})`);
    } else if (smaller.length > 0 && names.length > 0) {
      // Both together, if neither alone is enough.
      const d = smaller[0]!;
      const m = weightsMemory(model, d, tokens, a);
      if (m <= gained) options.push(`use dtype ${d} and unload ${names.join(", ")}`);
    }
  }
  // Only work with a batch and sequence of its own can shrink them (a load or check cannot).
  if (options.length === 0 && input.kind !== "load" && input.kind !== "check") {
    options.push("use smaller batch sizes or sequence lengths");
  }
  const suggestion =
    options.length > 0
      ? options.join("; or ")
      : total !== null && est.memory_bytes > total
        ? `the model does not fit this device at all (${formatBytes(total)} total); use a larger device`
        : "free device memory (unload models) or use a larger device";
  return { ...est, fits: false, reason, suggestion };
}
