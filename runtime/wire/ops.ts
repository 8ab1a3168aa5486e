// The worker's operations as a typed table: for each `request.op`, the args it takes and the
// result it answers with (runtime/PROTOCOL.md, "Operations", says the same in prose; the Python
// side is tpu_worker/ops.py). `Runtime.call` is keyed by this table, so a misspelt op or
// argument is a compile error instead of a worker's invalid_argument. Results list the fields
// the server reads; the worker may send more, and the big benchmark/check rows stay open records
// (their fields are the worker's report, passed through to the tool's output schema).
import type { DeviceInfo, ProbeStep } from "../types.js";

export type MatmulPrecision = "medium" | "high" | "highest";

/** One model as `status` lists it (`loaded`); the pool adds the worker that holds it. */
export interface LoadedEntry {
  model: string;
  device: string;
  dtype: string;
  mode: string;
  parameters?: number;
  bytes_on_device?: number;
  queue_depth: number;
  batching?: Record<string, unknown>;
  loaded_at?: string;
  /** When status is asked for it: sha256 of the weights in memory now. */
  weights_checksum?: string;
  /** Added by a pool of several workers. */
  worker?: string;
  [k: string]: unknown;
}

/** A device as `status` reports it: DeviceInfo with its current free memory, and more. */
export type StatusDevice = DeviceInfo & Record<string, unknown>;

export interface StatusResult {
  device: StatusDevice | null;
  devices: StatusDevice[];
  probe?: ProbeStep[];
  torch_version: string | null;
  backend_version: string | null;
  execution_mode: string | null;
  eager_mode?: string | null;
  matmul_precision: string | null;
  loaded: LoadedEntry[];
  /** Model libraries imported so far (["transformers"]): a first load needing one imports it. */
  libraries?: string[];
  /** Models built since the worker started: 0 means the next load is its first (a cold load). */
  models_built?: number;
  rss_bytes?: number;
  uptime_s?: number;
  worker_version?: string;
  pid?: number;
  /** Added by a pool of several workers: every worker's state (WorkerStatus). */
  workers?: unknown[];
}

/** A catalog model as `describe` reports it (what the server's model facts read). */
export interface DescribedModel {
  id: string;
  task: string;
  architecture: string;
  parameters: number | null;
  weight_bytes: number | null;
  weight_digest: string | null;
  available: boolean;
  problem: string | null;
  loaded: boolean;
  [k: string]: unknown;
}

export interface LoadArgs {
  model: string;
  device?: string;
  dtype?: string;
  mode?: "eager" | "compile";
  warmup_shapes?: Array<{ batch: number; seq_len?: number }>;
  batching?: boolean;
  matmul_precision?: MatmulPrecision;
  /** The pool's, not the worker's: load on this many workers (a pool of several only). */
  replicas?: number;
}

export interface LoadResult {
  model: string;
  device: string;
  dtype: string;
  mode: string;
  parameters: number;
  bytes_on_device: number;
  estimated_bytes?: number;
  load_s: number;
  compile_s: number;
  warmup_s: number;
  /** This process's float32 matmul precision; absent for a model an engine (vLLM) serves. */
  matmul_precision?: string;
  matmul_precision_requested?: string | null;
  compile_backend?: string | null;
  compile_dynamic?: boolean | null;
  execution_mode?: string;
  eager_mode?: string | null;
  batching?: Record<string, unknown>;
  /** Added by a pool of several workers: where each replica went. */
  placement?: Array<{ worker: string; device: string; bytes_on_device: number }>;
  replica_errors?: Array<{ worker: string; error: string }>;
}

/** The generation arguments of `infer` (runtime/PROTOCOL.md, `infer`; docs/tools.md, "Generation"), all optional; the tools check
 * and pass them under these names (tools/support/generation.ts). */
export interface GenerationArgs {
  /** One conversation, rendered with the model's chat template (instead of texts). */
  messages?: Array<{
    role: string;
    content: string;
    tool_calls?: Array<{ id: string; name: string; arguments: Record<string, unknown> }>;
    tool_call_id?: string;
  }>;
  /** Functions the model may call (tools/support/tool_calls.ts), and which. */
  tools?: Array<{
    type: "function";
    function: { name: string; description?: string; parameters?: Record<string, unknown> };
  }>;
  tool_choice?: "auto" | "none" | "required" | { type: "function"; function: { name: string } };
  max_new_tokens?: number;
  temperature?: number;
  top_p?: number;
  top_k?: number;
  seed?: number;
  stop?: string[];
  logprobs?: number;
  /** Structured output (tools/support/generation.ts responseFormatInput). */
  response_format?: {
    type: "json_schema" | "json_object" | "regex" | "choice";
    json_schema?: { name?: string; schema: Record<string, unknown>; strict?: boolean };
    schema?: Record<string, unknown>;
    pattern?: string;
    choices?: string[];
  };
}

