import { z } from "zod";
import { ToolError } from "./errors.js";
import { approvalId, catalogMax, device, dtype, entryOf, modelId } from "./schemas.js";
import { estimateFor } from "./support/estimate.js";
import { MIN_SEQ_LEN } from "../lib/benchmark_defaults.js";
import type { ToolPolicy } from "../policies/tool_policy.js";
import { defineTool, type ToolEnv, type ToolFile } from "./types.js";

/** The sequence length the worker checks at when none is given (check.py uses the same). */
function defaultSeqLen(env: ToolEnv, model: string): number | undefined {
  const entry = entryOf(env, model);
  return entry.task === "tensor" ? undefined : Math.min(32, entry.limits.max_seq_len);
}

/** What the server and its policies know of check_model (policies/tool_policy.ts). */
const policy: ToolPolicy = {
  name: "check_model",
  scope: "models:read",
  workerOp: "check",
  job: false,
  deviceMode: "exclusive",
  timeoutS: 300,
  concurrency: null,
  estimate: "check",
  runWhileRecording: false,
};

const build = (env: ToolEnv) => {
  const maxBatch = catalogMax(env, "max_batch");
  const maxSeq = catalogMax(env, "max_seq_len");
  return defineTool(policy, {
    title: "Check model support",
    description:
      "Use before relying on a model on a device: one forward pass counting the ATen ops that ran there, fell back to CPU or failed; memory; a verdict.",
    input: z
      .object({
        model: modelId(env),
        device: device.optional(),
        dtype: dtype.optional(),
        batch: z.number().int().min(1).max(maxBatch).default(1),
        seq_len: z.number().int().min(MIN_SEQ_LEN).max(maxSeq).optional(),
        attention: z
          .enum(["default", "math"])
          .default("default")
          .describe("math: unfused attention"),
        shape_audit: z.boolean().optional(), // a dynamo trace: the shape-stability verdict
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
        categories: z.record(z.string(), z.number().int()).describe("calls per op category"),
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
        shape_report: z
          .object({
            shapes: z.array(z.array(z.number().int())), // [batch, length] of the forward
            padding_waste: z.number().nullable(),
            shape_stable: z.boolean().nullable(), // one dynamo graph; null: see `unaudited`
            breaks: z.array(z.object({ kind: z.string(), reason: z.string() }).passthrough()),
          })
          .passthrough()
          .optional(),
        error: z.string().nullable(),
      })
      .passthrough(),
    annotations: {
      readOnlyHint: true,
      destructiveHint: false,
      idempotentHint: true,
      openWorldHint: false,
    },
    // It runs a forward pass and may load the weights: it holds the device, so it is estimated,
    // charged (to the budget and the read allowance) and can be matched by approval rules. The
    // plain check of a model (its default shape, dtype and attention) may be a cold start.
    estimate: (a, ctx) =>
      estimateFor(
        policy,
        {
          ...a,
          seq_len: a.seq_len ?? defaultSeqLen(env, a.model),
          plain:
            a.batch === 1 &&
            a.seq_len === undefined &&
            a.attention === "default" &&
            !a.shape_audit &&
            (a.dtype === undefined || a.dtype === entryOf(env, a.model).default_dtype),
        },
        ctx,
      ),
    validate: (args) => {
      const entry = entryOf(env, args.model);
      if (args.dtype && !entry.dtypes.includes(args.dtype)) {
        throw new ToolError(
          "unsupported_dtype",
          `${args.model} allows ${entry.dtypes.join(", ")}; choose one of those`,
        );
      }
      if (args.batch > entry.limits.max_batch) {
        throw new ToolError(
          "invalid_argument",
          `batch: ${args.model} takes at most ${entry.limits.max_batch}`,
        );
      }
      if (args.seq_len !== undefined) {
        if (entry.task === "tensor") {
          throw new ToolError(
            "invalid_argument",
            `seq_len: ${args.model} is a tensor model; omit seq_len`,
          );
        }
        if (args.seq_len > entry.limits.max_seq_len) {
          throw new ToolError(
            "invalid_argument",
            `seq_len: ${args.model} takes at most ${entry.limits.max_seq_len}`,
          );
        }
      }
    },
    async handler(args, ctx) {
      const { result } = await ctx.runtime.call(
        "check",
        {
          model: args.model,
          batch: args.batch,
          ...(args.device ? { device: args.device } : {}),
          ...(args.dtype ? { dtype: args.dtype } : {}),
          ...(args.seq_len ? { seq_len: args.seq_len } : {}),
          attention: args.attention,
          ...(args.shape_audit ? { shape_audit: true } : {}),
        },
        { placement: ctx.placement, signal: ctx.signal, timeoutMs: ctx.deadline?.remainingMs() },
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
        .join("\n")}${shapeNote(o.shape_report)}${o.error ? `\nerror: ${o.error}` : ""}`,
  });
};

/** The shape report in a line: the bucket run, its padding and the shape-stability verdict. */
function shapeNote(r?: {
  shapes: number[][];
  padding_waste: number | null;
  shape_stable: boolean | null;
  breaks: { kind: string; reason: string }[];
  unaudited?: string;
}): string {
  if (!r) return "";
  const pad = r.padding_waste === null ? "" : `, padding ${(r.padding_waste * 100).toFixed(0)}%`;
  const verdict =
    r.shape_stable === null
      ? `not traced (${r.unaudited ?? "unknown"})`
      : r.shape_stable
        ? "shape-stable (one graph)"
        : `NOT shape-stable: ${r.breaks.map((b) => `${b.kind}: ${b.reason}`).join("; ")}`;
  return `\nshapes ${r.shapes.map((s) => s.join("×")).join(", ")}${pad}; ${verdict}`;
}

export const checkModel: ToolFile = { policy, build };
