// Generation for text-generation models, as LLM users know it (docs/tools.md, "Generation"): chat
// messages, sampling with a seed, stop sequences, log-probabilities; the bounds, the checks
// against a model's catalog entry and the answer's shape, shared by run_inference and
// run_benchmark so that both spell and bound them the same way.
import { createHash } from "node:crypto";
import { z } from "zod";
import type { CatalogEntry } from "../../runtime/catalog.js";
import type { GenerationArgs } from "../../runtime/wire/ops.js";
import { ToolError } from "../errors.js";
import { wellFormedText } from "../schemas.js";
import { ToolCall, checkTools } from "./tool_calls.js";
import type { ToolEnv } from "../types.js";

/** The contract's bounds; a catalog entry may lower logprobs (`limits.max_logprobs`). */
export const MAX_TEMPERATURE = 2;
export const MAX_TOP_K = 1000;
export const MAX_SEED = 2 ** 31 - 1;
export const MAX_STOP = 4;
export const MAX_STOP_CHARS = 64;
export const MAX_LOGPROBS = 5;

/** The largest logprobs any catalog model allows: the schema's static bound. */
export function catalogMaxLogprobs(env: ToolEnv): number {
  return Math.max(0, ...env.catalog.models.map(maxLogprobsOf));
}

export function maxLogprobsOf(entry: CatalogEntry): number {
  if (entry.task !== "text-generation") return 0;
  return Math.min(MAX_LOGPROBS, entry.limits.max_logprobs ?? MAX_LOGPROBS);
}

export const temperature = z.number().min(0).max(MAX_TEMPERATURE);
export const seed = z.number().int().min(0).max(MAX_SEED);

/** The sampling arguments of run_inference (run_benchmark takes temperature and seed). */
export function samplingInput(env: ToolEnv) {
  return {
    temperature: temperature.optional(),
    top_p: z.number().gt(0).max(1).optional(),
    top_k: z.number().int().min(0).max(MAX_TOP_K).optional(),
    seed: seed.optional(),
    stop: z.array(wellFormedText.min(1).max(MAX_STOP_CHARS)).max(MAX_STOP).optional(),
    logprobs: z.number().int().min(0).max(catalogMaxLogprobs(env)).optional(),
  };
}

/**
 * Structured output, in the OpenAI-compatible shapes: `{type: "json_schema", json_schema: {name,
 * schema, strict}}` (or `schema` beside `type`), `{type: "json_object"}`, `{type: "regex",
 * pattern}`, `{type: "choice", choices}`. Only the shape is checked here; the worker bounds the
 * schema's size and depth, enums, the pattern and the compile (response_format_refused), as the
 * grammar library sees them (runtime/worker/tpu_worker/generation/grammar.py).
 */
const jsonSchemaObject = z.looseObject({});
export const responseFormatInput = z
  .object({
    type: z.enum(["json_schema", "json_object", "regex", "choice"]),
    json_schema: z
      .object({
        name: z.string().optional(),
        schema: jsonSchemaObject,
        strict: z.boolean().optional(),
      })
      .strict()
      .optional(),
    schema: jsonSchemaObject.optional(),
    // Bounded here only against absurd sizes; the worker's bounds are tighter (docs/security.md).
    pattern: z.string().max(4096).optional(),
    choices: z.array(z.string().max(1024)).max(1024).optional(),
  })
  .strict();
export type ResponseFormat = z.infer<typeof responseFormatInput>;

/** The field each response_format type needs (and the ones it must not carry). */
const FORMAT_FIELDS = {
  json_schema: ["json_schema", "schema"],
  json_object: [],
  regex: ["pattern"],
  choice: ["choices"],
} as const;

function checkResponseFormat(rf: ResponseFormat): void {
  const need: readonly string[] = FORMAT_FIELDS[rf.type];
  const given = (["json_schema", "schema", "pattern", "choices"] as const).filter(
    (k) => rf[k] !== undefined,
  );
  const stray = given.find((k) => !need.includes(k));
  if (stray)
    throw new ToolError(
      "invalid_argument",
      `response_format.${stray}: a response_format of type ${rf.type} does not take it`,
    );
  if (need.length && given.length !== 1)
    throw new ToolError(
      "invalid_argument",
      `response_format: type ${rf.type} needs ${need.length > 1 ? "one of " : ""}${need.join(" or ")}`,
    );
}

/**
 * One conversation for the model's chat template; an assistant message may carry the
 * tool_calls it made, and a tool message the result of one (tool_calls.ts).
 */
