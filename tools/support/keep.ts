// run_benchmark work "fine_tune" with `keep`: the storage bound checked before the run, and the
// weights the worker wrote recorded after it as the caller's kept model (tools/stores/kept.ts).
import { ToolError } from "../errors.js";
import { KeptModels, type KeptRecord } from "../stores/kept.js";
import { entryOf } from "../schemas.js";
import type { ToolContext, ToolEnv } from "../types.js";

/** What the worker is asked to keep: the new id and the configuration. */
export interface KeepPlan {
  id: string;
  dtype: string;
  mode: string;
}

/**
 * The keep's id, after the bound is checked against what the weights will take: the base
 * model's parameters as float32 (what the worker writes), or nothing where the worker has not
 * described the model yet (the check after the run then decides).
 */
export async function keepPlan(
  env: ToolEnv,
  ctx: ToolContext,
  model: string,
  conf: { dtype: string; mode: string },
): Promise<KeepPlan> {
  const kept = env.kept!;
  const fact = await ctx.facts.get(model).catch(() => undefined);
  kept.checkRoom(ctx.principal.id, (fact?.parameters ?? 0) * 4);
  return { id: KeptModels.newId(), ...conf };
}

/** What a report's manifest says of its keep. */
export type KeptSummary =
  | {
      model: string;
      sha256: string;
      bytes: number;
      expires_at: string;
      dtype: string;
      mode: string;
    }
  | { model: null; reason: string };

/**
 * Records the kept weights the worker wrote as the caller's model; refused (and the files
 * removed) when they would take the caller over the bound. The record is added with its report
 * id by `add` once the report is stored.
 */
export function recordKept(
  env: ToolEnv,
  ctx: ToolContext,
  args: Record<string, any>,
  result: Record<string, any>,
  plan: KeepPlan,
): { summary: KeptSummary; record?: Omit<KeptRecord, "report_id"> } {
  const kept = env.kept!;
  const w = result.manifest?.kept as Record<string, any> | undefined;
  if (!w?.written) {
    kept.removeFiles(plan.id);
    return {
      summary: { model: null, reason: `not kept: ${w?.reason ?? "the worker wrote nothing"}` },
    };
  }
  try {
    kept.checkRoom(ctx.principal.id, w.bytes);
  } catch (e) {
    kept.removeFiles(plan.id);
    if (e instanceof ToolError) return { summary: { model: null, reason: e.message } };
    throw e;
  }
  const base = kept.record(args.model)?.base ?? args.model;
  const entry = entryOf(env, args.model);
  const expires = kept.expiresAt();
  const record = {
    id: plan.id,
    owner: ctx.principal.id,
    base,
    dataset: String(args.dataset),
    dtype: plan.dtype,
    mode: plan.mode,
    steps: Number(w.steps),
    sha256: String(w.sha256),
    bytes: Number(w.bytes),
    created_at: new Date().toISOString(),
    expires_at: expires,
    // The worker serves it from its own folder (a model root), its digest checked at each load.
    entry: {
      ...entry,
      id: plan.id,
      description: `${base} fine-tuned on ${args.dataset} (${w.steps} steps, ${plan.dtype} ${plan.mode})`,
      source: { path: `${kept.dir}/${plan.id}` },
      format: "hf-safetensors",
      engine: "torch",
      sha256: String(w.sha256),
    },
  };
  return {
    summary: {
      model: plan.id,
      sha256: record.sha256,
      bytes: record.bytes,
      expires_at: expires,
      dtype: plan.dtype,
      mode: plan.mode,
    },
    record,
  };
}
