// Gathers the facts a cost estimate needs (catalog, weight headers via the worker, device memory,
// loaded models, past benchmarks, calls measured before) and hands them to the pure estimator in
// policies/; and keeps what each call really took, so the next estimate learns from it.
import {
  estimateDetail,
  type CallRecord,
  type CostEstimate,
  type EstimateInput,
} from "../../policies/estimate.js";
import type { ToolPolicy } from "../../policies/tool_policy.js";
import type { ToolContext, ToolServices } from "../types.js";
import { findEntry } from "../schemas.js";

/**
 * The library the worker builds a model with: transformers for every architecture but the one it
 * builds in plain torch (mnist-cnn, adapters/build.py); none for an engine's model (its own
 * process).
 */
function libraryOf(entry: { architecture: string; engine?: string }): { library?: string } {
  if (entry.engine === "vllm" || entry.architecture === "mnist-cnn") return {};
  return { library: "transformers" };
}

/** The engine that serves the model, when it is not the worker's own torch (vllm). */
function engineOf(entry: { engine?: string }): { engine?: string } {
  return entry.engine && entry.engine !== "torch" ? { engine: entry.engine } : {};
}

/**
 * What the estimator reads of a call besides models and devices: its work and its model's state.
 * `calls` are the model's measured calls on the device kind, read from the store before.
 */
function callFacts(
  tool: Pick<ToolPolicy, "estimate">,
  args: Record<string, any>,
  ctx: ToolServices,
  deviceKind: string,
  calls: CallRecord[],
): Omit<EstimateInput, "device" | "loaded" | "history"> | undefined {
  const kind = tool.estimate;
  const entry = findEntry(ctx.env, args.model);
  if (!entry || kind === null) return undefined;
  // Tensor models have no sequence: one "token" per item on both sides of the comparison.
  if (entry.task === "tensor" && kind === "benchmark") args = { ...args, seq_lens: [1] };
  if (entry.task === "tensor" && kind === "check") args = { ...args, seq_len: 1 };
  // A load's warm-up shapes too (absent: one at batch 1, as the estimator assumes).
  if (entry.task === "tensor" && kind === "load")
    args = {
      ...args,
      warmup_shapes: ((args.warmup_shapes as Record<string, unknown>[] | undefined) ?? [{}]).map(
        (s) => ({ batch: 1, ...s, seq_len: 1 }),
      ),
    };
  // A model's first plain check since this server started (a fresh worker: imports, first
  // forward, allocator) costs many times a warm one: a work of its own, priced and learned apart.
  // Only the plain one (check_model's defaults): a larger check is a reader's call like any.
  if (
    kind === "check" &&
    args.plain === true &&
    !ctx.reports.measuredHere(entry.id, deviceKind, "check")
  )
    args = { ...args, cold: true };
  // How the model is loaded, from what the runtime observed (no worker call on the hot path).
  const held = ctx.runtime.loadedModels().find((m) => m.model === entry.id);
  return {
    kind,
    args,
    // What the work needs of the model (estimateFor adds the rest).
    model: {
      id: entry.id,
      parameters: 0,
      weight_bytes: 0,
      dtypes: entry.dtypes,
      default_dtype: entry.default_dtype,
      ...libraryOf(entry),
      ...engineOf(entry),
    },
    calls,
    now: Date.now(),
    ...(held?.mode ? { loaded_mode: held.mode, loaded_at: held.loadedAt } : {}),
  };
}