export function messagesInput(env: ToolEnv, maxChars: number) {
  return z
    .array(
      z
        .object({
          role: z.enum(["system", "user", "assistant", "tool"]),
          content: wellFormedText.max(maxChars),
          tool_calls: z.array(ToolCall).min(1).max(16).optional(),
          tool_call_id: z.string().min(1).max(64).optional(),
        })
        .strict(),
    )
    .min(1)
    .max(env.limits.max_texts);
}

/** Every generation argument, by its wire name: checked and passed on as the worker takes them. */
const GENERATION_ONLY = [
  "messages",
  "temperature",
  "top_p",
  "top_k",
  "seed",
  "stop",
  "logprobs",
  "max_new_tokens",
  "response_format",
  "tools",
  "tool_choice",
] as const satisfies readonly (keyof GenerationArgs)[];

/**
 * Every check of the generation arguments against the chosen model, before the gate: arguments
 * a model does not take, the per-model bounds of the catalog, the size of a conversation.
 */
export function checkGeneration(entry: CatalogEntry, args: GenerationArgs): void {
  const given = GENERATION_ONLY.filter((k) => args[k] !== undefined);
  if (entry.task !== "text-generation") {
    if (given.length)
      throw new ToolError(
        "invalid_argument",
        `${given[0]}: only text-generation models take it; ${entry.id} is a ${entry.task} model`,
      );
    return;
  }
  if (args.max_new_tokens !== undefined && args.max_new_tokens > entry.limits.max_new_tokens) {
    throw new ToolError(
      "invalid_argument",
      `max_new_tokens: ${entry.id} allows at most ${entry.limits.max_new_tokens}`,
      { field: "max_new_tokens", max: entry.limits.max_new_tokens, got: args.max_new_tokens },
    );
  }
  const maxLp = maxLogprobsOf(entry);
  if (args.logprobs !== undefined && args.logprobs > maxLp) {
    throw new ToolError("invalid_argument", `logprobs: ${entry.id} allows at most ${maxLp}`, {
      field: "logprobs",
      max: maxLp,
      got: args.logprobs,
    });
  }
  if (args.response_format) checkResponseFormat(args.response_format);
  checkTools(args);
  if (args.messages) {
    // The rendered conversation is one prompt: it gets one text's budget of characters.
    const chars = args.messages.reduce((n, m) => n + m.content.length, 0);
    if (chars > entry.limits.max_text_chars) {
      throw new ToolError(
        "invalid_argument",
        `messages: ${entry.id} takes at most ${entry.limits.max_text_chars} characters of content per conversation, got ${chars}`,
        { field: "messages", max: entry.limits.max_text_chars, got: chars },
      );
    }
  }
}

/**
 * The prefix cache partition of a caller (runtime/worker/tpu_worker/generation/prefix.py): a hash
 * of the principal's id, so the worker never sees the id itself, or one key for everyone where
 * the operator shares the cache (config inference.prefix_cache_shared).
 */
export function prefixKey(principalId: string, shared: boolean | undefined): string {
  if (shared) return "shared";
  return createHash("sha256")
    .update(`tpu-mcp prefix cache\0${principalId}`)
    .digest("hex")
    .slice(0, 32);
}

/** The generation arguments as the worker takes them (the same names), without absent ones. */
export function generationArgs(args: GenerationArgs): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const k of GENERATION_ONLY) if (args[k] !== undefined) out[k] = args[k];
  return out;
}

const Logprob = z.object({ token: z.string(), logprob: z.number() });

/** One generated sequence of the worker's answer (runtime/PROTOCOL.md, `infer`). */
export const Generation = z.object({
  text: z.string(),
  finish_reason: z.enum([
    "stop",
    "length",
    "cancelled",
    "budget",
    "timeout",
    "approval",
    "tool_calls",
  ]),
  usage: z.object({
    prompt_tokens: z.number().int(),
    completion_tokens: z.number().int(),
  }),
  logprobs: z.array(Logprob.extend({ top: z.array(Logprob) })).optional(),
  /** With a response_format: whether the text is a complete sentence of its grammar. */
  grammar_complete: z.boolean().optional(),
  grammar_error: z.string().optional(),
  prefix_cached_tokens: z.number().int().optional(),
  /** With tools: the calls the model made (then finish_reason is tool_calls). */
  tool_calls: z.array(ToolCall).optional(),
});
export type Generation = z.infer<typeof Generation>;
