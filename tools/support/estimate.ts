// Gathers the facts a cost estimate needs (catalog, weight headers via the worker, device memory,
// loaded models, past benchmarks) and hands them to the pure estimator in policies/.
import { estimateCost, type CostEstimate } from "../../policies/estimate.js";
import type { ToolPolicy } from "../../policies/tool_policy.js";
import type { ToolContext } from "../types.js";

/** The estimate of a call of the tool whose record this is (none when it declares no estimate). */
export async function estimateFor(
  tool: Pick<ToolPolicy, "estimate">,
  args: Record<string, any>,
  ctx: ToolContext,
): Promise<CostEstimate | undefined> {
  const kind = tool.estimate;
  const entry = ctx.env.catalog.models.find((m) => m.id === args.model);
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
  // Tensor models have no sequence: one "token" per item on both sides of the comparison.
  const tensor = entry.task === "tensor";
  if (tensor && kind === "benchmark") args = { ...args, seq_lens: [1] };
  const history = ctx.reports.history(entry.id, deviceKind).map((h) => ({
    model: entry.id,
    device: deviceKind,
    batch: h.batch,
    seq_len: h.seq_len ?? (tensor ? 1 : 0),
    ...(h.dtype ? { dtype: h.dtype } : {}),
    ...(h.mode ? { mode: h.mode } : {}),
    mean_latency_ms: h.latency_ms,
  }));
  return estimateCost({
    kind,
    args,
    model: {
      id: entry.id,
      parameters: fact?.parameters ?? 0,
      weight_bytes: fact?.weight_bytes ?? 0,
      dtypes: entry.dtypes,
      default_dtype: entry.default_dtype,
    },
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
  });
}
