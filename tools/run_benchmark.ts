import { z } from "zod";
import { ToolError } from "./errors.js";
import { approvalId, device, dtype, mode, modelId, wait } from "./schemas.js";
import { compareReports } from "./support/compare.js";
import { estimateFor } from "./support/estimate.js";
import { JobRef } from "./support/jobs.js";
import { defineTool, type ToolEnv } from "./types.js";

const Report = z.object({
  report_id: z.string(),
  resource_uri: z.string(),
  model: z.string(),
  scenario: z.string(),
  cancelled: z.boolean(),
  configs: z.array(z.record(z.string(), z.unknown())),
  manifest: z.record(z.string(), z.unknown()),
  comparison: z
    .object({
      baseline_id: z.string(),
      ratios: z.array(z.record(z.string(), z.unknown())),
      unmatched: z.number(),
      warnings: z.array(z.string()),
    })
    .optional(),
});

export const runBenchmark = (env: ToolEnv) => {
  const maxBatch = Math.max(...env.catalog.models.map((m) => m.limits.max_batch));
  const maxSeq = Math.max(1, ...env.catalog.models.map((m) => m.limits.max_seq_len));
  const b = env.limits.benchmark;
  return defineTool({
    name: "run_benchmark",
    title: "Benchmark a model",
    description:
      "Warmup plus timed runs over a grid of batch sizes × sequence lengths × dtypes × modes on a device: latency percentiles, throughput, load and compile time (warmup never counted, device synchronized before each clock read). Stored as tpu://benchmarks/{id}; baseline_id compares with an earlier report. Costly: may need approval.",
    input: z
      .object({
        model: modelId(env),
        device: device.optional(),
        batch_sizes: z.array(z.number().int().min(1).max(maxBatch)).min(1).max(8).default([1]),
        seq_lens: z.array(z.number().int().min(1).max(maxSeq)).min(1).max(8).optional(),
        dtypes: z.array(dtype).min(1).max(3).optional(),
        modes: z.array(mode).min(1).max(2).default(["eager"]),
        scenario: z.enum(["single-stream", "offline"]).default("single-stream"),
        iterations: z.number().int().min(1).max(b.max_iterations).optional(),
        duration_s: z.number().positive().max(b.max_duration_s).optional(),
        warmup: z.number().int().min(0).max(100).default(3),
        baseline_id: z.string().regex(/^bench_[0-9a-f]{20}$/).optional(),
        wait,
        approval_id: approvalId,
      })
      .strict()
      .refine((a) => !(a.iterations && a.duration_s), { message: "give iterations or duration_s, not both" }),
    output: z.union([Report, JobRef]),
    annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: false, openWorldHint: false },
    device: (a) => a.device ?? "default",
    estimate: (a, ctx) => estimateFor("run_benchmark", a, ctx),
    async handler(args, ctx) {
      const entry = env.catalog.models.find((m) => m.id === args.model)!;
      const dtypes = args.dtypes ?? [entry.default_dtype];
      const bad = dtypes.find((d) => !entry.dtypes.includes(d));
      if (bad) throw new ToolError("unsupported_dtype", `${args.model} allows ${entry.dtypes.join(", ")}, not ${bad}`);
      const tooBig = args.batch_sizes.find((x) => x > entry.limits.max_batch);
      if (tooBig) throw new ToolError("invalid_argument", `batch_sizes: ${args.model} takes at most ${entry.limits.max_batch}`);
      if (entry.task === "tensor" && args.seq_lens) {
        throw new ToolError("invalid_argument", `seq_lens: ${args.model} is a tensor model; omit seq_lens`);
      }
      const seqLens = entry.task === "tensor" ? undefined : (args.seq_lens ?? [Math.min(128, entry.limits.max_seq_len)]);
      if (seqLens?.some((s) => s > entry.limits.max_seq_len)) {
        throw new ToolError("invalid_argument", `seq_lens: ${args.model} takes at most ${entry.limits.max_seq_len}`);
      }
      const grid = args.batch_sizes.length * (seqLens?.length ?? 1) * dtypes.length * args.modes.length;
      if (grid > b.max_configs) {
        throw new ToolError("invalid_argument", `the grid has ${grid} configurations; the limit is ${b.max_configs}: drop some sizes, dtypes or modes`);
      }
      const baseline = args.baseline_id ? ctx.reports.get(args.baseline_id) : undefined;
      if (args.baseline_id && !baseline) {
        throw new ToolError("invalid_argument", `baseline_id: no report ${args.baseline_id}; run_benchmark returns report ids`);
      }
      const iterations = args.iterations ?? (args.duration_s ? undefined : 20);
      const { result } = await ctx.runtime.call<any>(
        "benchmark",
        {
          model: args.model,
          ...(args.device ? { device: args.device } : {}),
          batch_sizes: args.batch_sizes,
          ...(seqLens ? { seq_lens: seqLens } : {}),
          dtypes,
          modes: args.modes,
          ...(iterations ? { iterations } : {}),
          ...(args.duration_s ? { duration_s: args.duration_s } : {}),
          warmup: args.warmup,
        },
        { signal: ctx.signal, onProgress: (p) => ctx.progress(p.progress, p.total, p.message) },
      );
      const deviceName = String(result.manifest?.device?.kind ?? args.device ?? "default");
      const body = {
        model: args.model,
        scenario: args.scenario,
        cancelled: Boolean(result.cancelled),
        configs: result.configs ?? [],
        manifest: result.manifest ?? {},
        ...(baseline ? { comparison: compareReports(result, baseline.report, baseline.id) } : {}),
      };
      const stored = ctx.reports.put(ctx.principal.id, args.model, deviceName, body);
      return { report_id: stored.id, resource_uri: `tpu://benchmarks/${stored.id}`, ...body };
    },
    render: (o) => {
      if ("job_id" in o) return `started job ${o.job_id}; follow it with get_job`;
      const rows = o.configs.map((c: any) => {
        const l = c.latency_ms ?? {};
        return `  b=${c.batch}${c.seq_len ? ` s=${c.seq_len}` : ""} ${c.dtype} ${c.mode}: p50 ${Number(l.p50).toFixed(2)} ms, p99 ${Number(l.p99).toFixed(2)} ms, ${Number(c.throughput_items_per_s).toFixed(1)} items/s`;
      });
      return `benchmark ${o.report_id} of ${o.model} (${o.scenario}${o.cancelled ? ", cancelled: partial" : ""}) → ${o.resource_uri}\n${rows.join("\n")}`;
    },
  });
};
