// Argument pieces shared by several tools, so that `model`, `device`, `dtype`, ... mean the same
// thing everywhere: argument names are part of the public contract.
import { z } from "zod";
import { DEVICE_KIND_ALTERNATION } from "../lib/device.js";
import { MODEL_DTYPES, TENSOR_DTYPES } from "../runtime/types.js";
import type { CatalogEntry } from "../runtime/catalog.js";
import type { ToolEnv } from "./types.js";

type LimitKey = "max_batch" | "max_seq_len" | "max_new_tokens" | "max_text_chars";

/**
 * The largest value of a limit across the catalog (at least 1): the schema's static bound.
 * Each handler then checks the chosen model's own, smaller limit.
 */
export function catalogMax(env: ToolEnv, key: LimitKey): number {
  return Math.max(1, ...env.catalog.models.map((m) => m.limits[key]));
}

/**
 * The catalog entry of a model id the input schema already accepted. A kept fine-tune (its owner
 * checked by the dispatcher) answers with its base model's entry under its own id.
 */
export function entryOf(env: ToolEnv, id: string): CatalogEntry {
  const entry = findEntry(env, id);
  if (!entry) throw new Error(`model ${id} passed validation but is not in the catalog`);
  return entry;
}

/** A catalog model's entry, or a live kept fine-tune's (its base's under its own id); else none. */
export function findEntry(env: ToolEnv, id: unknown): CatalogEntry | undefined {
  const kept = typeof id === "string" ? env.kept?.record(id) : undefined;
  const base = kept ? env.catalog.models.find((m) => m.id === kept.base) : undefined;
  if (base && kept) return env.kept?.entry(kept.id, base);
  return env.catalog.models.find((m) => m.id === id);
}

export function modelId(env: ToolEnv) {
  const ids = env.catalog.models.map((m) => m.id) as [string, ...string[]];
  return z.enum(ids);
}

const DEVICE = new RegExp(
  `^((${DEVICE_KIND_ALTERNATION})(:\\d{1,2})?|[A-Za-z][A-Za-z0-9_.-]{0,62})$`,
);

/** Checked by a refinement, not a published pattern: the description says the forms in fewer bytes. */
export const device = z
  .string()
  .max(63)
  .refine((s) => DEVICE.test(s), {
    message:
      "use tpu, cuda, xla or cpu, optionally with :index, or a worker's name (get_runtime_status lists them)",
  })
  .describe("tpu, tpu:0, cuda:1, cpu, a pool worker");

/** A UTF-16 surrogate without its partner: not a character, and not encodable as UTF-8. */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/** Free text for a model: refused up front when it is not valid Unicode (a lone surrogate). */
export const wellFormedText = z.string().refine((s) => !LONE_SURROGATE.test(s), {
  message:
    "contains a lone UTF-16 surrogate (not valid Unicode); send well-formed text (e.g. replace it with U+FFFD)",
});

export const dtype = z.enum(MODEL_DTYPES);
export const mode = z.enum(["eager", "compile"]);

const APPROVAL_ID = /^apr_[A-Za-z0-9_-]{8,64}$/;

/**
 * Checked by a refinement, not a published pattern: the id is the server's own handle, copied
 * from an approval_required answer, so a pattern in every costly tool's schema tells an agent
 * nothing it can use.
 */
export const approvalId = z
  .string()
  .refine((s) => APPROVAL_ID.test(s), { message: "an approval id looks like apr_…" })
  .optional();

/** false: a job_id at once (get_job's description says how to follow it). */
export const wait = z.boolean().default(true);

export function tensorInput(env: ToolEnv) {
  const max = env.limits.max_tensor_elements;
  return z
    .object({
      dtype: z.enum(TENSOR_DTYPES),
      shape: z
        .array(
          z
            .number()
            .int()
            .min(0)
            .max(1 << 30),
        )
        .min(1)
        .max(8),
      data: z.array(z.number()).max(max).optional(),
      data_b64: z
        .string()
        .max(Math.ceil((max * 8 * 4) / 3) + 4)
        .optional()
        .describe("C order; b64: little-endian"),
    })
    .strict()
    .refine((t) => (t.data === undefined) !== (t.data_b64 === undefined), {
      message: "give exactly one of data or data_b64",
    });
}

/** float32 matmul precision for the worker's process: on TPU 1, 3 or 6 bf16 passes. */
export const matmulPrecision = z
  .enum(["medium", "high", "highest"])
  .describe("TPU bf16 passes: 1/3/6");

/** A loaded model's shape plan (runtime/worker/tpu_worker/shapes.py): the only shapes its forwards take. */
export const ShapePlan = z
  .object({
    batch_buckets: z.array(z.number().int()),
    length_buckets: z.array(z.number().int()),
    prefill_batch_buckets: z.array(z.number().int()).optional(),
    prefill_cached_length_buckets: z.array(z.number().int()).optional(),
    size: z.number().int().describe("distinct forward shapes the plan allows"),
  })
  .describe("the batch and length buckets every forward is padded to");

/** A loaded generation model's prefix cache: its bound, size and hit rate since the load. */
export const PrefixCacheStatus = z
  .object({
    enabled: z.boolean(),
    max_bytes: z.number().int().optional(),
    bytes: z.number().int().optional(),
    hit_rate: z.number().nullable().optional(),
    token_hit_rate: z.number().nullable().optional(),
    cached_tokens: z.number().int().optional(),
  })
  .passthrough();
export type PrefixCacheStatus = z.infer<typeof PrefixCacheStatus>;

/** The shapes a model's forwards ran at since its load, and the padding they cost. */
export const ShapesSeen = z
  .object({
    distinct_shapes: z.number().int(),
    forwards: z.number().int(),
    real_tokens: z.number().int(),
    padded_tokens: z.number().int(),
    real_to_padded: z.number().nullable(),
    padding_waste: z.number().nullable().describe("1 - real ÷ padded tokens"),
  })
  .passthrough();

/**
 * Mode "compile": the graphs the load's warm-up compiled, and any compile after it: graphs, and the
 * op shapes first run after the warm-up around a decode step's forward (each a compile on an eager
 * TPU backend; runtime/worker/tpu_worker/census.py).
 */
export const Compiles = z.object({
  graphs_compiled: z.number().int().nullable(),
  recompiles_since_load: z.number().int(),
  op_shapes_since_load: z
    .number()
    .int()
    .optional()
    .describe("of recompiles_since_load: new (op, input shapes) signatures around the decode step"),
  recompiled: z.boolean().describe("true: a call compiled after the warm-up (see the worker log)"),
});