/** The estimate of a call of the tool whose record this is (none when it declares no estimate). */
export async function estimateFor(
  tool: Pick<ToolPolicy, "estimate">,
  args: Record<string, any>,
  ctx: ToolContext,
): Promise<CostEstimate | undefined> {
  const kind = tool.estimate;
  const entry = findEntry(ctx.env, args.model);
  if (!entry || kind === null) return undefined;
  // Loads and benchmarks ask the worker for fresh free memory; inference, the hot path, uses
  // what the handshake reported (its memory was accounted for when the model was loaded).
  const fresh = kind !== "inference";
  const [fact, status] = await Promise.all([
    ctx.facts.get(entry.id),
    fresh
      ? ctx.runtime.call("status", {}, { signal: ctx.signal }).then((r) => r.result)
      : Promise.resolve({ device: ctx.runtime.hello?.device, loaded: [] }),
  ]);
  const dev = status.device ?? ctx.runtime.hello?.device;
  const deviceKind = String(dev?.kind ?? "cpu");
  // What the store measured of this model on this kind, read before the estimate (one step that
  // reads no store: the shared one answers asynchronously).
  const [calls, measuredHistory] = await Promise.all([
    ctx.reports.calls(entry.id, deviceKind),
    ctx.reports.history(entry.id, deviceKind),
  ]);
  const facts = callFacts(tool, args, ctx, deviceKind, calls)!;
  const tensor = entry.task === "tensor";
  const history = measuredHistory.map((h) => ({
    model: entry.id,
    device: deviceKind,
    batch: h.batch,
    seq_len: h.seq_len ?? (tensor ? 1 : 0),
    ...(h.dtype ? { dtype: h.dtype } : {}),
    ...(h.mode ? { mode: h.mode } : {}),
    mean_latency_ms: h.latency_ms,
  }));
  const input: EstimateInput = {
    ...facts,
    model: {
      id: entry.id,
      parameters: fact?.parameters ?? 0,
      weight_bytes: fact?.weight_bytes ?? 0,
      ...(fact?.memory_bytes ? { load_memory_bytes: fact.memory_bytes } : {}),
      dtypes: entry.dtypes,
      default_dtype: entry.default_dtype,
      // The plan as the worker reports it (describe), the one source: where no worker has
      // answered describe, no plan, so a compiled load is priced at its warm-up shapes.
      shape_plan: fact?.plan_shapes ?? null,
      ...libraryOf(entry),
      ...engineOf(entry),
    },
    // What the worker has imported: the first load of a transformers model in it is cold.
    ...("libraries" in status && Array.isArray(status.libraries)
      ? { libraries_imported: status.libraries }
      : {}),
    // How many models the worker has built: none yet makes a load cold whatever its library.
    ...("models_built" in status && typeof status.models_built === "number"
      ? { models_built: status.models_built }
      : {}),
    // The bound of a benchmark configuration's stability extension (with its factor).
    ...(kind === "benchmark" ? { max_duration_s: ctx.env.limits.benchmark.max_duration_s } : {}),
    device: {
      kind: deviceKind,
      memory_free_bytes: dev?.memory_free_bytes ?? null,
      memory_total_bytes: dev?.memory_total_bytes ?? null,
    },
    loaded: (status.loaded ?? []).map((m: any) => ({
      model: String(m.model),
      bytes: Number(m.bytes_on_device ?? 0),
    })),
    history,
  };
  const d = estimateDetail(input);
  // The work as estimated (defaults resolved by the tool, cold or not now) is what is kept with
  // the time the call then takes.
  ctx.onWork?.({
    kind: facts.kind,
    model: entry.id,
    device: deviceKind,
    work: d.work,
    ...(d.measured_s !== undefined ? { estimate_s: d.measured_s } : {}),
  });
  // The cold start is charged to the principal's budget, not to a reader's read allowance (a
  // desktop session starts a fresh worker each time: its first checks would spend the allowance).
  return facts.args.cold === true ? { ...d.estimate, cold_start: true } : d.estimate;
}

/** A call's work as its estimate saw it, waiting for the seconds it takes (measured). */
export type EstimatedWork = Omit<CallRecord, "seconds" | "at">;

/**
 * Runs a call's work and keeps what it took with the work its estimate saw. The interval is the
 * one the gate charges: from the start of the work to its end. Calls that fail are not kept
 * (what they measured is not what the work costs), nor calls that were not estimated, nor calls
 * stopped or cancelled (their signal aborted: the budget, call_timeout_s, the caller) that still
 * answered with a partial result: they took what they were allowed, not what the work costs,
 * and an estimate that learned it would admit the next one as cheaper, to be stopped again.
 */
export async function measured<T>(
  estimated: () => EstimatedWork | undefined,
  ctx: Pick<ToolContext, "reports" | "signal">,
  work: () => Promise<T>,
): Promise<T> {
  const at = Date.now();
  const t0 = performance.now();
  const out = await work();
  const did = estimated();
  if (did && !ctx.signal.aborted)
    // Kept before the answer, so the caller's next estimate learns from it; a store that cannot
    // keep it (the shared one unreachable) costs the estimates this one call, never the answer.
    await ctx.reports
      .recordCall({ ...did, seconds: (performance.now() - t0) / 1000, at })
      .catch(() => {});
  return out;
}
