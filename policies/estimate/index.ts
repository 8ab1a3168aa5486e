// The estimate of a call: its work (by its kind, kinds.ts), the device model's cost of it, what
// measured calls of the same class say it costs here, and whether it fits the device's memory.
import { deviceKind } from "../../lib/device.js";
import { formatBytes } from "../../lib/units.js";
import type { EstimateKind } from "../tool_policy.js";
import { WORK_KINDS } from "./kinds.js";
import { dtypeBytes, kindOf, memoryFor, num, weightsMemory, type Modelled } from "./model.js";
import {
  DEFAULT_ASSUMPTIONS,
  type CallRecord,
  type CostEstimate,
  type EstimateAssumptions,
  type EstimateInput,
  type Work,
} from "./types.js";

/**
 * What makes two calls the same work (exact) and the same class (comparable), in one string:
 * the class, then the work. Kept with a record so an estimate does not recompute it per call.
 */
export function workKey(kind: EstimateKind, work: Work): string {
  return `${classOf(kind, work)}\u0000${JSON.stringify(work)}`;
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
  return WORK_KINDS[input.kind].work(input, { a, dtype, keep });
}

/** Calls of one class can stand for each other after scaling; other classes never do. */
export function classOf(kind: EstimateKind, w: Work): string {
  return WORK_KINDS[kind].classOf(w);
}

/** Device-seconds and the rest from the model of the device (FLOP/s, history of latencies). */
function modelled(input: EstimateInput, args: Work, a: EstimateAssumptions): Modelled {
  const { model } = input;
  input = { ...input, args };
  const kind = kindOf(input);
  const dtype = String(args.dtype ?? model?.default_dtype ?? "float32");
  const compileGraph = a.compile_s_per_graph[kind] ?? a.compile_s_per_graph.cpu ?? 10;
  const alreadyLoaded = (input.loaded ?? []).some((l) => l.model === model?.id);
  return WORK_KINDS[input.kind].modelled(input, {
    a,
    dtype,
    compileGraph,
    alreadyLoaded,
    device: kind,
  });
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
