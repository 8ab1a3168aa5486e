// A tools/call answered as an MCP Task: the call becomes a job of the job store (the same row
// get_job and cancel_job read), run through the same dispatch and gate as any call. A call that
// needs a human's approval waits in the job for an operator's decision (console, CLI, webhook,
// from any replica), its message saying so; the task view shows that wait as input_required.
import type { Principal } from "../../policies/scopes.js";
import type { ApprovalRecord } from "../../policies/approval_record.js";
import { dispatchTool, ERROR_META_KEY } from "../../tools/dispatch/dispatch.js";
import type { JobHandOff } from "../../tools/dispatch/jobs.js";
import { errorResult } from "../../tools/dispatch/result.js";
import { ToolError, toToolError, type ErrorCode } from "../../tools/errors.js";
import type { JobRecord } from "../../tools/stores/jobs.js";
import type { ToolDefinition } from "../../tools/types.js";
import { takesApprovalId } from "../../tools/support/approvable.js";
import { toolServices, type App } from "../app/app.js";

/** How often a waiting task looks at its approval (the store is shared by every replica). */
const APPROVAL_POLL_MS = 500;

const AWAITING = /^waiting for approval (apr_[A-Za-z0-9_-]+)\b/;

/** The job message of a task waiting for an operator's decision (get_job shows it as is). */
export function awaitingMessage(approvalId: string, how: string): string {
  return `waiting for approval ${approvalId}: ${how}`;
}

/** The approval a running job waits for, read back from its message (undefined: none). */
export function awaitingApproval(job: Pick<JobRecord, "status" | "message">): string | undefined {
  return job.status === "running" ? AWAITING.exec(job.message ?? "")?.[1] : undefined;
}

/** An approval an operator decides out of band, which a task may wait for. */
export interface PendingApproval {
  approvalId: string;
  /** Who decides it and how (the task's statusMessage while it waits). */
  how: string;
}

/**
 * The pending approval an approval_required answer names, when a task can wait for it: the tool
 * consumes an approval by id, and the approval is still pending (undefined otherwise).
 */
export function pendingApproval(
  tool: ToolDefinition<any, any>,
  result: { _meta?: Record<string, unknown> },
): PendingApproval | undefined {
  const err = result._meta?.[ERROR_META_KEY] as
    { code?: string; details?: Record<string, unknown> } | undefined;
  const d = err?.details;
  if (err?.code !== "approval_required" || !d || !takesApprovalId(tool)) return undefined;
  if (typeof d.approval_id !== "string" || d.status !== "pending") return undefined;
  const where = typeof d.approval_url === "string" ? ` (${d.approval_url})` : "";
  const how =
    d.assurance === "passkey"
      ? `an operator approves it with their passkey in the console${where}`
      : typeof d.approve_command === "string"
        ? `an operator approves it with \`${d.approve_command}\`${where ? ` or in the console${where}` : ""}`
        : `an operator approves it in the console${where}`;
  return { approvalId: d.approval_id, how: `${how}; this task then runs the call` };
}

/**
 * Starts `tool` as a job and returns its record at once. The job's result is the tool's
 * structured output, or it fails with the tool's error code, exactly as a job handed off by
 * dispatch would: get_job and the task methods read the same row. `awaiting`: the call already
 * answered approval_required for this approval, so the job starts by waiting for its decision.
 */
export function startTask(
  app: App,
  principal: Principal,
  tool: ToolDefinition<any, any>,
  rawArgs: Record<string, unknown> | undefined,
  awaiting?: PendingApproval,
): Promise<JobRecord> {
  return app.jobs.start(tool.name, principal.id, (signal, progress) =>
    runTask(app, principal, tool, rawArgs, signal, progress, awaiting),
  );
}

/**
 * A task's work inside its job: the call through dispatch and the gate; a pending approval an
 * operator decides out of band (console, CLI, any replica) is waited for, then the call runs
 * again with its id (how a tool consumes one). Also what a job handed off at the bound does when
 * the gate then answers approval_required (tools/dispatch/jobs.ts afterRefusal).
 */
export async function runTask(
  app: App,
  principal: Principal,
  tool: ToolDefinition<any, any>,
  rawArgs: Record<string, unknown> | undefined,
  signal: AbortSignal,
  progress: (p: number, total?: number, message?: string) => void,
  awaiting?: PendingApproval,
): Promise<Record<string, unknown>> {
  // The task is the job: a nested hand-off (wait: false) would make a second one.
  const args: Record<string, unknown> = { ...rawArgs };
  if (args.wait === false) delete args.wait;
  let pending = awaiting;
  for (;;) {
    if (pending) {
      const { approvalId } = pending;
      progress(0, undefined, awaitingMessage(approvalId, pending.how));
      const decided = await decision(app, approvalId, signal);
      if (decided.status !== "approved")
        throw new ToolError(
          decided.status === "denied" ? "approval_declined" : "approval_required",
          `approval ${approvalId} was ${decided.status}; the call was not run`,
          { approval_id: approvalId },
        );
      progress(0, undefined, `approval ${approvalId} granted; starting`);
      args.approval_id = approvalId;
      pending = undefined;
    }
    const outcome = await dispatchTool({
      tool,
      rawArgs: args,
      principal,
      gate: app.gate,
      base: toolServices(app),
      signal,
      progress,
      logger: app.logger,
      softDeadlineS: 0,
    });
    if (outcome.kind === "result") return outcome.result.structuredContent ?? {};
    if (outcome.kind === "input_required")
      throw new ToolError("internal", "an in-band question reached a task");
    pending = pendingApproval(tool, outcome.result);
    if (pending) continue;
    const err = outcome.result._meta?.[ERROR_META_KEY] as {
      code: ErrorCode;
      message: string;
      details?: Record<string, unknown>;
    };
    throw new ToolError(err.code, err.message, err.details);
  }
}

/**
 * For a call that may become a task: when the gate answers approval_required after the call was
 * handed to its job (the bound passed while it was queued or estimated), the job waits for the
 * operator's decision, as a task started at once would, instead of failing.
 */
export function waitOutApproval(
  app: App,
  principal: Principal,
  tool: ToolDefinition<any, any>,
  rawArgs: Record<string, unknown> | undefined,
): NonNullable<JobHandOff["afterRefusal"]> {
  return (e, signal, progress) => {
    const pending = pendingApproval(tool, errorResult(toToolError(e)));
    return pending ? runTask(app, principal, tool, rawArgs, signal, progress, pending) : undefined;
  };
}

/** Resolves with the approval once it is no longer pending; rejects when `signal` aborts. */
async function decision(
  app: App,
  approvalId: string,
  signal: AbortSignal,
): Promise<ApprovalRecord> {
  for (;;) {
    signal.throwIfAborted();
    const rec = await app.approvals.get(approvalId);
    if (!rec) throw new ToolError("approval_required", `approval ${approvalId} is gone`);
    if (rec.status !== "pending") return rec;
    await new Promise<void>((resolve) => {
      const t = setTimeout(done, APPROVAL_POLL_MS);
      function done() {
        clearTimeout(t);
        signal.removeEventListener("abort", done);
        resolve();
      }
      signal.addEventListener("abort", done, { once: true });
    });
  }
}
