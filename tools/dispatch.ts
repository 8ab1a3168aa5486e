// The one path from a tools/call request to a handler: scope → input validation → cost estimate →
// the policy gate (approval, rate, budget, concurrency, timeout, audit) → handler → result.
// Failures come back as `isError` results with a stable code; only an unknown tool is a protocol
// fault (the server raises that before calling here).
import type { Logger } from "pino";
import type { z } from "zod";
import type { Gate, GateCall } from "../policies/gate.js";
import { canCall } from "../policies/scopes.js";
import { ERROR_CATALOGUE, ToolError, toToolError } from "./errors.js";
import { JOB_TOOLS } from "./registry.js";
import type { ToolContext, ToolDefinition, ToolPrincipal } from "./types.js";

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
  gate: Pick<Gate, "run">;
  /** Everything of ToolContext but signal/progress, which the dispatcher fills per call. */
  base: Omit<ToolContext, "signal" | "progress" | "principal">;
  signal: AbortSignal;
  progress: ToolContext["progress"];
  elicit?: Elicit;
  logger: Logger;
  /** Stamps for the bench's decomposition; absent unless tracing (tools/support/trace.ts). */
  trace?: ToolContext["trace"];
}

export const ERROR_META_KEY = "tpu-mcp/error";

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

export async function dispatchTool(input: DispatchInput): Promise<CallToolResultLike> {
  const { tool, principal, gate, logger, trace } = input;
  const t0 = performance.now();
  let outcome = "ok";
  try {
    const device = "default";
    if (!canCall(principal as any, tool.name)) {
      // The gate refuses and audits it; arguments are not even parsed for a caller without scope.
      await gate.run(
        { principal, tool: tool.name, args: {}, device, signal: input.signal },
        async () => {
          throw new ToolError("insufficient_scope", "not allowed");
        },
      );
    }
    const parsed = tool.input.safeParse(input.rawArgs ?? {});
    if (!parsed.success) {
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
    const args = parsed.data as Record<string, any>;
    trace?.mark("d.parsed");
    // "default" is the worker's own device: name it as explicit calls would, so both share a lane.
    const declared = tool.device ? tool.device(args) : undefined;
    const own = input.base.runtime.hello?.device;
    const lane = declared === "default" && own ? `${own.kind}:${own.index}` : declared;
    const asJob = JOB_TOOLS.has(tool.name) && args.wait === false;

    const ctxFor = (signal: AbortSignal, progress: ToolContext["progress"]): ToolContext => ({
      ...input.base,
      principal,
      signal,
      progress,
      ...(trace ? { trace } : {}),
    });
    const estimate = tool.estimate
      ? await tool.estimate(args, ctxFor(input.signal, input.progress))
      : undefined;
    trace?.mark("d.estimated");
    const call: GateCall = {
      principal,
      tool: tool.name,
      args,
      device: lane,
      estimate,
      signal: input.signal,
      elicit: input.elicit,
      trace,
    };

    let out: Record<string, unknown>;
    if (!asJob) {
      out = await gate.run(call, (signal) => tool.handler(args, ctxFor(signal, input.progress)));
    } else {
      // The job is created only once the gate admits the call, and holds its slot until it ends;
      // a refusal (approval, budget, busy) still comes back to this caller at once.
      out = await new Promise<Record<string, unknown>>((resolve, reject) => {
        const { signal: _callerSignal, ...detached } = call;
        gate
          .run(detached, async (gateSignal) => {
            const job = input.base.jobs.start(tool.name, principal.id, (jobSignal, progress) =>
              tool.handler(args, ctxFor(AbortSignal.any([gateSignal, jobSignal]), progress)),
            );
            resolve({
              job_id: job.job_id,
              status: job.status,
              message: `started; follow it with get_job (job_id ${job.job_id}), stop it with cancel_job`,
            });
            await input.base.jobs.settled(job.job_id);
            const rec = input.base.jobs.get(job.job_id, principal.id);
            if (rec?.status === "failed" && rec.error) {
              throw Object.assign(new Error(rec.error.message), { code: rec.error.code });
            }
          })
          .catch(reject);
      });
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
