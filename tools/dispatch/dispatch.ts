// The one path from a tools/call request to a handler: scope → input validation (schema and every
// per-model bound; refusals audited and rate-counted) → the policy gate (rate, estimate, budget,
// approval, reservation, concurrency, deadline, audit) → handler, or a job for long work → outcome.
// The outcome is a result, an `isError` result with a stable code, or (2026-07-28 era) the
// question a call needing the user's approval answers with; only an unknown tool is a protocol
// fault (the server raises that before calling here).
import type { Logger } from "pino";
import type { z } from "zod";
import {
  InputRequired,
  type CallDeadline,
  type ElicitPrompt,
  type Gate,
  type GateCall,
} from "../../policies/gate/gate.js";
import type { Principal } from "../../policies/scopes.js";
import { ToolError, toToolError, type ErrorCode } from "../errors.js";
import { measured, type EstimatedWork } from "../support/estimate.js";
import type { ToolContext, ToolDefinition, ToolServices } from "../types.js";
import { runAsJob, type JobHandOff } from "./jobs.js";
import { KEPT_ID } from "../stores/kept.js";
import { checkOutput, errorResult, successResult, type CallToolResultLike } from "./result.js";

export { ERROR_META_KEY, type CallToolResultLike } from "./result.js";

export type Elicit = NonNullable<GateCall["elicit"]>;

/** How a call ended, for the surface that answers it. */
export type DispatchOutcome =
  /** handedOff: a job tool's call answered by its job (`asked`: the caller said wait: false). */
  | { kind: "result"; result: CallToolResultLike; handedOff?: { jobId: string; asked: boolean } }
  | { kind: "error"; code: ErrorCode; result: CallToolResultLike }
  /** Not run: the user must answer `prompt` in the client, whose retry echoes `state`. */
  | { kind: "input_required"; approvalId: string; prompt: ElicitPrompt; state: string };

export interface DispatchInput {
  tool: ToolDefinition<any, any>;
  rawArgs: unknown;
  principal: Principal;
  gate: Pick<Gate, "run" | "enforceScope" | "refuse">;
  /** Everything of ToolContext but signal/progress, which the dispatcher fills per call. */
  base: ToolServices;
  signal: AbortSignal;
  progress: ToolContext["progress"];
  /** The caller sent a progress token: `progress` reaches it (a generation then streams). */
  progressRequested?: boolean;
  elicit?: Elicit;
  /** The 2026-07-28 era's in-band approval round (policies/gate/types.ts InBandApproval). */
  inBand?: GateCall["inBand"];
  logger: Logger;
  /**
   * Job tools not done this many seconds after the request arrived (queued or waiting for an
   * approval included) answer with a job_id (0 or absent: never).
   */
  softDeadlineS?: number;
  /** Stamps for the bench's decomposition; absent unless tracing (tools/support/trace.ts). */
  trace?: ToolContext["trace"];
  /** A job's way past a gate refusal that came after the hand-off (jobs.ts JobHandOff). */
  afterRefusal?: JobHandOff["afterRefusal"];
}

function zodMessage(err: z.ZodError): string {
  return err.issues
    .slice(0, 5)
    .map((i) => `${i.path.length ? i.path.join(".") : "(arguments)"}: ${i.message}`)
    .join("; ");
}

/**
 * Parses the raw arguments; an unknown model gets its own code naming the catalog ids. A kept
 * fine-tune's id is accepted for its owner only (checked as its base model's arguments); for
 * anyone else it is an unknown model, so its existence does not leak.
 */
function parseArgs(input: DispatchInput): Record<string, any> {
  const raw = (input.rawArgs ?? {}) as Record<string, unknown>;
  const model = typeof raw.model === "string" ? raw.model : undefined;
  const kept =
    model && KEPT_ID.test(model)
      ? input.base.env.kept?.owned(model, input.principal.id)
      : undefined;
  const parsed = input.tool.input.safeParse(kept ? { ...raw, model: kept.base } : raw);
  if (parsed.success)
    return kept ? { ...(parsed.data as object), model } : (parsed.data as Record<string, any>);
  const unknownModel = parsed.error.issues.find(
    (i: z.core.$ZodIssue) =>
      i.path.length === 1 &&
      i.path[0] === "model" &&
      typeof (input.rawArgs as any)?.model === "string",
  );
  if (unknownModel) {
    const ids = input.base.env.catalog.models.map((m) => m.id).join(", ");
    throw new ToolError(
      "unknown_model",
      `model: not in the catalog; call list_models (ids: ${ids})`,
    );
  }
  throw new ToolError("invalid_argument", zodMessage(parsed.error));
}

