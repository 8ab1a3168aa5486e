import { z } from "zod";
import { device, modelId } from "./schemas.js";
import type { ToolPolicy } from "../policies/tool_policy.js";
import { defineTool, type ToolEnv, type ToolFile } from "./types.js";

/** What the server and its policies know of unload_model (policies/tool_policy.ts). */
const policy: ToolPolicy = {
  name: "unload_model",
  scope: "models:unload",
  workerOp: "unload",
  job: false,
  deviceMode: "exclusive",
  timeoutS: null,
  concurrency: null,
  estimate: null,
  runWhileRecording: false,
};

const build = (env: ToolEnv) =>
  defineTool(policy, {
    title: "Unload a model",
    description:
      "Use to free device memory: unloads a model; its queued requests fail with model_not_loaded.",
    input: z
      .object({
        model: modelId(env),
        device: device.optional().describe("only the replica on this pool worker or chip"),
      })
      .strict(),
    output: z.object({
      model: z.string(),
      freed_bytes: z.number().int(),
      workers: z.array(z.string()).optional().describe("with a worker pool: where it was unloaded"),
    }),
    annotations: {
      readOnlyHint: false,
      destructiveHint: true,
      idempotentHint: true,
      openWorldHint: false,
    },
    async handler(args, ctx) {
      const { result } = await ctx.runtime.call(
        "unload",
        { model: args.model, ...(args.device ? { device: args.device } : {}) },
        { placement: ctx.placement, signal: ctx.signal },
      );
      return result;
    },
    render: (o) =>
      `unloaded ${o.model}${o.workers ? ` from ${o.workers.join(", ")}` : ""}, freed ${(o.freed_bytes / 2 ** 20).toFixed(1)} MiB`,
  });

export const unloadModel: ToolFile = { policy, build };
