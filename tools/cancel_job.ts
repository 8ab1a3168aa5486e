import { z } from "zod";
import { ToolError } from "./errors.js";
import { JobView, jobIdArg, jobView } from "./get_job.js";
import { hostOnlyPolicy } from "../policies/tool_policy.js";
import { defineTool, type ToolEnv, type ToolFile } from "./types.js";

/** What the server and its policies know of cancel_job (policies/tool_policy.ts). */
const policy = hostOnlyPolicy("cancel_job", "jobs:read");

const build = (_env: ToolEnv) =>
  defineTool(policy, {
    title: "Cancel a job",
    description:
      "Use to stop a running job: the worker stops at its next step; a benchmark keeps finished configs.",
    input: z.object({ job_id: jobIdArg }).strict(),
    output: JobView,
    annotations: {
      readOnlyHint: false,
      destructiveHint: false,
      idempotentHint: true,
      openWorldHint: false,
    },
    async handler(args, ctx) {
      const job = await ctx.jobs.cancel(args.job_id, ctx.principal.id);
      if (!job) throw new ToolError("job_not_found", `no job ${args.job_id} of yours exists`);
      if (job.status === "running") {
        // Wait briefly so the answer shows the job's final state when the worker is quick.
        await Promise.race([
          ctx.jobs.settled(args.job_id),
          new Promise((r) => setTimeout(r, 5000)),
        ]);
      }
      return jobView((await ctx.jobs.get(args.job_id, ctx.principal.id)) ?? job);
    },
    render: (o) => `job ${o.job_id}: ${o.status}`,
  });

export const cancelJob: ToolFile = { policy, build };
