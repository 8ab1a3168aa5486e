import { z } from "zod";
import { ToolError } from "./errors.js";
import { hostOnlyPolicy } from "../policies/tool_policy.js";
import { defineTool, type ToolEnv, type ToolFile } from "./types.js";
import { BENCHMARK_VIEW_URI } from "../lib/views.js";
import type { JobRecord } from "./stores/jobs.js";

export const jobIdArg = z
  .string()
  .regex(/^job_[0-9a-f]{24}$/, "a job id looks like job_ followed by 24 hex digits");

export const JobView = z.object({
  job_id: z.string(),
  tool: z.string(),
  status: z.enum(["running", "succeeded", "failed", "cancelled", "interrupted"]),
  progress: z.number().nullable(),
  total: z.number().nullable(),
  message: z.string().nullable(),
  result: z.record(z.string(), z.unknown()).nullable(),
  error: z.object({ code: z.string(), message: z.string() }).nullable(),
  created_at: z.string(),
  updated_at: z.string(),
});

/** What a tool shows of a job: not its principal (the caller's own) nor the store's own fields. */
export function jobView(job: JobRecord): z.infer<typeof JobView> {
  const view: Record<string, unknown> = {};
  for (const k of Object.keys(JobView.shape)) view[k] = job[k as keyof JobRecord];
  return view as z.infer<typeof JobView>;
}

/** What the server and its policies know of get_job (policies/tool_policy.ts). */
const policy = hostOnlyPolicy("get_job", "jobs:read");

const build = (_env: ToolEnv) =>
  defineTool(policy, {
    title: "Get a job",
    description:
      "Use to follow a job_id (wait: false, or past the soft deadline): status, progress, result.",
    input: z.object({ job_id: jobIdArg }).strict(),
    output: JobView,
    annotations: {
      readOnlyHint: true,
      destructiveHint: false,
      idempotentHint: true,
      openWorldHint: false,
    },
    // A finished benchmark job is drawn like run_benchmark's result; other jobs show their state.
    ui: { resourceUri: BENCHMARK_VIEW_URI },
    async handler(args, ctx) {
      const job = await ctx.jobs.get(args.job_id, ctx.principal.id);
      if (!job) throw new ToolError("job_not_found", `no job ${args.job_id} of yours exists`);
      return jobView(job);
    },
    render: (o) =>
      `job ${o.job_id} (${o.tool}): ${o.status}` +
      (o.progress !== null ? ` ${o.progress}${o.total ? `/${o.total}` : ""}` : "") +
      (o.message ? ` — ${o.message}` : "") +
      (o.error ? ` — ${o.error.code}: ${o.error.message}` : ""),
  });

export const getJob: ToolFile = { policy, build };
