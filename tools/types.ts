// What a tool is and what it receives. Handlers get their dependencies through ToolContext;
// nothing is built at module scope.
import type { Logger } from "pino";
import type { z } from "zod";
import type { CostEstimate } from "../policies/estimate.js";
import type { CallDeadline } from "../policies/gate/gate.js";
import type { Principal } from "../policies/scopes.js";
import type { ToolPolicy } from "../policies/tool_policy.js";
import type { Catalog } from "../runtime/catalog.js";
import type { KeptModels } from "./stores/kept.js";
import type { CallTrace, FleetState, Placement, Runtime } from "../runtime/types.js";
import type { Jobs } from "./stores/jobs.js";
import type { Outputs } from "./stores/outputs.js";
import type { Reports } from "./stores/reports.js";
import type { ModelFactStore } from "./stores/facts.js";
import type { EstimatedWork } from "./support/estimate.js";
import type { PricingConfig } from "../policies/limits/pricing.js";

export interface ToolAnnotations {
  title?: string;
  readOnlyHint: boolean;
  destructiveHint: boolean;
  idempotentHint: boolean;
  openWorldHint: boolean;
}

export interface Limits {
  max_texts: number;
  inline_max_elements: number;
  max_tensor_elements: number;
  /** Every principal shares one prefix cache partition (config inference.prefix_cache_shared). */
  prefix_cache_shared?: boolean;
  /** The one source of the benchmark bounds: schemas, handler checks and the worker read these. */
  benchmark: {
    max_configs: number;
    max_iterations: number;
    max_duration_s: number;
    max_warmup: number;
  };
}

/** What this deployment runs, known at start-up: a published schema names only what it has. */
export interface Deployment {
  /** A pool of workers rather than the default single worker. */
  pool: boolean;
  /** A Ray fleet (runtime.ray) adds workers to the pool. */
  fleet: boolean;
  /** An installed package that sets itself up on first start (server/setup/); false from a clone. */
  setup?: boolean;
}

/**
 * An installed package's first set-up (the Python environment and the model files, made in the
 * background by `tpu-mcp setup`), as get_runtime_status shows it.
 */
export interface SetupProgress {
  state: "running" | "done" | "failed";
  /** What it is doing now ("installing Python packages", "converting smollm2-135m-instruct"). */
  step: string;
  percent: number;
  /** Its last line of output. */
  message: string;
  /** The file with its whole output. */
  log: string;
  /** Why it failed (state "failed"). */
  error: string | null;
}

/** The replica that answers a call (built by server/app/replica.ts). */
export interface ReplicaStatus {
  /** Its name: jobs' owner in the shared store, the `replica` metrics label. */
  id: string;
  /** Where the shared state lives: one SQLite server, or replicas on one Postgres. */
  storage: "sqlite" | "postgres";
  /**
   * True when it shares its store with other replicas but reaches workers of its own (local
   * processes, its Ray driver's actors): what those hold and queue is its alone, a shard. False
   * on a shared store when every worker is a shared remote one (`tpu_worker serve`).
   */
  shard: boolean;
  note: string;
}

/** Static things a tool's schema is built from. */
export interface ToolEnv {
  catalog: Catalog;
  limits: Limits;
  /** The `pricing` config: reports show device time in money too; absent without it. */
  pricing?: PricingConfig;
  /** Absent (a tool built without a server): every optional part is published. */
  deployment?: Deployment;
  /** Kept fine-tune results (tools/stores/kept.ts); absent: nothing can be kept. */
  kept?: KeptModels;
}

/** Per-call context: who calls, what they may reach, and the services behind them. */
export interface ToolContext {
  principal: Principal;
  runtime: Runtime;
  /** The Ray fleet behind the pool (runtime.ray); absent without one. */
  fleet?: () => FleetState;
  /** A package install's set-up while it has not finished; absent from a clone. */
  setup?: () => SetupProgress | null;
  /** Which replica answers, and whether it is a shard (server/app/replica.ts); absent without a server. */
  replica?: () => ReplicaStatus;
  /** Where this call runs, chosen once before the gate (pass it to runtime.call). */
  placement?: Placement;
  jobs: Jobs;
  outputs: Outputs;
  reports: Reports;
  facts: ModelFactStore;
  env: ToolEnv;
  logger: Logger;
  signal: AbortSignal;
  /** The gate's deadline for this call; handlers pass its remainder to runtime.call as timeoutMs. */
  deadline?: CallDeadline;
  /** Sends a progress notification when the client asked for them; no-op otherwise. */
  progress: (progress: number, total?: number, message?: string) => void;
  /** The caller asked for progress notifications (an MCP progressToken): generated text streams. */
  progressRequested?: boolean;
  /** Stamps for the bench's decomposition when tracing is on for this call. */
  trace?: CallTrace;
  /** Takes the work a call's estimate saw, so what the call then takes is kept with it. */
  onWork?: (work: EstimatedWork) => void;
}

/** The long-lived services of a ToolContext, without anything per call. */
export type ToolServices = Omit<
  ToolContext,
  "signal" | "progress" | "progressRequested" | "principal" | "deadline" | "placement" | "onWork"
>;

export interface ToolDefinition<I extends z.ZodType = z.ZodType, O extends z.ZodType = z.ZodType> {
  /** The tool's name: its policy record's (one spelling). */
  name: string;
  /** What the server and its policies know of the tool: scope, worker op, job, lane, defaults. */
  policy: ToolPolicy;
  title: string;
  description: string;
  input: I;
  /** Every answer is checked against this before it is sent (tools/dispatch/result.ts). */
  output: O;
  /**
   * The output schema tools/list publishes, when this deployment has less than `output` names
   * (no pool fields without a pool); absent: `output`.
   */
  listedOutput?: z.ZodType;
  /** The input schema tools/list publishes, without arguments only a pool has; absent: `input`. */
  listedInput?: z.ZodType;
  annotations: ToolAnnotations;
  /**
   * Every check of the arguments beyond the schema (per-model bounds, grid size, ...). Runs
   * before the gate: nothing that can never run becomes an approval request or a job.
   */
  validate?: (args: z.infer<I>, services: ToolServices) => void | Promise<void>;
  /** A cost estimate for the gate (approval rules, budgets, memory refusals). */
  estimate?: (args: z.infer<I>, ctx: ToolContext) => Promise<CostEstimate | undefined>;
  handler: (args: z.infer<I>, ctx: ToolContext) => Promise<z.infer<O>>;
  /** An MCP App view (a ui:// resource) that renders this tool's results, for clients with the extension. */
  ui?: { resourceUri: string };
  /** A short human rendering of the structured result. */
  render: (out: z.infer<O>) => string;
}

/**
 * One tool file: its policy record, which the config schema needs before any catalog is read,
 * and how to build the tool once the catalog and limits are known.
 */
export interface ToolFile {
  policy: ToolPolicy;
  build: (env: ToolEnv) => ToolDefinition<any, any>;
}

export function defineTool<I extends z.ZodType, O extends z.ZodType>(
  policy: ToolPolicy,
  def: Omit<ToolDefinition<I, O>, "name" | "policy">,
): ToolDefinition<I, O> {
  return { ...def, name: policy.name, policy };
}
