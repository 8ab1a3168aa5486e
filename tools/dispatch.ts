// The one path from a tools/call request to a handler: scope → input validation (schema and every
// per-model bound; refusals audited and rate-counted) → the policy gate (rate, estimate, budget,
// approval, reservation, concurrency, deadline, audit) → handler, or a job for long work → result.
// Failures come back as `isError` results with a stable code; only an unknown tool is a protocol
// fault (the server raises that before calling here).
import type { Logger } from "pino";
import type { z } from "zod";
import type { CallDeadline, Gate, GateCall } from "../policies/gate.js";
import { ERROR_CATALOGUE, ToolError, toToolError } from "./errors.js";
import { JOB_TOOLS } from "./registry.js";
import type { ToolContext, ToolDefinition, ToolPrincipal, ToolServices } from "./types.js";

export type Elicit = NonNullable<GateCall["elicit"]>;

export interface CallToolResultLike {
  [k: string]: unknown;
  content: (
    | { type: "text"; text: string }
    | { type: "resource_link"; uri: string; name: string; mimeType?: string }
  )[];
  structuredContent?: Record<string, unknown>;
  isError?: boolean;
  _meta?: Record<string, unknown>;
}

export interface DispatchInput {
  tool: ToolDefinition<any, any>;
  rawArgs: unknown;
  principal: ToolPrincipal;
  gate: Pick<Gate, "run" | "enforceScope" | "refuse">;
  /** Everything of ToolContext but signal/progress, which the dispatcher fills per call. */
  base: ToolServices;
  signal: AbortSignal;
  progress: ToolContext["progress"];
  elicit?: Elicit;
  logger: Logger;
  /** Job tools still running after this many seconds answer with a job_id (0 or absent: never). */
  softDeadlineS?: number;
  /** Stamps for the bench's decomposition; absent unless tracing (tools/support/trace.ts). */
  trace?: ToolContext["trace"];
}

export const ERROR_META_KEY = "tpu-mcp/error";

/** The worker operation behind each device-bound tool (a pool places calls by it). */
const WORKER_OP: Record<string, string> = {
  load_model: "load",
  unload_model: "unload",
  run_inference: "infer",
  run_benchmark: "benchmark",
  check_model: "check",
};

function zodMessage(err: z.ZodError): string {
  return err.issues
    .slice(0, 5)
    .map((i) => `${i.path.length ? i.path.join(".") : "(arguments)"}: ${i.message}`)
    .join("; ");
}

export function errorResult(e: ToolError): CallToolResultLike {
  const recoverable = ERROR_CATALOGUE[e.code].recoverable;
  return {
    content: [{ type: "text", text: `error ${e.code}: ${e.message}` }],
    isError: true,
    _meta: {
      [ERROR_META_KEY]: {
        code: e.code,
        message: e.message,
        recoverable,
        ...(e.details ? { details: e.details } : {}),
      },
    },
  };
}

function successResult(
  tool: ToolDefinition<any, any>,
  out: Record<string, unknown>,
): CallToolResultLike {
  const content: CallToolResultLike["content"] = [{ type: "text", text: tool.render(out) }];
  // Resources named in the result are also linked, so clients can fetch them without parsing.
  const uris = new Set<string>();
  JSON.stringify(out, (_k, v) => {
    if (typeof v === "string" && v.startsWith("tpu://")) uris.add(v);
    return v;
  });
  for (const uri of uris)
    content.push({ type: "resource_link", uri, name: uri.slice("tpu://".length) });
  return { content, structuredContent: out };
}

