// The admission steps, in the order they run. Cheapest and most certain refusals first, and
// nothing that costs work (an estimate may ask the worker; an approval involves a human) before
// the caller is known to be allowed and under its rate:
//
//   suspended → scope → rate → estimate → fit → budget → approval → reserve → slot → consume
//
// Each step either passes (filling in the admission), throws a PolicyError, or (the approval step
// in the 2026-07-28 era) answers with a question for the user (InputRequired). `admit` runs them,
// audits a refusal with its code and a question as approval_requested, and gives back what the
// call held so far (reservation, slot), so every exit is closed: a call is admitted by passing
// every step, never by an error skipped.

import type { AuditOutcome } from "../audit.js";
import { argsDigest } from "../digest.js";
import { PolicyError, isPolicyError, type PolicyErrorCode } from "../errors.js";
import type { CostEstimate } from "../estimate.js";
import type { Release } from "../limits/concurrency.js";
import { costOf } from "../limits/pricing.js";
import { canCall, requiredScope, type Principal } from "../scopes.js";
import { suspendedError } from "../suspensions.js";
import { deviceKind } from "../../lib/device.js";
import { checkApproval } from "./approval_flow.js";
import type { Reservation } from "./budget_lines.js";
import type { GateContext } from "./context.js";
import { InputRequired, traceIds, type GateCall } from "./types.js";

/** A call on its way through admission: what the steps learned and what it holds. */
export interface Admission {
  readonly call: GateCall;
  /** The arguments as the audit trail shows them (redacted). */
  readonly redacted: unknown;
  digest: string;
  estimate?: CostEstimate;
  /** The approval to consume once a slot is held. */
  approvalId?: string;
  /** The question the call answers with instead of running (set by the approval step). */
  asked?: InputRequired;
  /** The estimate held against the budget (given back, or settled with the call's charge). */
  reservation?: Reservation;
  /** Gives back the concurrency slot. */
  release?: Release;
}

/** A call that passed every step: it holds its reservation and its slot. */
export type Admitted = Admission & { reservation: Reservation; release: Release };

export interface AdmissionStep {
  readonly name: string;
  run(ctx: GateContext, a: Admission): void | Promise<void>;
  /** The stamp the bench's decomposition reads once the step has passed (tools/support/trace.ts). */
  readonly mark?: string;
}

/** insufficient_scope when the principal may not call the tool: the one scope rule (scopes.canCall). */
export function scopeRefusal(
  ctx: Pick<GateContext, "tools">,
  principal: Principal,
  tool: string,
): PolicyError | undefined {
  const record = ctx.tools.get(tool);
  if (canCall(principal, record)) return undefined;
  const scope = requiredScope(record);
  return new PolicyError(
    "insufficient_scope",
    `${tool} needs the ${scope} scope, which ${principal.id} does not have; ask for a token that grants it.`,
    { required_scope: scope, tool },
  );
}

/** principal_suspended when an alert rule suspended the principal (policies/suspensions.ts). */
export async function checkSuspended(ctx: GateContext, principal: Principal): Promise<void> {
  const s = await ctx.deps.suspensions?.active(principal.id, ctx.clock());
  if (s) throw suspendedError(s);
}

/** Takes one call from the principal's rate; throws rate_limited when it is over. */
export async function takeRate(ctx: GateContext, principal: Principal): Promise<void> {
  const d = await ctx.deps.rateLimiter.take(principal.id);
  if (!d.ok) {
    throw new PolicyError(
      "rate_limited",
      `${principal.id} is over ${ctx.config.limits.rate_limit.per_principal_per_minute} calls per minute; retry in ${Math.ceil(d.retry_after_ms / 1000)} s.`,
      { retry_after_ms: d.retry_after_ms },
    );
  }
}

/** insufficient_memory when the estimate says the call cannot fit on the device. */
export function checkFits(estimate: CostEstimate | undefined): void {
  if (estimate && estimate.fits === false) {
    throw new PolicyError(
      "insufficient_memory",
      `Not enough device memory: ${estimate.reason ?? "the estimate does not fit"}${estimate.suggestion ? `. Try: ${estimate.suggestion}` : ""}.`,
      { estimate, suggestion: estimate.suggestion ?? null, reason: estimate.reason ?? null },
    );
  }
}

/**
 * The estimate with its cost in money at its device kind's price (kept if it has one: a job's
 * estimate was priced when the call was first admitted). A kind without a price under a budget
 * in money is refused: the line could not meter it.
 */
function priced(ctx: GateContext, call: GateCall, estimate: CostEstimate): CostEstimate {
  const pricing = ctx.config.pricing!;
  if (estimate.cost) return estimate;
  const kind = call.deviceKind?.() ?? deviceKind(call.device ?? "cpu");
  const cost = costOf(pricing, kind, estimate.device_seconds);
  if (cost) return { ...estimate, cost };
  if (ctx.config.limits.budget.money_per_window !== undefined)
    throw new PolicyError(
      "budget_exceeded",
      `${call.tool} would run on a ${kind} device, which has no price, and the budget is set in money (limits.budget.money_per_window); an operator adds pricing.per_chip_hour.${kind} (or per_device_second.${kind}), or call on a priced device.`,
      { device_kind: kind },
    );
  return estimate;
}

