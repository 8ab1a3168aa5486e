// What a tool is and what it receives. Handlers get their dependencies through ToolContext;
// nothing is built at module scope.
import type { Logger } from "pino";
import type { z } from "zod";
import type { CostEstimate } from "../policies/estimate.js";
import type { Principal } from "../policies/scopes.js";
import type { Catalog } from "../runtime/catalog.js";
import type { CallTrace, Runtime } from "../runtime/types.js";
import type { Jobs } from "./support/jobs.js";
import type { Outputs } from "./support/outputs.js";
import type { Reports } from "./support/reports.js";
import type { ModelFacts } from "./support/facts.js";

export type ToolPrincipal = Principal;

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
  benchmark: { max_configs: number; max_iterations: number; max_duration_s: number };
}

/** Static things a tool's schema is built from. */
export interface ToolEnv {
  catalog: Catalog;
  limits: Limits;
}

export interface ElicitAnswer {
  action: "accept" | "decline" | "cancel";
}

/** Per-call context: who calls, what they may reach, and the services behind them. */
export interface ToolContext {
  principal: ToolPrincipal;
  runtime: Runtime;
  jobs: Jobs;
  outputs: Outputs;
  reports: Reports;
  facts: ModelFacts;
  env: ToolEnv;
  logger: Logger;
  signal: AbortSignal;
  /** Sends a progress notification when the client asked for them; no-op otherwise. */
  progress: (progress: number, total?: number, message?: string) => void;
  /** Stamps for the bench's decomposition when tracing is on for this call. */
  trace?: CallTrace;
}

export interface ToolDefinition<I extends z.ZodType = z.ZodType, O extends z.ZodType = z.ZodType> {
  name: string;
  title: string;
  description: string;
  input: I;
  output: O;
  annotations: ToolAnnotations;
  /** The device lane the call occupies (loads and benchmarks hold it exclusively). */
  device?: (args: z.infer<I>) => string;
  /** A cost estimate for the gate (approval rules, budgets, memory refusals). */
  estimate?: (args: z.infer<I>, ctx: ToolContext) => Promise<CostEstimate | undefined>;
  handler: (args: z.infer<I>, ctx: ToolContext) => Promise<z.infer<O>>;
  /** A short human rendering of the structured result. */
  render: (out: z.infer<O>) => string;
}

export function defineTool<I extends z.ZodType, O extends z.ZodType>(
  def: ToolDefinition<I, O>,
): ToolDefinition<I, O> {
  return def;
}
