import { z } from "zod";
import { approvalId, device, dtype, modelId } from "./schemas.js";
import { defineTool, type ToolEnv } from "./types.js";

export const checkModel = (env: ToolEnv) => {
  const maxBatch = Math.max(...env.catalog.models.map((m) => m.limits.max_batch));
  const maxSeq = Math.max(1, ...env.catalog.models.map((m) => m.limits.max_seq_len));
  return defineTool({
    name: "check_model",
    title: "Check model support",
    description:
      "Preflight: one forward pass on the target device recording the ATen operators used, with counts, which ran on the device, which fell back to the CPU or failed, the estimated memory and a verdict.",
    input: z
      .object({
        model: modelId(env),
        device: device.optional(),
        dtype: dtype.optional(),
        batch: z.number().int().min(1).max(maxBatch).default(1),
        seq_len: z.number().int().min(1).max(maxSeq).optional(),
        approval_id: approvalId,
      })
      .strict(),
    output: z
      .object({
        model: z.string(),
        verdict: z.string(),
        ops: z.array(
          z
            .object({
              op: z.string(),
              count: z.number(),
              on_device: z.number(),
              fell_back: z.number(),
              failed: z.number(),
            })
            .passthrough(),
        ),
        estimated_memory_bytes: z.number().nullable(),
      })
      .passthrough(),
    annotations: { readOnlyHint: true, destructiveHint: false, idempotentHint: true, openWorldHint: false },
    device: (a) => a.device ?? "default",
    async handler(args, ctx) {
      const { result } = await ctx.runtime.call<any>(
        "check",
        {
          model: args.model,
          batch: args.batch,
          ...(args.device ? { device: args.device } : {}),
          ...(args.dtype ? { dtype: args.dtype } : {}),
          ...(args.seq_len ? { seq_len: args.seq_len } : {}),
        },
        { signal: ctx.signal },
      );
      return { model: args.model, estimated_memory_bytes: null, ...result };
    },
    render: (o) =>
      `${o.model}: ${o.verdict}; ${o.ops.length} operators, ${o.ops.filter((x) => x.fell_back).length} fell back, ${o.ops.filter((x) => x.failed).length} failed`,
  });
};
