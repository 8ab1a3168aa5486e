import { z } from "zod";
import { toToolError } from "./errors.js";
import type { ModelFact } from "./stores/facts.js";
import { hostOnlyPolicy } from "../policies/tool_policy.js";
import { maxLogprobsOf } from "./support/generation.js";
import { ShapePlan, entryOf } from "./schemas.js";
import { defineTool, type ToolEnv, type ToolFile } from "./types.js";

export const ModelInfo = z.object({
  id: z.string(),
  task: z.string(),
  description: z.string(),
  /** The weights' licence (SPDX id) and where they come from, when the catalog says. */
  license: z.string().optional(),
  origin: z.string().optional(),
  format: z.string(),
  parameters: z.number().int().nullable(),
  weight_bytes: z.number().int().nullable(),
  dtypes: z.array(z.string()),
  default_dtype: z.string(),
  devices: z.array(z.string()),
  limits: z.object({
    max_batch: z.number().int(),
    max_seq_len: z.number().int(),
    max_new_tokens: z.number().int(),
    max_text_chars: z.number().int(),
    /** Text generation: top alternatives per token run_inference's logprobs may ask for. */
    max_logprobs: z.number().int().optional(),
  }),
  /** Text generation: run_inference takes messages (the worker read a chat template). */
  chat_template: z.boolean().optional(),
  input: z.object({ shape: z.array(z.number().int()), dtype: z.string() }).optional(),
  available: z.boolean(),
  problem: z.string().nullable(),
  loaded: z.boolean(),
  shape_plan: ShapePlan.optional().describe(
    "a loaded model: the batch and length buckets its forwards are padded to",
  ),
  decode_cache: z
    .string()
    .optional()
    .describe(
      'a loaded generation model: "static" (fixed slots, shapes of the plan only) or "dynamic" (why: in get_runtime_status)',
    ),
});

/** What the server and its policies know of list_models (policies/tool_policy.ts). */
const policy = hostOnlyPolicy("list_models", "models:read");

const build = (env: ToolEnv) =>
  defineTool(policy, {
    title: "List models",
    description:
      "Use to choose a model: every catalog model, its limits, and whether it is loaded.",
    input: z.object({}).strict(),
    output: z.object({ models: z.array(ModelInfo) }),
    annotations: {
      readOnlyHint: true,
      destructiveHint: false,
      idempotentHint: true,
      openWorldHint: false,
    },
    async handler(_args, ctx) {
      // The catalog is known without the worker: when it cannot be reached (crash loop, set-up
      // problem), list the models anyway, unavailable, with the reason.
      let down: string | null = null;
      const [facts, status] = await Promise.all([
        ctx.facts.all().catch((e) => {
          down = `the worker is unavailable (${toToolError(e).code}); run \`tpu-mcp doctor\``;
          return new Map<string, ModelFact>();
        }),
        ctx.runtime
          .call("status", {}, { signal: ctx.signal })
          .then((r) => r.result)
          .catch(() => ({ loaded: [], devices: [] })),
      ]);
      const loadedRows = new Map<string, any>((status.loaded ?? []).map((m: any) => [m.model, m]));
      const devices = [...new Set<string>((status.devices ?? []).map((d: any) => d.kind))];
      // The caller's own kept fine-tunes after the catalog (nobody else's: tools/stores/kept.ts);
      // the worker's describe lists them with the catalog's models.
      const kept = env.kept?.listFor(ctx.principal.id) ?? [];
      const entries = [
        ...env.catalog.models,
        ...kept.map((r) => ({
          ...entryOf(env, r.id),
          description: `${r.entry.description as string}; yours, kept until ${r.expires_at} (report ${r.report_id})`,
        })),
      ];
      return {
        models: entries.map((m) => {
          const f = facts.get(m.id);
          return {
            id: m.id,
            task: m.task,
            description: m.description,
            ...(m.license ? { license: m.license } : {}),
            ...(m.origin ? { origin: m.origin } : {}),
            format: m.format,
            parameters: f?.parameters ?? null,
            weight_bytes: f?.weight_bytes ?? null,
            dtypes: [...m.dtypes],
            default_dtype: m.default_dtype,
            devices,
            limits: {
              max_batch: m.limits.max_batch,
              max_seq_len: m.limits.max_seq_len,
              max_new_tokens: m.limits.max_new_tokens,
              max_text_chars: m.limits.max_text_chars,
              ...(m.task === "text-generation" ? { max_logprobs: maxLogprobsOf(m) } : {}),
            },
            ...(typeof f?.chat_template === "boolean" ? { chat_template: f.chat_template } : {}),
            ...(m.input ? { input: { shape: [...m.input.shape], dtype: m.input.dtype } } : {}),
            available: f?.available ?? false,
            problem: f?.problem ?? (f ? null : (down ?? "the worker did not describe this model")),
            loaded: loadedRows.has(m.id),
            ...(loadedRows.get(m.id)?.shape_plan
              ? { shape_plan: loadedRows.get(m.id).shape_plan }
              : {}),
            ...(typeof loadedRows.get(m.id)?.batching?.cache === "string"
              ? { decode_cache: loadedRows.get(m.id).batching.cache }
              : {}),
          };
        }),
      };
    },
    render: (o) =>
      o.models
        .map(
          (m) =>
            `${m.id} (${m.task}, ${m.parameters ?? "?"} params, ${m.dtypes.join("/")})${m.chat_template ? " [chat]" : ""}${m.loaded ? ` [loaded${m.shape_plan ? `, ${m.shape_plan.size} shapes` : ""}${m.decode_cache ? `, ${m.decode_cache} cache` : ""}]` : ""}${m.available ? "" : ` [unavailable: ${m.problem}]`}`,
        )
        .join("\n"),
  });

export const listModels: ToolFile = { policy, build };
