// The supervisor of an admitted call: it records the admission, starts the work under its
// deadline (the tool's timeout), its meter (every budget line it is charged to, see
// BudgetLines.meter) and, for an approved call, the bound of what was approved (its estimate ×
// approvals.overrun_factor); stops it when one runs out (the worker is told why, and a benchmark
// returns what it measured, marked `stopped`), races it against the caller's cancellation,
// charges a stopped call up to the moment of its stop and any other when its work ends, settles
// the slot when the work really ends (which may be after the caller got its answer), and records
// how the call ended.

import type { AuditRecord } from "../audit.js";
import { toolTimeoutMs } from "../config.js";
import { PolicyError, isPolicyError } from "../errors.js";
import { costNote, formatAmount, formatMoney } from "../limits/pricing.js";
import type { CapStop, Metered } from "./budget_lines.js";
import type { GateContext } from "./context.js";
import type { CostEstimate } from "../estimate.js";
import type { Admitted } from "./steps.js";
import { traceIds, type CallDeadline } from "./types.js";

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
    ...traceIds(call),
  });

  // Kept until charged, written with its "allowed" record: a kill leaves it for the restart.
  const flight = ctx.deps.calls?.begin({
    principal: principal.id,
    tool,
    args_digest: digest,
    args: a.redacted,
    estimate: estimate ?? null,
    approval_id: approvalId,
  });
  let started = ctx.clock();
  let settled = false;
  /** The "allowed" record's commit while the work runs (a runWhileRecording tool). */
  let allowedCommitted: Promise<void> | undefined;
  let meter: Metered | undefined = undefined;
  // The budget's part of a call ends once: at its stop, charged up to the moment the stop was
  // decided (how long the worker then takes to stop is the runtime supervisor's to bound: it
  // restarts a worker that does not), or else when its work ends, charged what it took.
  let budgetEnded = false;
  const endBudget = (atMs: number) => {
    if (budgetEnded) return;
    budgetEnded = true;
    meter?.end();
    const seconds = Math.max(0, atMs - started) / 1000;
    void (async () => {
      // The hold becomes the measured charge (a call without an estimate is charged nothing).
      if (estimate) {
        await a.reservation.settle(seconds);
        // Told, never waited for (the alert rules read the budget on their own time).
        void Promise.resolve(ctx.deps.observer?.charged(principal.id)).catch(() => {});
      } else await a.reservation.release();
      // Right after the charge: charged, or left for the restart. A call stopped while its
      // "allowed" record (and so its row, written alongside) is still committing waits for that
      // commit: deleted before it, the row would be inserted after and outlive the call.
      if (flight) {
        if (allowedCommitted) await allowedCommitted.catch(() => {});
        await ctx.deps.calls?.end(flight.id);
      }
    })().catch((e) =>
      ctx.deps.logger.error(
        { err: String(e), tool, principal: principal.id },
        "budget: the call's charge was not recorded (its calls_in_flight row settles it at the next start)",
      ),
    );
  };
  const settle = () => {
    if (settled) return;
    settled = true;
    // The slot follows the real work, which may outlive a stopped or timed-out caller.
    a.release();
    endBudget(ctx.clock());
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
  if (ctx.tools.get(tool)?.runWhileRecording) {
    allowedCommitted = ctx.auditDurable(allowedRecord, flight?.write);
    allowedCommitted.catch(() => {}); // observed below, by the abort and before the answer
  } else {
    try {
      await ctx.auditDurable(allowedRecord, flight?.write);
    } catch (e) {
      // Fail closed: a call that cannot be recorded does not run.
      settle();
      logAuditFailure(e);
      throw e;
    }
  }
  trace?.mark("g.audit_allowed");

  const toolMs = toolTimeoutMs(ctx.config.limits, tool);
  const ctrl = new AbortController();
  // Stopped (budget or timeout): the worker is told why and ends the call gracefully (a
  // benchmark returns what it measured), so the caller waits for the work's own answer, up to
  // STOP_GRACE_MS; the runtime's hard cancel (its cancel grace) ends a worker that does not stop.
  let stopped: PolicyError | undefined;
  let giveUp: (e: unknown) => void = () => {};
  const gaveUp = new Promise<never>((_, reject) => (giveUp = reject));
  gaveUp.catch(() => {});
  let graceTimer: NodeJS.Timeout | undefined;
  /** Stops the call for `err`, decided at `atMs` (a late timer does not charge its lateness). */
  const stopCall = (err: PolicyError, atMs: number) => {
    if (ctrl.signal.aborted) return;
    stopped = err;
    ctrl.abort(err);
    // After the turn: a budget stop comes from inside the meter's walk of its line.
    queueMicrotask(() => endBudget(atMs));
    graceTimer = setTimeout(() => giveUp(err), STOP_GRACE_MS);
  };
  // The caller's cancellation and a failed audit answer at once: no stop grace is waited for.
  const abortNow = (err: unknown) => {
    if (!ctrl.signal.aborted) ctrl.abort(err);
    giveUp(err);
  };
  const timer = setTimeout(
    () =>
      stopCall(
        stopError(
          "timeout",
          `${tool} ran past its ${toolMs / 1000} s limit and was stopped; use smaller inputs or fewer iterations.`,
          { timeout_ms: toolMs },
          "timeout",
        ),
        started + toolMs,
      ),
    toolMs,
  );
  // An approval is for the estimate it showed: an approved call that runs past it by more than
  // approvals.overrun_factor, and by at least approvals.overrun_min_s (a small estimate on a
  // loaded host is not an overrun), is stopped as a budget stop is (factor 0 turns it off).
  const factor = ctx.config.approvals.overrun_factor;
  const floorS = ctx.config.approvals.overrun_min_s;
  const approvedMs =
    approvalId && estimate && factor > 0
      ? Math.max(
          1,
          Math.ceil(
            Math.max(estimate.device_seconds * factor, estimate.device_seconds + floorS) * 1000,
          ),
        )
      : undefined;
  const overrunTimer =
    approvedMs === undefined
      ? undefined
      : setTimeout(
          () =>
            stopCall(
              stopError(
                "approval_overrun",
                `${tool} was stopped after ${round3(approvedMs / 1000)} s of device time: it was approved for an estimate of ${estimate!.device_seconds} s${costNote(estimate)} and may run ${factor}× that (at least ${floorS} s more); it is charged the device time it used. Ask for a new approval with a smaller call, or an operator can raise approvals.overrun_factor.`,
                {
                  stopped_after_s: round3(approvedMs / 1000),
                  estimated_s: estimate!.device_seconds,
                  overrun_factor: factor,
                  overrun_min_s: floorS,
                  approval_id: approvalId,
                },
                "approval",
              ),
              started + approvedMs,
            ),
          approvedMs,
        );
  // A suspension of the principal stops the call as a budget stop does (Gate.suspendPrincipal).
  const stopForSuspension = (err: PolicyError) => stopCall(err, ctx.clock());
  let running = ctx.running.get(principal.id);
  if (!running) ctx.running.set(principal.id, (running = new Set()));
  running.add(stopForSuspension);
  const onCallerAbort = () =>
    abortNow(new PolicyError("cancelled", `${tool} was cancelled by the caller.`));
  if (call.signal?.aborted) onCallerAbort();
  else call.signal?.addEventListener("abort", onCallerAbort, { once: true });

  // A call whose "allowed" record cannot be committed is cancelled and refused.
  allowedCommitted?.catch((e) => {
    logAuditFailure(e);
    abortNow(e);
  });

  started = ctx.clock();
  // On a shared store the other replicas count its overrun from here, live (not waited for).
  a.reservation
    .started()
    .catch((e) =>
      ctx.deps.logger.warn({ err: String(e), tool }, "budget: the call's start was not shared"),
    );
  // Every line the call is charged to meters it from here (the charge's start): stopped when its
  // device time reaches its estimate plus what is left of a line (at once when nothing is left).
  meter = ctx.lines.meter(principal.id, tool, estimate, (cap) =>
    stopCall(budgetStop(tool, principal.id, estimate, cap), started + cap.usedS * 1000),
  );
  // A call whose line has nothing left is stopped before its work starts.
  await meter?.armed;
  // One deadline per call: the runtime waits for the work until the gate would give up on it.
  const deadline: CallDeadline = {
    at: started + toolMs,
    remainingMs: () => Math.max(1, started + toolMs + STOP_GRACE_MS - ctx.clock()),
  };
  const work = ctrl.signal.aborted
    ? Promise.reject(ctrl.signal.reason)
    : Promise.resolve().then(() => fn(ctrl.signal, deadline));
  work.then(settle, settle);

  try {
    let result: T;
    try {
      result = await Promise.race([work, gaveUp]);
    } catch (e) {
      // A stopped call that ends without an answer (the worker's cancellation, the runtime's
      // hard cancel) answers why it was stopped.
      throw stopped ?? e;
    }
    trace?.mark("g.work_done");
    await allowedCommitted;
    // Committed before the caller gets its answer: no answered call lacks its record.
    await ctx
      .auditDurable({
        time: new Date(ctx.clock()).toISOString(),
        ...base(),
        args_digest: digest,
        worker: call.ranOn?.(),
        // A stopped call answered with its partial result did not run as asked.
        ...(stopped
          ? {
              outcome: "failed" as const,
              code: stopped.code,
              reason: `${stopped.message} Its partial result was returned.`,
            }
          : { outcome: "executed" as const }),
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
    clearTimeout(overrunTimer);
    clearTimeout(graceTimer);
    call.signal?.removeEventListener("abort", onCallerAbort);
    running.delete(stopForSuspension);
    if (running.size === 0 && ctx.running.get(principal.id) === running)
      ctx.running.delete(principal.id);
  }
}

/**
 * How long a stopped call's own answer is waited for before the caller is answered without it.
 * The runtime's hard cancel (cancelGraceMs, 2 s by default) normally ends the work sooner.
 */
export const STOP_GRACE_MS = 10_000;

/** A gate error that stops a call: `stop` tells the runtime the reason to send the worker. */
export function stopError(
  code: "timeout" | "budget_exceeded" | "approval_overrun" | "principal_suspended",
  message: string,
  details: Record<string, unknown>,
  stop: "timeout" | "budget" | "approval",
): PolicyError {
  return Object.assign(new PolicyError(code, message, details), { stop });
}

/** Why a call was stopped by one of its budget lines: what it used, the limit, what to do. */
function budgetStop(
  tool: string,
  principal: string,
  estimate: CostEstimate | undefined,
  cap: CapStop,
): PolicyError {
  const used = round3(cap.usedS);
  if (cap.currency) return moneyStop(tool, principal, estimate, cap);
  const details = {
    read_allowance: cap.readAllowance,
    stopped_after_s: used,
    estimated_s: estimate?.device_seconds ?? null,
    limit_s: cap.limitS,
    window_s: cap.windowS,
  };
  const message = cap.readAllowance
    ? `${tool} was stopped after ${used} s: the device-time allowance for read-scoped tools ran out (${cap.limitS} s per ${cap.windowS} s window); it is charged the device time it used. Retry when the window frees up, or with a smaller batch or sequence.`
    : `${tool} was stopped after ${used} s of device time (estimated ${estimate?.device_seconds ?? "?"} s): the device-time budget of ${principal} ran out (${cap.limitS} s per ${cap.windowS} s window, counting its calls still running); it is charged the device time it used. Retry when the window frees up, or make the call smaller (fewer iterations, sizes or tokens).`;
  return stopError("budget_exceeded", message, details, "budget");
}

/** A stop by a budget in money: the limit and the line in money, the call's use in both. */
function moneyStop(
  tool: string,
  principal: string,
  estimate: CostEstimate | undefined,
  cap: CapStop,
): PolicyError {
  const used = round3(cap.usedS);
  const cur = cap.currency!;
  const limit = formatMoney(cap.limitS, cur);
  const cost = estimate?.cost;
  const details = {
    read_allowance: false,
    stopped_after_s: used,
    estimated_s: estimate?.device_seconds ?? null,
    currency: cur,
    estimated: cost?.amount ?? null,
    limit: formatAmount(cap.limitS),
    window_s: cap.windowS,
  };
  const message = `${tool} was stopped after ${used} s of device time (estimated ${estimate?.device_seconds ?? "?"} s, ${cost ? formatMoney(cost.amount_micros, cur) : "?"}): the budget of ${principal} ran out (${limit} per ${cap.windowS} s window, counting its calls still running); it is charged what it used at its device's price. Retry when the window frees up, or make the call smaller (fewer iterations, sizes or tokens).`;
  return stopError("budget_exceeded", message, details, "budget");
}

function round3(x: number): number {
  return Math.round(x * 1000) / 1000;
}
