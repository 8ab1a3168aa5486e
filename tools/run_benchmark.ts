import { z } from "zod";
import { ToolError } from "./errors.js";
import { deviceKind as kindOf } from "../lib/device.js";
import {
  approvalId,
  catalogMax,
  device,
  dtype,
  entryOf,
  matmulPrecision,
  mode,
  modelId,
  wait,
} from "./schemas.js";
import {
  DEFAULT_ITERATIONS,
  DEFAULT_MAX_NEW_TOKENS,
  DEFAULT_SEQ_LEN,
  DEFAULT_WARMUP,
  EXTEND_FACTOR,
  MIN_SEQ_LEN,
} from "../lib/benchmark_defaults.js";
import { compareReports, unstableNote } from "./render/compare.js";
import { trainLine } from "./render/train_rows.js";
import { fineTuneLine } from "./render/fine_tune_rows.js";
import { estimateFor } from "./support/estimate.js";
import { keepPlan, recordKept } from "./support/keep.js";
import { seed, temperature } from "./support/generation.js";
import { JobRef } from "./stores/jobs.js";
import type { ToolPolicy } from "../policies/tool_policy.js";
import { reportCost, type ReportCost } from "../policies/limits/pricing.js";
import { defineTool, type ToolEnv, type ToolFile } from "./types.js";
import { BENCHMARK_VIEW_URI } from "../lib/views.js";

/** `{cost}` for a report with `pricing` set and its device kind priced; `{}` otherwise. */
function costOfReport(env: ToolEnv, kind: string, configs: unknown[]): { cost?: ReportCost } {
  const cost = env.pricing && reportCost(env.pricing, kind, configs as object[]);
  return cost ? { cost } : {};
}

/** A measured quantity the worker may not report (null or absent). */
const measured = z.number().nullable().optional();
/** Counts (iterations, graphs, bytes) are integers, so typed clients do not see 1.0. */
const count = z.number().int().nullable().optional();

// The request reaches the worker fully resolved, its defaults (lib/benchmark_defaults.ts, which
// the estimator reads too) filled in and its bounds in `limits`, and the worker asserts them
// (runtime/PROTOCOL.md, `benchmark`).
export {
  DEFAULT_ITERATIONS,
  DEFAULT_MAX_NEW_TOKENS,
  DEFAULT_SEQ_LEN,
  DEFAULT_WARMUP,
  EXTEND_FACTOR,
  MIN_SEQ_LEN,
} from "../lib/benchmark_defaults.js";
/** work "train_step": the optimizers, the default first (hyper-parameters: tpu_worker/bench/train_step.py). */
export const OPTIMIZERS = ["adamw", "sgd"] as const;
/** work "train_step" only: the whole step compiled (runtime/worker/tpu_worker/bench/train_step.py). */
export const WHOLE_STEP = "compile_step";
/** work "train_step": float32 weights, plain or under bfloat16 autocast (float16 would need a loss scaler). */
export const TRAIN_DTYPES = ["float32", "bfloat16"] as const;
/** Works that train copies of the model: "train_step" (one batch, timed) and "fine_tune" (a dataset). */
const TRAINING_WORKS = ["train_step", "fine_tune"];
/** work "fine_tune": its defaults (steps, held-out every tenth of them, AdamW's rate). */
export const FINE_TUNE_DEFAULTS = { steps: 50, learning_rate: 5e-5 } as const;
/** work "fine_tune"'s own arguments. */
const FINE_TUNE_ARGS = ["dataset", "steps", "eval_every", "learning_rate", "keep"] as const;

interface ResolvedBenchmark {
  dtypes: string[];
  seqLens: number[] | undefined;
  iterations: number | undefined;
  maxNewTokens: number | undefined;
  optimizer: (typeof OPTIMIZERS)[number] | undefined;
  /** work "fine_tune": steps and held-out interval, resolved. */
  tune:
    | {
        dataset: string;
        steps: number;
        eval_every: number;
        learning_rate: number;
        /** keep: the configuration whose weights are kept (its id is given by the handler). */
        keep?: { dtype: string; mode: string };
      }
    | undefined;
  grid: number;
  /**
   * How far the worker may extend an unstable series, × its window: a duration_s run stays
   * inside duration_s (1) unless extend_unstable asks for more; an iterations run extends.
   */
  extendFactor: number;
}

