import { z } from "zod";
import { approvalId, catalogMax, device, dtype, modelId } from "./schemas.js";
import { defineTool, type ToolEnv } from "./types.js";

export const checkModel = (env: ToolEnv) => {
  const maxBatch = catalogMax(env, "max_batch");
  const maxSeq = catalogMax(env, "max_seq_len");
  return defineTool({
    name: "check_model",
    title: "Check model support",
    description:
      'Preflight: one forward pass on the target device recording every ATen operator (TorchDispatchMode) with its call count, category, and how many calls ran on the device, fell back to the CPU or failed; the estimated and measured memory and a verdict (supported / partial / unsupported). attention: "math" forces attention through its unfused path (matmuls + softmax), as a backend without a fused kernel runs it.',
    input: z
      .object({
        model: modelId(env),
        device: device.optional(),
        dtype: dtype.optional(),
        batch: z.number().int().min(1).max(maxBatch).default(1),
        seq_len: z.number().int().min(1).max(maxSeq).optional(),
        attention: z
          .enum(["default", "math"])
          .default("default")
          .describe(
            "default: the kernels the device really dispatches; math: scaled-dot-product attention unfused",
          ),
        approval_id: approvalId,
      })
      .strict(),
    output: z
      .object({
        model: z.string(),
        device: z.string(),
        dtype: z.string(),
        batch: z.number().int(),
        seq_len: z.number().int().nullable(),
        attention: z.enum(["default", "math"]),
        verdict: z.enum(["supported", "partial", "unsupported"]),
        ops: z.array(
          z
            .object({
              op: z.string(),
              category: z.string(),
              count: z.number().int().describe("calls of this operator"),
              on_device: z.number().int().describe("calls that ran on the target device"),
              fell_back: z.number().int().describe("calls that fell back to the CPU"),
              failed: z.number().int().describe("calls that raised"),
            })
            .passthrough(),
        ),
        categories: z.record(z.string(), z.number().int()).describe("calls per operator category"),
        total_ops: z.number().int(),
        unique_ops: z.number().int(),
        estimated_memory_bytes: z.number().int().nullable(),
        measured_peak_memory_bytes: z.number().int().nullable(),
        measured_memory_kind: z.string(),
        parameters: z.number().int(),
        weight_bytes: z.number().int(),
        forward_s: z.number(),
        output_shape: z.array(z.number().int()).nullable(),
        fallback_detection: z.string(),
        error: z.string().nullable(),
      })
      .passthrough(),
    annotations: {
      readOnlyHint: true,
      destructiveHint: false,
      idempotentHint: true,
      openWorldHint: false,
    },
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
          attention: args.attention,
        },
        { signal: ctx.signal },
      );
      return result;
    },
    render: (o) =>
      `${o.model} on ${o.device} (${o.dtype}): ${o.verdict}; ${o.unique_ops} operators, ${o.total_ops} calls; ` +
      `${o.ops.filter((x) => x.fell_back).length} fell back, ${o.ops.filter((x) => x.failed).length} failed` +
      `\n${o.ops
        .slice(0, 15)
        .map(
          (x) =>
            `  ${x.op} [${x.category}] ×${x.count}${x.fell_back ? `, ${x.fell_back} fell back` : ""}${x.failed ? `, ${x.failed} failed` : ""}`,
        )
        .join("\n")}${o.error ? `\nerror: ${o.error}` : ""}`,
  });
};