export async function dispatchTool(input: DispatchInput): Promise<DispatchOutcome> {
  const { tool, principal, gate, logger, trace } = input;
  const t0 = performance.now();
  let outcome = "ok";
  try {
    // Scope is the gate's first step, in gate.refuse (bad arguments) or gate.run: one audited check.
    let args: Record<string, any>;
    try {
      args = parseArgs(input);
      // Every argument check and per-model bound, before any approval, job or worker call.
      await tool.validate?.(args, input.base);
    } catch (e) {
      const err = toToolError(e);
      // Refusals of bad input are audited (digest only) and count against the rate limit.
      await gate.refuse(principal, tool.name, input.rawArgs ?? {}, err.code, err.message, trace);
      throw err;
    }
    trace?.mark("d.parsed");
    // Where the call runs, chosen once: the gate queues device tools on its lane, the handler
    // hands the same ticket to runtime.call, and the audit record names where it ran.
    const placement = input.base.runtime.place(tool.policy.workerOp ?? tool.name, args);
    const lane = tool.policy.deviceMode ? placement.lane : undefined;

    const ctxFor = (
      signal: AbortSignal,
      progress: ToolContext["progress"],
      deadline?: CallDeadline,
    ): ToolContext => ({
      ...input.base,
      principal,
      placement,
      signal,
      progress,
      ...(input.progressRequested ? { progressRequested: true } : {}),
      ...(deadline ? { deadline } : {}),
      ...(trace ? { trace } : {}),
    });
    const estimate = tool.estimate;
    // The work the estimate saw, kept with what the call then takes: the next estimate learns.
    let work: EstimatedWork | undefined;
    const call: GateCall = {
      principal,
      tool: tool.name,
      args,
      device: lane,
      // Made only once the gate has admitted the caller (scope, rate): nothing before that
      // reaches the worker.
      ...(estimate
        ? {
            estimator: (signal?: AbortSignal) =>
              estimate(args, {
                ...ctxFor(signal ?? input.signal, input.progress),
                onWork: (w) => (work = w),
              }),
          }
        : {}),
      // The kind the estimate read (pricing prices the estimate by it).
      deviceKind: () => work?.device,
      signal: input.signal,
      elicit: input.elicit,
      inBand: input.inBand,
      // The workers the call's runtime calls ran on, from the placement's receipt.
      ranOn: () => placement.ran().join(",") || undefined,
      trace,
    };

    const metered: ToolDefinition<any, any> = {
      ...tool,
      handler: (a, ctx) =>
        measured(
          () => work,
          ctx,
          () => tool.handler(a, ctx),
        ),
    };
    const softMs = Math.round((input.softDeadlineS ?? 0) * 1000);
    let out: Record<string, unknown> | InputRequired;
    let handedOff: { jobId: string; asked: boolean } | undefined;
    if (tool.policy.job && (args.wait === false || softMs > 0)) {
      out = await runAsJob({ ...input, tool: metered }, call, args, ctxFor, {
        atStart: args.wait === false,
        softMs,
        arrivedAt: t0,
        onHandOut: (jobId) => (handedOff = { jobId, asked: args.wait === false }),
        afterRefusal: input.afterRefusal,
      });
    } else {
      out = await gate.run(call, (signal, deadline) =>
        metered.handler(args, ctxFor(signal, input.progress, deadline)),
      );
    }
    trace?.mark("d.gate_done");
    if (out instanceof InputRequired) {
      outcome = out.kind;
      return { kind: out.kind, approvalId: out.approvalId, prompt: out.prompt, state: out.state };
    }
    const res = successResult(tool, checkOutput(tool, out, logger));
    trace?.mark("d.result");
    return { kind: "result", result: res, ...(handedOff ? { handedOff } : {}) };
  } catch (e) {
    const err = toToolError(e);
    outcome = err.code;
    // A drifted output (checkOutput) was logged with its fields already.
    if (err.code === "internal" && !(e instanceof ToolError))
      logger.error({ err: e, tool: tool.name }, "tool failed unexpectedly");
    return { kind: "error", code: err.code, result: errorResult(err) };
  } finally {
    logger.info(
      {
        tool: tool.name,
        principal: principal.id,
        outcome,
        duration_ms: Math.round(performance.now() - t0),
      },
      "tool call",
    );
  }
}