/**
 * Every check of a benchmark request against the chosen model and the server's bounds, with the
 * defaults filled in. One function for validation (before the gate), the estimate and the
 * handler, so what is estimated and approved is exactly what runs.
 */
function resolveBenchmark(env: ToolEnv, args: Record<string, any>): ResolvedBenchmark {
  const b = env.limits.benchmark;
  const entry = entryOf(env, args.model);
  const training = TRAINING_WORKS.includes(args.work);
  const tuning = args.work === "fine_tune";
  const allowed: readonly string[] = training ? TRAIN_DTYPES : entry.dtypes;
  // A fine-tune compares the precisions side by side unless told otherwise.
  const dtypes: string[] =
    args.dtypes ?? (tuning ? [...TRAIN_DTYPES] : [training ? "float32" : entry.default_dtype]);
  const bad = dtypes.find((d) => !allowed.includes(d));
  if (bad)
    throw new ToolError(
      "unsupported_dtype",
      training
        ? `work "${args.work}" trains float32 weights, plain or under bfloat16 autocast: dtypes ${TRAIN_DTYPES.join(", ")}, not ${bad}`
        : `${args.model} allows ${entry.dtypes.join(", ")}, not ${bad}`,
    );
  if (training && args.scenario === "offline")
    throw new ToolError(
      "invalid_argument",
      `scenario: work "${args.work}" runs one step at a time; use scenario "single-stream"`,
    );
  const tune = tuning ? resolveFineTune(env, args, entry.task, dtypes) : undefined;
  const stray = FINE_TUNE_ARGS.find((k) => args[k] !== undefined);
  if (stray && !tuning)
    throw new ToolError(
      "invalid_argument",
      `${stray}: only work "fine_tune" takes it; add work: "fine_tune" or omit ${stray}`,
    );
  if ((args.modes as string[]).includes(WHOLE_STEP) && !training)
    throw new ToolError(
      "invalid_argument",
      `modes: "${WHOLE_STEP}" compiles a whole training step; add work: "train_step" or use "compile"`,
    );
  if (args.optimizer !== undefined && args.work !== "train_step")
    throw new ToolError(
      "invalid_argument",
      `optimizer: only work "train_step" takes an optimizer (fine_tune runs AdamW); add work: "train_step" or omit optimizer`,
    );
  const tooBig = (args.batch_sizes as number[]).find((x) => x > entry.limits.max_batch);
  if (tooBig)
    throw new ToolError(
      "invalid_argument",
      `batch_sizes: ${args.model} takes at most ${entry.limits.max_batch}`,
    );
  if (entry.task === "tensor" && args.seq_lens) {
    throw new ToolError(
      "invalid_argument",
      `seq_lens: ${args.model} is a tensor model; omit seq_lens`,
    );
  }
  if (args.work === "generate" && entry.task !== "text-generation") {
    throw new ToolError(
      "invalid_argument",
      `work: ${args.model} is not a text-generation model; use work "forward"`,
    );
  }
  const sampling = (["temperature", "seed"] as const).find((k) => args[k] !== undefined);
  if (sampling && args.work !== "generate") {
    throw new ToolError(
      "invalid_argument",
      `${sampling}: only work "generate" samples; add work: "generate" or omit ${sampling}`,
    );
  }
  if (args.max_new_tokens && args.max_new_tokens > (entry.limits.max_new_tokens ?? 0)) {
    throw new ToolError(
      "invalid_argument",
      `max_new_tokens: ${args.model} takes at most ${entry.limits.max_new_tokens ?? 0}`,
    );
  }
  const seqLens: number[] | undefined =
    entry.task === "tensor"
      ? undefined
      : (args.seq_lens ?? [Math.min(DEFAULT_SEQ_LEN, entry.limits.max_seq_len)]);
  if (seqLens?.some((s) => s > entry.limits.max_seq_len)) {
    throw new ToolError(
      "invalid_argument",
      `seq_lens: ${args.model} takes at most ${entry.limits.max_seq_len}`,
    );
  }
  if (args.extend_unstable !== undefined && args.duration_s === undefined)
    throw new ToolError(
      "invalid_argument",
      `extend_unstable: an iterations run already extends unstable series (up to ${EXTEND_FACTOR}x); it applies to duration_s runs only, so omit it or give duration_s`,
    );
  const grid = args.batch_sizes.length * (seqLens?.length ?? 1) * dtypes.length * args.modes.length;
  if (grid > b.max_configs) {
    throw new ToolError(
      "invalid_argument",
      `the grid has ${grid} configurations; the limit is ${b.max_configs}: drop some sizes, dtypes or modes`,
    );
  }
  return {
    dtypes,
    seqLens,
    iterations: tuning
      ? undefined
      : (args.iterations ?? (args.duration_s ? undefined : DEFAULT_ITERATIONS)),
    maxNewTokens:
      args.work === "generate"
        ? (args.max_new_tokens ??
          Math.min(DEFAULT_MAX_NEW_TOKENS, entry.limits.max_new_tokens ?? 1))
        : undefined,
    optimizer: training ? (args.optimizer ?? OPTIMIZERS[0]) : undefined,
    tune,
    grid,
    extendFactor:
      args.duration_s !== undefined && args.extend_unstable !== true ? 1 : EXTEND_FACTOR,
  };
}