export const ADMISSION_STEPS: readonly AdmissionStep[] = [
  {
    // A suspended principal is refused everything, before anything else is looked at.
    name: "suspended",
    run: (ctx, a) => checkSuspended(ctx, a.call.principal),
  },
  {
    name: "scope",
    run: (ctx, a) => {
      const refusal = scopeRefusal(ctx, a.call.principal, a.call.tool);
      if (refusal) throw refusal;
    },
  },
  {
    // Every call counts against the rate, refused or not, before anything costs work.
    name: "rate",
    run: (ctx, a) => takeRate(ctx, a.call.principal),
    mark: "g.rate",
  },
  {
    // Only an admitted caller makes the estimate (which may ask the worker for free memory).
    name: "estimate",
    run: async (ctx, a) => {
      if (!a.estimate && a.call.estimator) a.estimate = await a.call.estimator(a.call.signal);
      if (a.estimate && ctx.config.pricing) a.estimate = priced(ctx, a.call, a.estimate);
    },
    mark: "g.estimate",
  },
  { name: "fit", run: (_ctx, a) => checkFits(a.estimate) },
  {
    // A call the budget cannot take now never becomes an approval request.
    name: "budget",
    run: (ctx, a) => ctx.lines.check(a.call.principal, a.call.tool, a.estimate),
  },
  {
    name: "approval",
    run: async (ctx, a) => {
      const got = await checkApproval(
        ctx,
        { ...a.call, estimate: a.estimate },
        a.digest,
        a.redacted,
      );
      if (got instanceof InputRequired) a.asked = got;
      else a.approvalId = got;
    },
    mark: "g.approval",
  },
  {
    // Check and reserve in one step of the ledger (its admit): calls queued behind each other
    // cannot all pass a check made before any of them was charged.
    name: "reserve",
    run: async (ctx, a) => {
      a.reservation = await ctx.lines.admit(a.call.principal, a.call.tool, a.estimate);
    },
    mark: "g.budget",
  },
  {
    // Bounded: a full queue refuses with busy; the caller's cancellation leaves the queue.
    name: "slot",
    run: async (ctx, a) => {
      a.release = await ctx.deps.limiter.acquire(a.call.tool, a.call.device, a.call.signal);
    },
    mark: "g.slot",
  },
  {
    // Used up only by a call that holds its slot and will run.
    name: "consume",
    run: async (ctx, a) => {
      if (a.approvalId)
        await ctx.deps.approvals.consume(a.approvalId, a.call.principal.id, a.call.tool, a.digest);
    },
  },
];

const OUTCOME_FOR_CODE: Partial<Record<PolicyErrorCode, AuditOutcome>> = {
  approval_required: "approval_requested",
  approval_expired: "approval_expired",
  approval_declined: "approval_denied",
  // A call the caller cancelled is failed however far it got (docs/errors.md: cancelled).
  cancelled: "failed",
};

/**
 * Runs the steps in order. A refusal (any PolicyError) gives back the slot and the reservation,
 * is audited with its code and thrown; anything else is thrown as it is. A question for the user
 * ends admission there: audited as approval_requested (code input_required) and returned.
 */
export async function admit(
  ctx: GateContext,
  call: GateCall,
  redacted: unknown,
): Promise<Admitted | InputRequired> {
  const a: Omit<Admission, "digest"> & { digest: string | null } = {
    call,
    redacted,
    digest: null,
    estimate: call.estimate,
  };
  try {
    a.digest = argsDigest(call.tool, call.args);
    call.trace?.mark("g.digest");
    for (const step of ADMISSION_STEPS) {
      // A step that may wait (rate, estimate, budget, approval, slot) is a span of its own.
      const span = step.mark ? call.trace?.child(`gate.${step.mark.slice(2)}`) : undefined;
      try {
        const pending = step.run(ctx, a as Admission);
        if (pending) await pending;
      } catch (e) {
        span?.end(isPolicyError(e) ? e.code : "internal");
        throw e;
      }
      span?.end();
      if (a.asked) break;
      if (step.mark) call.trace?.mark(step.mark);
    }
  } catch (caught) {
    a.release?.();
    giveBack(ctx, a.reservation);
    // The caller's cancel that reached a step as its own abort (the estimator's worker call, a
    // queue) is the caller's cancel, audited as such, not an unrecorded failure.
    const e =
      !isPolicyError(caught) && call.signal?.aborted
        ? new PolicyError(
            "cancelled",
            `${call.tool} was cancelled by the caller before it started.`,
          )
        : caught;
    if (isPolicyError(e)) {
      // Approval outcomes and first refusals are recorded at once; repeats are counted.
      ctx.auditRefusal({
        principal: call.principal.id,
        tool: call.tool,
        args: redacted,
        estimate: a.estimate ?? null,
        args_digest: a.digest,
        ...traceIds(call),
        outcome: OUTCOME_FOR_CODE[e.code] ?? "denied",
        code: e.code,
        reason: e.message,
        approval_id: (e.details.approval_id as string | undefined) ?? a.approvalId,
      });
    }
    throw e;
  }
  if (a.asked) {
    a.release?.();
    giveBack(ctx, a.reservation);
    ctx.auditRefusal({
      principal: call.principal.id,
      tool: call.tool,
      args: redacted,
      estimate: a.estimate ?? null,
      args_digest: a.digest,
      ...traceIds(call),
      outcome: "approval_requested",
      code: "input_required",
      reason: a.asked.prompt.message,
      approval_id: a.asked.approvalId,
    });
    return a.asked;
  }
  return a as Admitted;
}

/** Gives a refused call's reservation back; a failure to is logged (the hold then expires). */
function giveBack(ctx: GateContext, reservation: Reservation | undefined): void {
  reservation
    ?.release()
    .catch((e) =>
      ctx.deps.logger.error({ err: String(e) }, "budget: a refused call's hold was not given back"),
    );
}
