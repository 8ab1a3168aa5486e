// The supervisor of an admitted call: it records the admission, starts the work under one
// deadline (the tool's timeout, or sooner what is left of a capped budget line: the read
// allowance), races it against that deadline and the caller's cancellation, settles the slot and
// the measured charge when the work really ends (which may be after a timed-out caller got its
// answer), and records how the call ended.

import type { AuditRecord } from "../audit.js";
import { toolTimeoutMs } from "../config.js";
import { PolicyError, isPolicyError } from "../errors.js";
import type { Cap } from "./budget_lines.js";
import type { GateContext } from "./context.js";
import type { Admitted } from "./steps.js";
import type { CallDeadline } from "./types.js";

export async function supervise<T>(
  ctx: GateContext,
  a: Admitted,
  fn: (signal: AbortSignal, deadline: CallDeadline) => Promise<T>,
): Promise<T> {
  const { call, digest, approvalId, estimate } = a;
  const { principal, tool, trace } = call;
  const base = () => ({
    principal: principal.id,
    tool,
    args: a.redacted,
    estimate: estimate ?? null,
  });

  let started = ctx.clock();
  let settled = false;
  let cap: Cap | undefined = undefined;
  const settle = () => {
    if (settled) return;
    settled = true;
    // The slot and the charge follow the real work, which may outlive a timed-out caller.
    a.release();
    a.reservation();
    cap?.release();
    if (estimate) ctx.lines.charge(principal.id, tool, (ctx.clock() - started) / 1000);
  };

  const allowedRecord: AuditRecord = {
    time: new Date(ctx.clock()).toISOString(),
    ...base(),
    args_digest: digest,
    outcome: "allowed",
    approval_id: approvalId,
  };
  const logAuditFailure = (e: unknown) => {
    ctx.deps.logger.error(
      { err: String(e), tool, principal: principal.id },
      "audit append failed; call refused",
    );
  };
  // Committed before the work starts, or (the tool's runWhileRecording: its work may start
  // while its "allowed" record commits; the answer still waits for it) alongside it.
  let allowedCommitted: Promise<void> | undefined;
  if (ctx.tools.get(tool)?.runWhileRecording) {
    allowedCommitted = ctx.auditDurable(allowedRecord);
    allowedCommitted.catch(() => {}); // observed below, by the abort and before the answer
  } else {
    try {
      await ctx.auditDurable(allowedRecord);
    } catch (e) {
      // Fail closed: a call that cannot be recorded does not run.
      settle();
      logAuditFailure(e);
      throw e;
    }
  }
  trace?.mark("g.audit_allowed");

  const toolMs = toolTimeoutMs(ctx.config.limits, tool);
  // The read allowance holds whatever the estimate said: the call is stopped when its device
  // time reaches what is left of it (and charged what it used).
  cap = ctx.lines.claimCap(principal.id, tool, estimate);
  const capMs = cap ? Math.round(cap.seconds * 1000) : Infinity;
  const timeoutMs = Math.min(toolMs, capMs);
  const stop = (): PolicyError =>
    capMs < toolMs
      ? new PolicyError(
          "budget_exceeded",
          `${tool} was stopped after ${capMs / 1000} s: the device-time allowance for read-scoped tools ran out (${cap!.limit_s} s per ${cap!.window_s} s window); it is charged the device time it used. Retry when the window frees up, or with a smaller batch or sequence.`,
          {
            read_allowance: true,
            stopped_after_s: capMs / 1000,
            limit_s: cap!.limit_s,
            window_s: cap!.window_s,
          },
        )
      : new PolicyError(
          "timeout",
          `${tool} ran past its ${toolMs / 1000} s limit and was cancelled; use smaller inputs or fewer iterations.`,
          { timeout_ms: toolMs },
        );
  const ctrl = new AbortController();
  // Nothing left of the allowance: stopped before it starts.
  if (timeoutMs <= 0) ctrl.abort(stop());
  const timer = setTimeout(() => ctrl.abort(stop()), Math.max(0, timeoutMs));
  const onCallerAbort = () =>
    ctrl.abort(new PolicyError("cancelled", `${tool} was cancelled by the caller.`));
  if (call.signal?.aborted) onCallerAbort();
  else call.signal?.addEventListener("abort", onCallerAbort, { once: true });

  const aborted = new Promise<never>((_, reject) => {
    if (ctrl.signal.aborted) reject(ctrl.signal.reason);
    else ctrl.signal.addEventListener("abort", () => reject(ctrl.signal.reason), { once: true });
  });
  aborted.catch(() => {});
  // A call whose "allowed" record cannot be committed is cancelled and refused.
  allowedCommitted?.catch((e) => {
    logAuditFailure(e);
    ctrl.abort(e);
  });

  started = ctx.clock();
  // One deadline per call: what the gate enforces is what the runtime is told to wait for.
  const deadline: CallDeadline = {
    at: started + timeoutMs,
    remainingMs: () => Math.max(1, started + timeoutMs - ctx.clock()),
  };
  const work = ctrl.signal.aborted
    ? Promise.reject(ctrl.signal.reason)
    : Promise.resolve().then(() => fn(ctrl.signal, deadline));
  work.then(settle, settle);

  try {
    const result = await Promise.race([work, aborted]);
    trace?.mark("g.work_done");
    await allowedCommitted;
    // Committed before the caller gets its answer: no answered call lacks its record.
    await ctx
      .auditDurable({
        time: new Date(ctx.clock()).toISOString(),
        ...base(),
        args_digest: digest,
        worker: call.ranOn?.(),
        outcome: "executed",
        duration_ms: ctx.clock() - started,
        approval_id: approvalId,
      })
      .catch((e) =>
        ctx.deps.logger.error(
          { err: String(e), tool, principal: principal.id },
          "audit append failed",
        ),
      );
    trace?.mark("g.audit_executed");
    return result;
  } catch (e) {
    const code = isPolicyError(e)
      ? e.code
      : ((e as { code?: unknown })?.code as string | undefined);
    ctx.audit({
      ...base(),
      args_digest: digest,
      worker: call.ranOn?.(),
      outcome: "failed",
      code: typeof code === "string" ? code : "internal_error",
      reason: e instanceof Error ? e.message : String(e),
      duration_ms: ctx.clock() - started,
      approval_id: approvalId,
    });
    throw e;
  } finally {
    clearTimeout(timer);
    call.signal?.removeEventListener("abort", onCallerAbort);
  }
}
