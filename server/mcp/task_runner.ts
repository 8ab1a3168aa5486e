// A tools/call answered as an MCP Task: the call becomes a job of the job store (the same row
// get_job and cancel_job read), run through the same dispatch and gate as any call. A call that
// needs a human's approval waits in the job for an operator's decision (console, CLI, webhook,
// from any replica), its message saying so; the task view shows that wait as input_required.
import type { Principal } from "../../policies/scopes.js";
import type { ApprovalRecord } from "../../policies/approval_record.js";
import { dispatchTool, ERROR_META_KEY } from "../../tools/dispatch/dispatch.js";
import { ToolError, type ErrorCode } from "../../tools/errors.js";
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

/**
 * Starts `tool` as a job and returns its record at once. The job's result is the tool's
 * structured output, or it fails with the tool's error code, exactly as a job handed off by
 * dispatch would: get_job and the task methods read the same row.
 */
export function startTask(
  app: App,
  principal: Principal,
  tool: ToolDefinition<any, any>,
  rawArgs: Record<string, unknown> | undefined,
): Promise<JobRecord> {
  // The task is the job: a nested hand-off (wait: false) would make a second one.
  const args: Record<string, unknown> = { ...rawArgs };
  if (args.wait === false) delete args.wait;
  return app.jobs.start(tool.name, principal.id, async (signal, progress) => {
    for (;;) {
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
      const err = outcome.result._meta?.[ERROR_META_KEY] as {
        code: ErrorCode;
        message: string;
        details?: { approval_id?: unknown; status?: unknown };
      };
      const approvalId = err.details?.approval_id;
      // A pending approval an operator can decide out of band: the task waits for it, then
      // runs the call again with its id (the tool's own way to consume an approval).
      if (
        err.code === "approval_required" &&
        typeof approvalId === "string" &&
        err.details?.status === "pending" &&
        takesApprovalId(tool)
      ) {
        progress(0, undefined, awaitingMessage(approvalId, err.message));
        const decided = await decision(app, approvalId, signal);
        if (decided.status !== "approved")
          throw new ToolError(
            decided.status === "denied" ? "approval_declined" : "approval_required",
            `approval ${approvalId} was ${decided.status}; the call was not run`,
            { approval_id: approvalId },
          );
        progress(0, undefined, `approval ${approvalId} granted; starting`);
        args.approval_id = approvalId;
        continue;
      }
      throw new ToolError(err.code, err.message, err.details as Record<string, unknown>);
    }
  });
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