/** work "fine_tune"'s own arguments checked, their defaults filled in. */
function resolveFineTune(
  env: ToolEnv,
  args: Record<string, any>,
  task: string,
  dtypes: string[],
): NonNullable<ResolvedBenchmark["tune"]> {
  if (task !== "text-generation")
    throw new ToolError(
      "invalid_argument",
      `work: "fine_tune" trains text-generation models on text; ${args.model} is a ${task} model`,
    );
  if (!args.dataset)
    throw new ToolError(
      "invalid_argument",
      `dataset: work "fine_tune" needs a catalog dataset id (the built-in one is "us-founding-texts")`,
    );
  if (args.iterations !== undefined || args.duration_s !== undefined)
    throw new ToolError(
      "invalid_argument",
      `work "fine_tune" runs \`steps\` steps: give steps, not iterations or duration_s`,
    );
  if (args.batch_sizes.length !== 1 || (args.seq_lens && args.seq_lens.length !== 1))
    throw new ToolError(
      "invalid_argument",
      `work "fine_tune" trains one shape: give one batch size and one seq_len`,
    );
  const steps = args.steps ?? FINE_TUNE_DEFAULTS.steps;
  const evalEvery = args.eval_every ?? Math.max(1, Math.floor(steps / 10));
  if (evalEvery > steps)
    throw new ToolError(
      "invalid_argument",
      `eval_every: ${evalEvery} is more than the ${steps} steps; held-out loss is evaluated every eval_every steps`,
    );
  if (args.keep && !env.kept)
    throw new ToolError("invalid_argument", "keep: this server keeps no fine-tunes; omit keep");
  return {
    dataset: args.dataset,
    steps,
    eval_every: evalEvery,
    learning_rate: args.learning_rate ?? FINE_TUNE_DEFAULTS.learning_rate,
    // float32's weights (the reference), or the one dtype asked for; in the first mode.
    ...(args.keep
      ? {
          keep: { dtype: dtypes.includes("float32") ? "float32" : dtypes[0]!, mode: args.modes[0] },
        }
      : {}),
  };
}

/** One measured configuration, as the worker reports it (tpu_worker/bench/; more fields pass through). */
const Config = z
  .object({
    batch: z.number().int(),
    seq_len: z.number().int().nullable().optional(),
    dtype: z.string(),
    mode: z.string(),
    scenario: z.string(),
    work: z.string().optional(),
    iterations: count,
    latency_ms: z
      .object({
        p50: z.number(),
        p90: z.number(),
        p99: z.number(),
        mean: z.number(),
        min: z.number(),
        max: z.number(),
      })
      .nullable(),
    throughput_items_per_s: measured,
    throughput_basis: z.string().optional(),
    tokens_per_s: measured,
    first_call_s: measured,
    compile_s: measured,
    graphs_compiled: count,
    recompiles_in_window: count,
    recompiled: z.boolean().optional(),
    load_s: measured,
    peak_memory_bytes: count,
    peak_memory_increase_bytes: count,
    peak_memory_kind: z.string().optional(),
    matmul_precision: z.string().optional(),
    max_abs_error_vs_fp32: measured,
    max_rel_error_vs_fp32: measured,
    cosine_similarity_vs_fp32: measured,
    flops_per_item: measured,
    achieved_flops_per_s: measured,
    peak_flops_per_s: measured,
    fraction_of_peak: measured,
    // work "train_step" adds loss, drift, memory split, FLOPs per step (tpu_worker/bench/
    // train_bench.py), passed through; a flagged fraction of peak is typed.
    fraction_of_peak_fault: z.string().nullable().optional(),
    stability: z
      .object({
        stable: z.boolean(),
        reason: z.string().nullable(),
        mad_ms: z.number(),
        p50_ci_ms: z.tuple([z.number(), z.number()]),
        iterations_requested: count,
        extended: z.boolean(),
        loadavg_1m: measured,
        steal_pct: measured,
        cpus: count,
      })
      .passthrough()
      .optional(),
    error: z.object({ code: z.string(), message: z.string() }).passthrough().nullable(),
  })
  .passthrough()
  .describe("per configuration: stability, error, ... (the report has all)");