export interface InferArgs extends GenerationArgs {
  model: string;
  texts?: string[];
  /** Set by the server when the MCP caller sent a progress token: progress messages carry deltas. */
  stream?: boolean;
  seq_len?: number;
  /** The caller's prefix cache partition (tools/support/generation.ts prefixKey). */
  prefix_key?: string;
}

export interface InferResult {
  task: string;
  model?: string;
  shape?: number[];
  texts?: string[];
  new_tokens?: number[];
  /** Text generation: one per prompt (runtime/PROTOCOL.md, `infer`); see tools/support/generation.ts. */
  generations?: unknown[];
  seed?: number;
  ttft_ms?: number;
  /** Where ttft_ms went (the decode loop; absent for other models and engines). */
  ttft_parts?: TtftParts;
  tokens_per_s?: number | null;
  /** With a response_format: the grammar's compile time in the worker. */
  grammar_compile_ms?: number;
  /** Prompt tokens taken from the prefix cache, all prompts together. */
  prefix_cached_tokens?: number;
  labels?: string[];
  scores?: number[];
  outputs?: Array<{ name: string }>;
  batched_with?: number;
  batch_items?: number;
  seq_bucket?: number;
}

export interface BenchmarkArgs {
  model: string;
  device?: string;
  batch_sizes: number[];
  seq_lens?: number[];
  dtypes: string[];
  modes: string[];
  scenario: string;
  work?: string;
  iterations?: number;
  duration_s?: number;
  warmup: number;
  max_new_tokens?: number;
  /** Work "generate": sampling (greedy when absent) and its seed. */
  temperature?: number;
  seed?: number;
  /** Work "train_step": the optimizer of every step. */
  optimizer?: "adamw" | "sgd";
  matmul_precision?: MatmulPrecision;
  /** An unstable configuration runs up to this many times its requested window (1: never). */
  extend_factor: number;
  /** The server's bounds, fully resolved: the worker has no defaults of its own. */
  limits: {
    max_configs: number;
    max_iterations: number;
    max_duration_s: number;
    max_warmup: number;
    min_seq_len: number;
  };
}

/**
 * The worker's own report (a benchmark configuration row, a check's findings), passed through
 * to the tool's output unchanged: PROTOCOL.md lists its fields, and the tool's output schema
 * (the one typed description of them) validates them on the way out. Deliberately untyped here,
 * so that there is one list of those fields, not two.
 */
export type ReportRow = any;

export interface BenchmarkResult {
  /** Versions, device (`device_kind`), threads, seed, catalog id, weight digest. */
  manifest: { device_kind?: string; [k: string]: unknown };
  /** One row per configuration. */
  configs: ReportRow[];
  cancelled: boolean;
  /** The gate stopped it (cancel with a reason): `configs` are what it measured until then. */
  stopped?: "budget" | "timeout" | "approval";
  offline_skipped_batches?: number[];
}

export interface CheckArgs {
  model: string;
  device?: string;
  dtype?: string;
  batch?: number;
  seq_len?: number;
  attention?: "default" | "math";
}

/** `{ model, device, dtype, batch, seq_len, ops, verdict, … }`, see ReportRow. */
export type CheckResult = ReportRow;

export interface SelftestResult {
  device: string;
  name: string;
  execution_mode: string;
  compile_backend: string | null;
  steps: Array<{ step: string; ok: boolean; detail: string; seconds: number }>;
}

type NoArgs = Record<string, never>;

/** Every op: its args and its result. */
export interface WorkerOps {
  describe: { args: NoArgs; result: { models: DescribedModel[] } };
  status: { args: { weights_checksum?: boolean }; result: StatusResult };
  load: { args: LoadArgs; result: LoadResult };
  unload: {
    args: { model: string; device?: string };
    /** `workers`: added by a pool of several workers (every replica unloaded). */
    result: { model: string; freed_bytes: number; workers?: string[] };
  };
  infer: { args: InferArgs; result: InferResult };
  selftest: { args: NoArgs; result: SelftestResult };
  benchmark: { args: BenchmarkArgs; result: BenchmarkResult };
  check: { args: CheckArgs; result: CheckResult };
  /** Re-reads the worker's catalog file: new models are added; changed and removed ones are
   *  only named (a restart applies them). `workers`: added by a pool (one answer per worker). */
  reload_catalog: {
    args: NoArgs;
    result: ReloadCatalogResult & { workers?: Array<ReloadCatalogResult & { worker: string }> };
  };
  shutdown: { args: NoArgs; result: Record<string, never> };
}

export interface ReloadCatalogResult {
  added: string[];
  changed: string[];
  removed: string[];
}

export type OpName = keyof WorkerOps;
export type OpArgs<O extends OpName> = WorkerOps[O]["args"];
export type OpResult<O extends OpName> = WorkerOps[O]["result"];

/** Where a generation's time to first token went, as the decode loop reports it. */
export interface TtftParts {
  queue_ms: number;
  behind_ms: number;
  prefill_ms: number;
  steps_waited: number;
  forwards_ahead: number;
  prefill_shape: string | null;
}