/** Parses the raw arguments; an unknown model gets its own code naming the catalog ids. */
function parseArgs(input: DispatchInput): Record<string, any> {
  const parsed = input.tool.input.safeParse(input.rawArgs ?? {});
  if (parsed.success) return parsed.data as Record<string, any>;
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

export async function dispatchTool(input: DispatchInput): Promise<CallToolResultLike> {
  const { tool, principal, gate, logger, trace } = input;
  const t0 = performance.now();
  let outcome = "ok";
  try {
    // The one scope enforcer (audited); arguments are not even parsed for a caller without scope.
    gate.enforceScope(principal, tool.name);
    let args: Record<string, any>;
    try {
      args = parseArgs(input);
      // Every argument check and per-model bound, before any approval, job or worker call.
      tool.validate?.(args, input.base);
    } catch (e) {
      const err = toToolError(e);
      // Refusals of bad input are audited (digest only) and count against the rate limit.
      gate.refuse(principal, tool.name, input.rawArgs ?? {}, err.code, err.message);
      throw err;
    }
    trace?.mark("d.parsed");
    // Where the call runs, chosen once: the gate queues device tools on its lane, the handler
    // hands the same ticket to runtime.call, and the audit record names where it ran.
    const placement = input.base.runtime.place(WORKER_OP[tool.name] ?? tool.name, args);
    const lane = tool.device ? placement.lane : undefined;

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
      ...(deadline ? { deadline } : {}),
      ...(trace ? { trace } : {}),
    });
    const estimate = tool.estimate;
    const call: GateCall = {
      principal,
      tool: tool.name,
      args,
      device: lane,
      // Made only once the gate has admitted the caller (scope, rate): nothing before that
      // reaches the worker.
      ...(estimate
        ? { estimator: () => estimate(args, ctxFor(input.signal, input.progress)) }
        : {}),
      signal: input.signal,
      elicit: input.elicit,
      // The workers the call's runtime calls ran on, from the placement's receipt.
      ranOn: () => placement.ran().join(",") || undefined,
      trace,
    };

    const softMs = Math.round((input.softDeadlineS ?? 0) * 1000);
    const isJobTool = JOB_TOOLS.has(tool.name);
    let out: Record<string, unknown>;
    if (isJobTool && (args.wait === false || softMs > 0)) {
      out = await runAsJob(input, call, args, ctxFor, args.wait === false ? 0 : softMs);
    } else {
      out = await gate.run(call, (signal, deadline) =>
        tool.handler(args, ctxFor(signal, input.progress, deadline)),
      );
    }
    trace?.mark("d.gate_done");
    const res = successResult(tool, out);
    trace?.mark("d.result");
    return res;
  } catch (e) {
    const err = toToolError(e);
    outcome = err.code;
    if (err.code === "internal")
      logger.error({ err: e, tool: tool.name }, "tool failed unexpectedly");
    return errorResult(err);
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

/**
 * A job tool once the gate admits it. With wait: false (softMs 0) it becomes a job at once and
 * the job id is the answer. With wait: true the result is the answer if it comes within the soft
 * deadline; otherwise the running work is adopted by a new job and its id is the answer (the work
 * goes on; get_job has its progress and then its result). Until the caller holds a job id, its
 * cancellation or disconnect cancels the work: nobody could ever collect it. The work keeps the
 * gate's slot, reservation and deadline until it ends, and the gate audits how it ended; a
 * refusal (approval, budget, busy) still comes back to this caller at once.
 */
function runAsJob(
  input: DispatchInput,
  call: GateCall,
  args: Record<string, any>,
  ctxFor: (s: AbortSignal, p: ToolContext["progress"], d?: CallDeadline) => ToolContext,
  softMs: number,
): Promise<Record<string, unknown>> {
  const { tool, principal } = input;
  const jobs = input.base.jobs;
  // Mirrors the caller's signal only until the caller holds a job id.
  const callerCtl = new AbortController();
  let handedOut = false;
  const onCallerAbort = () => {
    if (!handedOut) callerCtl.abort(input.signal.reason);
  };
  if (input.signal.aborted) onCallerAbort();
  else input.signal.addEventListener("abort", onCallerAbort, { once: true });

  return new Promise<Record<string, unknown>>((resolve, reject) => {
    let answered = false;
    const answer = (fn: () => void) => {
      if (answered) return;
      answered = true;
      fn();
    };
    const handOut = (jobId: string, message: string) => {
      handedOut = true;
      input.signal.removeEventListener("abort", onCallerAbort);
      answer(() => resolve({ job_id: jobId, status: "running", message }));
    };

    input.gate
      .run({ ...call, signal: callerCtl.signal }, async (gateSignal, deadline) => {
        // cancel_job reaches the work through this controller once a job owns it.
        const jobCtl = new AbortController();
        let jobProgress: ToolContext["progress"] | undefined;
        const report: ToolContext["progress"] = (p, total, message) => {
          jobProgress?.(p, total, message);
          if (!handedOut) input.progress(p, total, message);
        };
        const adopt = (work: Promise<Record<string, unknown>>) =>
          jobs.start(tool.name, principal.id, (jobSignal, progress) => {
            jobProgress = progress;
            if (jobSignal.aborted) jobCtl.abort(jobSignal.reason);
            else
              jobSignal.addEventListener("abort", () => jobCtl.abort(jobSignal.reason), {
                once: true,
              });
            return work;
          });
        const signal = AbortSignal.any([gateSignal, jobCtl.signal]);
        // The handler starts on the next microtask, after a job (if any) has adopted it.
        const work = Promise.resolve().then(() =>
          tool.handler(args, ctxFor(signal, report, deadline)),
        );
        if (softMs === 0) {
          const job = adopt(work);
          handOut(
            job.job_id,
            `started; follow it with get_job (job_id ${job.job_id}), stop it with cancel_job`,
          );
        } else {
          const timer = setTimeout(() => {
            const job = adopt(work);
            handOut(
              job.job_id,
              `still running after ${softMs / 1000} s, so this call answers with a job instead of holding the request open; follow it with get_job (job_id ${job.job_id}), stop it with cancel_job`,
            );
          }, softMs);
          work.then(
            () => clearTimeout(timer),
            () => clearTimeout(timer),
          );
        }
        // The gate audits how the work ended, whoever collects it.
        return await work;
      })
      .then(
        (value) => answer(() => resolve(value)),
        (e) => answer(() => reject(e)),
      )
      .finally(() => input.signal.removeEventListener("abort", onCallerAbort));
  });
}
