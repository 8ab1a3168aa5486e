// What every work kind's estimate shares: argument readers, the device model's latency and
// memory, and the pieces a kind's modelled cost is made of.
import { DEFAULT_ITERATIONS } from "../../lib/benchmark_defaults.js";
import { deviceKind } from "../../lib/device.js";
import { DTYPE_ITEMSIZE, isTensorDtype } from "../../lib/dtypes.js";
import {
  DEFAULT_ASSUMPTIONS,
  type EstimateAssumptions,
  type EstimateInput,
  type ModelFacts,
} from "./types.js";

export function dtypeBytes(dtype: string): number {
  return isTensorDtype(dtype) ? DTYPE_ITEMSIZE[dtype] : 4;
}

export function nums(v: unknown): number[] {
  return Array.isArray(v) ? v.filter((x): x is number => typeof x === "number" && x > 0) : [];
}
export function strs(v: unknown): string[] {
  return Array.isArray(v) ? v.filter((x): x is string => typeof x === "string") : [];
}
export function num(v: unknown): number | undefined {
  return typeof v === "number" && Number.isFinite(v) && v >= 0 ? v : undefined;
}
export function kindOf(input: EstimateInput): string {
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
export function weightsMemory(
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
export function bucket(n: number): number {
  return 2 ** Math.ceil(Math.log2(Math.max(1, n)));
}

export interface Modelled {
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
export function coldLibrary(input: EstimateInput): boolean {
  const lib = input.model?.library;
  return lib !== undefined && input.libraries_imported !== undefined
    ? !input.libraries_imported.includes(lib)
    : false;
}

/** The worker has built no model since it started (known from its status). */
export function freshWorker(input: EstimateInput): boolean {
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

/** A kind's modelled cost before it adds anything: nothing to run, one token, no weights. */
export function blankModelled(dtype: string): Modelled {
  return {
    deviceSeconds: 0,
    extension: { passesS: 0, wallS: 0 },
    extraBytes: 0,
    compileS: 0,
    tokens: 1,
    weightBytes: 0,
    needsWeights: false,
    dtype,
  };
}