const Report = z.object({
  report_id: z.string(),
  resource_uri: z.string(),
  markdown_uri: z.string(),
  chart_uri: z.string(),
  model: z.string(),
  scenario: z.enum(["single-stream", "offline"]),
  work: z.enum(["forward", "generate", "train_step", "fine_tune"]),
  cancelled: z.boolean(),
  /** Present when the gate stopped the run: its budget or time limit ran out; configs are what it measured. */
  stopped: z.enum(["budget", "timeout", "approval"]).optional(),
  configs: z.array(Config),
  manifest: z.record(z.string(), z.unknown()),
  cost: z
    .object({
      currency: z.string(),
      device_kind: z.string(),
      price_per_chip_hour: z.string(),
      measured: z.string(),
      measured_s: z.number(),
      configs: z.array(
        z.object({ measured: z.string(), per_1k_items: z.string().nullable() }).nullable(),
      ),
    })
    .optional()
    .describe("with the server's pricing set: the measured device time in money"),
  comparison: z
    .object({
      baseline_id: z.string(),
      ratios: z.array(z.record(z.string(), z.unknown())),
      unmatched: z.number().int(),
      warnings: z.array(z.string()),
    })
    .optional(),
});

/** What the server and its policies know of run_benchmark (policies/tool_policy.ts). */
const policy: ToolPolicy = {
  name: "run_benchmark",
  scope: "benchmark:run",
  workerOp: "benchmark",
  job: true,
  deviceMode: "exclusive",
  timeoutS: 1800,
  concurrency: 1,
  estimate: "benchmark",
  runWhileRecording: false,
};

