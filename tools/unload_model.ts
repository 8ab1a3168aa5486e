import { z } from "zod";
import { modelId } from "./schemas.js";
import { defineTool, type ToolEnv } from "./types.js";

export const unloadModel = (env: ToolEnv) =>
  defineTool({
    name: "unload_model",
    title: "Unload a model",
    description:
      "Frees a loaded model and its device memory. Requests queued for it fail with model_not_loaded.",
    input: z.object({ model: modelId(env) }).strict(),
    output: z.object({ model: z.string(), freed_bytes: z.number().int() }),
    annotations: {
      readOnlyHint: false,
      destructiveHint: true,
      idempotentHint: true,
      openWorldHint: false,
    },
    device: () => "default",
    async handler(args, ctx) {
      const { result } = await ctx.runtime.call<{ model: string; freed_bytes: number }>(
        "unload",
        { model: args.model },
        { signal: ctx.signal },
      );
      return result;
    },
    render: (o) => `unloaded ${o.model}, freed ${(o.freed_bytes / 2 ** 20).toFixed(1)} MiB`,
  });
