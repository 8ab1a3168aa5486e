import { z } from "zod";
import { ToolError } from "./errors.js";
import {
  approvalId,
  catalogMax,
  device,
  dtype,
  entryOf,
  matmulPrecision,
  mode,
  modelId,
  ShapePlan,
  wait,
} from "./schemas.js";
import { estimateFor } from "./support/estimate.js";
import { JobRef } from "./stores/jobs.js";
import type { ToolPolicy } from "../policies/tool_policy.js";
import { defineTool, type ToolEnv, type ToolFile } from "./types.js";

const LoadResult = z.object({
  model: z.string(),
  device: z.string(),
  dtype: z.string(),
  mode: z.string(),
  parameters: z.number().int(),
  bytes_on_device: z.number().int(),
  estimated_bytes: z.number().int().optional(),
  load_s: z.number(),
  compile_s: z.number(),
  warmup_s: z.number(),
  matmul_precision: z
    .string()
    .optional()
    .describe(
      "this process's float32 matmul precision; absent for a model an engine (vLLM) serves",
    ),
  placement: z
    .array(z.object({ worker: z.string(), device: z.string(), bytes_on_device: z.number().int() }))
    .optional()
    .describe("with a worker pool: the workers holding a replica"),
  matmul_precision_requested: z.string().nullable().optional(),
  execution_mode: z.string().optional(),
  shape_plan: ShapePlan.nullable().optional(),
  graphs_compiled: z
    .number()
    .int()
    .optional()
    .describe('mode "compile": graphs the warm-up compiled (every shape of the plan)'),
  compile_cache: z
    .object({
      dir: z.string().nullable(),
      hits: z.number().int(),
      warm: z.boolean(),
      state: z.enum(["warm", "cold"]).optional(),
      backend: z
        .object({
          dir: z.string().nullable(),
          requests: z.number().int(),
          hits: z.number().int(),
          compilations: z.number().int(),
          warm: z.boolean(),
        })
        .optional()
        .describe(
          "the backend's own compile cache (TorchTPU): this load's requests, hits, compilations",
        ),
    })
    .optional()
    .describe("the on-disk compile caches: warm = graphs came from an earlier worker's compile"),
});

/** What the server and its policies know of load_model (policies/tool_policy.ts). */
const policy: ToolPolicy = {
  name: "load_model",
  scope: "models:load",
  workerOp: "load",
  job: true,
  deviceMode: "exclusive",
  timeoutS: 900,
  concurrency: 1,
  estimate: "load",
  runWhileRecording: false,
};

const build = (env: ToolEnv) => {
  const maxBatch = catalogMax(env, "max_batch");
  const maxSeq = catalogMax(env, "max_seq_len");
  const tool = defineTool(policy, {
    title: "Load a model",
    description:
      "Use before run_inference or on model_not_loaded: loads a model; reports load/compile times, device bytes. May need approval.",
    input: z
      .object({
        model: modelId(env),
        device: device.optional(),
        replicas: z
          .number()
          .int()
          .min(1)
          .max(256)
          .optional()
          .describe("copies on distinct pool workers"),
        dtype: dtype.optional(),
        mode: mode.default("eager"),
        warmup_shapes: z
          .array(
            z
              .object({
                batch: z.number().int().min(1).max(maxBatch),
                seq_len: z.number().int().min(1).max(maxSeq).optional(),
              })
              .strict(),
          )
          .max(8)
          .optional(),
        matmul_precision: matmulPrecision.optional(),
        wait,
        approval_id: approvalId,
      })
      .strict(),
    output: z.union([LoadResult, JobRef]),
    annotations: {
      readOnlyHint: false,
      destructiveHint: false,
      idempotentHint: false,
      openWorldHint: false,
    },
    estimate: (a, ctx) => estimateFor(policy, a, ctx),
    validate: (args, svc) => {
      const entry = entryOf(env, args.model);
      const dt = args.dtype ?? entry.default_dtype;
      if (!entry.dtypes.includes(dt)) {
        throw new ToolError(
          "unsupported_dtype",
          `${args.model} allows ${entry.dtypes.join(", ")}; choose one of those`,
        );
      }
      for (const s of args.warmup_shapes ?? []) {
        if (s.batch > entry.limits.max_batch || (s.seq_len ?? 0) > entry.limits.max_seq_len) {
          throw new ToolError(
            "invalid_argument",
            `warmup_shapes: ${args.model} takes batch ≤ ${entry.limits.max_batch} and seq_len ≤ ${entry.limits.max_seq_len}`,
          );
        }
      }
      if ((args.replicas ?? 1) > 1 && svc.runtime.single) {
        throw new ToolError(
          "invalid_argument",
          "replicas: this server runs one worker; configure runtime.workers (see the README's fleet section) for replicas",
        );
      }
    },
    async handler(args, ctx) {
      const entry = entryOf(env, args.model);
      const dt = args.dtype ?? entry.default_dtype;
      const workerArgs = {
        ...(args.replicas && !ctx.runtime.single ? { replicas: args.replicas } : {}),
        model: args.model,
        dtype: dt,
        mode: args.mode,
        ...(args.device ? { device: args.device } : {}),
        ...(args.warmup_shapes ? { warmup_shapes: args.warmup_shapes } : {}),
        ...(args.matmul_precision ? { matmul_precision: args.matmul_precision } : {}),
      };
      // With wait: false the dispatcher runs this handler as a job and answers with its id.
      const { result } = await ctx.runtime.call("load", workerArgs, {
        placement: ctx.placement,
        signal: ctx.signal,
        timeoutMs: ctx.deadline?.remainingMs(),
        onProgress: (p) => ctx.progress(p.progress, p.total, p.message),
      });
      return result;
    },
    render: (o) =>
      "job_id" in o
        ? `started job ${o.job_id}; follow it with get_job`
        : `${(o as { already_loaded?: boolean }).already_loaded ? "already loaded (not loaded again)" : "loaded"} ${o.model} on ${o.placement ? o.placement.map((p) => `${p.worker} (${p.device})`).join(", ") : o.device} as ${o.dtype} (${o.mode}): ${o.parameters} parameters, ${(o.bytes_on_device / 2 ** 20).toFixed(1)} MiB, load ${o.load_s.toFixed(2)} s, compile ${o.compile_s.toFixed(2)} s, warmup ${o.warmup_s.toFixed(2)} s${o.graphs_compiled !== undefined ? ` (${o.graphs_compiled} graphs${o.compile_cache?.warm ? ", warm cache" : ""})` : ""}${o.shape_plan ? `, shape plan ${o.shape_plan.size} shapes` : ""}${o.matmul_precision ? `, matmul precision ${o.matmul_precision}` : ""}`,
  });
  // Replicas are placed on a pool's workers: without a pool the argument is not published.
  if (env.deployment?.pool !== false) return tool;
  return { ...tool, listedInput: tool.input.omit({ replicas: true }) };
};

export const loadModel: ToolFile = { policy, build };