const build = (env: ToolEnv) => {
  const maxBatch = catalogMax(env, "max_batch");
  const maxSeq = catalogMax(env, "max_seq_len");
  const maxNew = catalogMax(env, "max_new_tokens");
  const b = env.limits.benchmark;
  return defineTool(policy, {
    title: "Benchmark a model",
    description:
      "Use to measure a model: per batch x seq_len x dtype x mode, latency p50/p90/p99, throughput, compile, memory, error vs float32, FLOPs. " +
      "Report: tpu://benchmarks/{id}. May need approval.",
    input: z
      .object({
        model: modelId(env),
        device: device.optional(),
        batch_sizes: z.array(z.number().int().min(1).max(maxBatch)).min(1).max(8).default([1]),
        seq_lens: z.array(z.number().int().min(MIN_SEQ_LEN).max(maxSeq)).min(1).max(8).optional(),
        dtypes: z.array(dtype).min(1).max(3).optional(),
        modes: z
          .array(z.enum([...mode.options, WHOLE_STEP]))
          .min(1)
          .max(3)
          .default(["eager"]),
        scenario: z
          .enum(["single-stream", "offline"])
          .default("single-stream")
          .describe("offline: largest batch that fits"),
        work: z
          .enum(["forward", "generate", "train_step", "fine_tune"])
          .default("forward")
          .describe("fine_tune: train on a dataset (us-founding-texts)"),
        optimizer: z.enum(OPTIMIZERS).optional(),
        dataset: z
          .string()
          .regex(/^[a-z0-9][a-z0-9._-]{0,63}$/)
          .optional(),
        steps: z.number().int().min(1).max(b.max_iterations).optional(),
        eval_every: z.number().int().min(1).max(b.max_iterations).optional(),
        learning_rate: z.number().positive().max(1).optional(),
        keep: z.boolean().optional(),
        max_new_tokens: z.number().int().min(1).max(maxNew).optional(),
        temperature: temperature.optional(),
        seed: seed.optional(),
        iterations: z.number().int().min(1).max(b.max_iterations).optional(),
        duration_s: z.number().positive().max(b.max_duration_s).optional(),
        extend_unstable: z
          .boolean()
          .optional()
          .describe(`extend unstable series (to ${EXTEND_FACTOR}x duration_s)`),
        warmup: z.number().int().min(0).max(b.max_warmup).default(DEFAULT_WARMUP),
        matmul_precision: matmulPrecision.optional(),
        baseline_id: z
          .string()
          .regex(/^bench_[0-9a-f]{20}$/)
          .optional(),
        wait,
        approval_id: approvalId,
      })
      .strict()
      .refine((a) => !(a.iterations && a.duration_s), {
        message: "give iterations or duration_s, not both",
      }),
    output: z.union([Report, JobRef]),
    annotations: {
      readOnlyHint: false,
      destructiveHint: false,
      idempotentHint: false,
      openWorldHint: false,
    },
    ui: { resourceUri: BENCHMARK_VIEW_URI },
    estimate: (a, ctx) => {
      const r = resolveBenchmark(env, a);
      return estimateFor(
        policy,
        {
          ...a,
          seq_lens: r.seqLens,
          dtypes: r.dtypes,
          iterations: r.iterations,
          max_new_tokens: r.maxNewTokens,
          optimizer: r.optimizer,
          extend_factor: r.extendFactor,
          // A fine-tune runs its steps, once each, no warmup and no extension.
          ...(r.tune ? { iterations: r.tune.steps, warmup: 0, extend_factor: 1 } : {}),
        },
        ctx,
      );
    },
    validate: async (args, svc) => {
      resolveBenchmark(env, args);
      if (args.baseline_id && !(await svc.reports.get(args.baseline_id))) {
        throw new ToolError(
          "invalid_argument",
          `baseline_id: no report ${args.baseline_id}; run_benchmark returns report ids`,
        );
      }
    },
    async handler(args, ctx) {
      const r = resolveBenchmark(env, args);
      const baseline = args.baseline_id ? await ctx.reports.get(args.baseline_id) : undefined;
      // A keep over the principal's storage bound is refused before the run spends anything.
      const keep = r.tune?.keep ? await keepPlan(env, ctx, args.model, r.tune.keep) : undefined;
      const { result } = await ctx.runtime.call(
        "benchmark",
        {
          model: args.model,
          ...(args.device ? { device: args.device } : {}),
          batch_sizes: args.batch_sizes,
          ...(r.seqLens ? { seq_lens: r.seqLens } : {}),
          dtypes: r.dtypes,
          modes: args.modes,
          // The LoadGen scenario and the work type travel apart (runtime/PROTOCOL.md).
          scenario: args.scenario,
          work: args.work,
          ...(r.maxNewTokens ? { max_new_tokens: r.maxNewTokens } : {}),
          ...(r.optimizer && !r.tune ? { optimizer: r.optimizer } : {}),
          ...(r.tune ? { ...r.tune, keep } : {}),
          // Sampling as in run_inference (greedy when absent); the seed makes runs repeatable.
          ...(args.temperature !== undefined ? { temperature: args.temperature } : {}),
          ...(args.seed !== undefined ? { seed: args.seed } : {}),
          ...(r.iterations ? { iterations: r.iterations } : {}),
          ...(args.duration_s ? { duration_s: args.duration_s } : {}),
          warmup: args.warmup,
          ...(args.matmul_precision ? { matmul_precision: args.matmul_precision } : {}),
          extend_factor: r.extendFactor,
          // The server's bounds travel with the request: the worker checks against these (it
          // has none of its own), so an operator who raises a limit never meets a stricter worker.
          limits: { ...env.limits.benchmark, min_seq_len: MIN_SEQ_LEN },
        },
        {
          placement: ctx.placement,
          signal: ctx.signal,
          timeoutMs: ctx.deadline?.remainingMs(),
          onProgress: (p) => ctx.progress(p.progress, p.total, p.message),
        },
      );
      // Stored under the device kind, which is what cost estimates look history up by.
      const deviceKind = String(result.manifest?.device_kind ?? kindOf(args.device ?? "default"));
      const kept = keep ? recordKept(env, ctx, args, result, keep) : undefined;
      const body = {
        model: args.model,
        scenario: args.scenario,
        work: args.work,
        cancelled: Boolean(result.cancelled),
        ...(result.stopped ? { stopped: result.stopped } : {}),
        configs: result.configs ?? [],
        manifest: { ...result.manifest, ...(kept ? { kept: kept.summary } : {}) },
        // The measured device time in money, with `pricing` set and the kind priced.
        ...costOfReport(env, deviceKind, result.configs ?? []),
        ...(baseline ? { comparison: compareReports(result, baseline.report, baseline.id) } : {}),
      };
      const stored = await ctx.reports.put(ctx.principal.id, args.model, deviceKind, body);
      if (kept?.record) {
        env.kept!.add({ ...kept.record, report_id: stored.id });
        ctx.facts.invalidate();
      }
      const uri = `tpu://benchmarks/${stored.id}`;
      return {
        report_id: stored.id,
        resource_uri: uri,
        markdown_uri: `${uri}.md`,
        chart_uri: `${uri}.svg`,
        ...body,
      };
    },
    render: (o) => {
      if ("job_id" in o) return `started job ${o.job_id}; follow it with get_job`;
      const fmt = (v: unknown, d = 2) =>
        typeof v === "number" && Number.isFinite(v) ? v.toFixed(d) : "–";
      const rows = o.configs.map((c: any) => {
        if (o.work === "train_step") return trainLine(c);
        if (o.work === "fine_tune") return fineTuneLine(c);
        const head = `  b=${c.batch}${c.seq_len ? ` s=${c.seq_len}` : ""} ${c.dtype} ${c.mode}`;
        if (c.error) return `${head}: ${c.error.code}`;
        const l = c.latency_ms ?? {};
        return (
          `${head}: p50 ${fmt(l.p50)} ms, p99 ${fmt(l.p99)} ms, ${fmt(c.throughput_items_per_s, 1)} items/s` +
          (c.mode === "compile"
            ? `, compile ${fmt(c.compile_s, 2)} s${c.recompiled ? " (RECOMPILED in window)" : ""}`
            : "") +
          (c.max_abs_error_vs_fp32 != null
            ? `, max err ${c.max_abs_error_vs_fp32.toExponential(2)}`
            : "") +
          // The shape plan's padding of this configuration (shape_report in the JSON report).
          (c.shape_report?.padding_waste
            ? `, padding ${(c.shape_report.padding_waste * 100).toFixed(0)}%`
            : "") +
          (c.stability?.p50_ci_ms
            ? `, p50 CI ${fmt(c.stability.p50_ci_ms[0])}–${fmt(c.stability.p50_ci_ms[1])} ms`
            : "") +
          (unstableNote(c) ? `; ${unstableNote(c)}` : "")
        );
      });
      const diffs = (o.comparison?.ratios ?? []).map(
        (r: any) =>
          `  b=${r.batch}${r.seq_len ? ` s=${r.seq_len}` : ""} ${r.dtype} ${r.mode}: p50 ×${fmt(r.p50_ratio, 3)}` +
          (r.p50_ratio_ci
            ? ` (${fmt(r.p50_ratio_ci[0], 3)}–${fmt(r.p50_ratio_ci[1], 3)}): ${r.difference}`
            : `: ${r.difference ?? "no interval"}`),
      );
      const cmp = o.comparison
        ? `\nvs ${o.comparison.baseline_id}:\n${diffs.join("\n")}` +
          (o.comparison.warnings.length ? `\nwarnings: ${o.comparison.warnings.join("; ")}` : "")
        : "";
      // A duration_s run is not extended (extend_factor 1): say which series it left unstable.
      const left = o.configs.filter(
        (c: any) => c.stability?.stable === false && !c.stability.extended,
      );
      const bounded =
        o.manifest.extend_factor === 1 && left.length > 0
          ? `\n${left.length} unstable configuration(s) left as measured (duration_s bounds each; extend_unstable: true runs them up to ${EXTEND_FACTOR}x longer): ${left.map((c: any) => `b=${c.batch}${c.seq_len ? ` s=${c.seq_len}` : ""} ${c.dtype} ${c.mode}`).join(", ")}`
          : "";
      const k = o.manifest.kept as
        { model: string | null; reason?: string; expires_at?: string } | undefined;
      const keptLine = k
        ? `\n${k.model ? `kept as model ${k.model} (load_model serves it to you until ${k.expires_at})` : k.reason}`
        : "";
      return `benchmark ${o.report_id} of ${o.model} (${o.scenario}, ${o.work}${o.cancelled ? ", cancelled: partial" : ""}${o.stopped ? `, stopped (${o.stopped}): partial` : ""}) → ${o.resource_uri} (.md, .svg)\n${rows.join("\n")}${bounded}${cmp}${keptLine}`;
    },
  });
};

export const runBenchmark: ToolFile = { policy, build };
