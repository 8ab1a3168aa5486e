// The server's view of the model catalog: ids, tasks, dtypes and limits, read at start-up so that
// tools/list can answer before the worker is up. The worker re-validates the same file and owns
// everything about weights (paths, formats, digests); see runtime/PROTOCOL.md.
import { readFileSync } from "node:fs";
import { z } from "zod";
import { MODEL_DTYPES } from "./types.js";

const ModelIdSchema = z
  .string()
  .regex(/^[a-z0-9][a-z0-9._-]{0,63}$/, "ids are 1-64 chars of a-z, 0-9, '.', '_' or '-'");

export const CatalogEntrySchema = z.object({
  id: ModelIdSchema,
  task: z.enum(["embedding", "text-generation", "classification", "tensor"]),
  architecture: z.string(),
  description: z.string().default(""),
  /** The weights' licence (SPDX id), shown by list_models. */
  license: z.string().min(1).optional(),
  /** Where the weights come from (a hub id, a package), shown by list_models. */
  origin: z.string().min(1).optional(),
  source: z.union([
    z.object({ path: z.string().min(1) }).strict(),
    z.object({ hub: z.string().min(1), revision: z.string().regex(/^[0-9a-f]{40}$/) }).strict(),
  ]),
  format: z.enum(["safetensors", "hf-safetensors", "pytorch"]),
  trusted: z.boolean().default(false),
  dtypes: z.array(z.enum(MODEL_DTYPES)).min(1),
  default_dtype: z.enum(MODEL_DTYPES),
  input: z.object({ shape: z.array(z.number().int().positive()), dtype: z.string() }).optional(),
  limits: z.object({
    max_batch: z.number().int().positive(),
    max_seq_len: z.number().int().min(0),
    max_new_tokens: z.number().int().min(0),
    max_text_chars: z.number().int().min(0),
    /** Top alternatives per generated token a caller may ask for (text generation; at most 5). */
    max_logprobs: z.number().int().min(0).max(5).optional(),
  }),
  batching: z
    .object({ max_batch: z.number().int().positive(), max_wait_ms: z.number().min(0) })
    .optional(),
  /**
   * Who runs the model: "torch" (the worker's own PyTorch, the default) or "vllm" (a vLLM server
   * the worker starts and supervises; causal-lm in hf-safetensors only; docs/vllm.md).
   */
  engine: z.enum(["torch", "vllm"]).default("torch"),
  /**
   * The shape plan's buckets (runtime/worker/tpu_worker/shapes.py): the batch sizes and sequence
   * lengths a forward is padded to. Absent: 1, 2, 4, ... up to limits.max_batch and powers of two
   * from 8 up to limits.max_seq_len. strict: a compile or a new op shape after the load's warm-up
   * fails the generation with recompile_after_load (tpu_worker/census.py) instead of being counted.
   */
  shapes: z
    .object({
      batch_buckets: z.array(z.number().int().positive()).min(1).max(16).optional(),
      length_buckets: z.array(z.number().int().positive()).min(1).max(16).optional(),
      strict: z.boolean().optional(),
    })
    .strict()
    .optional(),
  /**
   * Text generation on the worker's PyTorch: the bytes of prompt-prefix keys and values kept for
   * reuse (runtime/worker/tpu_worker/generation/prefix.py; 0 turns it off; counted in the load's
   * memory estimate) and the block size in tokens. Absent: 64 MiB in blocks of 16 tokens.
   */
  prefix_cache: z
    .object({
      max_bytes: z.number().int().min(0).optional(),
      block_tokens: z.number().int().min(1).max(1024).optional(),
    })
    .strict()
    .optional(),
});

export const CatalogSchema = z.object({
  model_roots: z.array(z.string()).min(1),
  models: z.array(CatalogEntrySchema).min(1),
});

export type CatalogEntry = z.infer<typeof CatalogEntrySchema>;
export type Catalog = z.infer<typeof CatalogSchema>;

export class CatalogError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "CatalogError";
  }
}

export function parseCatalog(raw: unknown, source = "catalog"): Catalog {
  const parsed = CatalogSchema.safeParse(raw);
  if (!parsed.success) {
    const problems = parsed.error.issues.map(
      (i) => `${i.path.join(".") || "(top level)"}: ${i.message}`,
    );
    throw new CatalogError(`invalid ${source}:\n  - ${problems.join("\n  - ")}`);
  }
  const ids = new Set<string>();
  for (const m of parsed.data.models) {
    if (ids.has(m.id)) throw new CatalogError(`invalid ${source}: duplicate model id ${m.id}`);
    ids.add(m.id);
    if (!m.dtypes.includes(m.default_dtype)) {
      throw new CatalogError(`invalid ${source}: ${m.id}.default_dtype must be one of its dtypes`);
    }
  }
  return parsed.data;
}

export function readCatalog(path: string): Catalog {
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(path, "utf8"));
  } catch (e) {
    throw new CatalogError(`cannot read the catalog file: ${(e as Error).message}`);
  }
  return parseCatalog(raw, `catalog file ${path}`);
}
