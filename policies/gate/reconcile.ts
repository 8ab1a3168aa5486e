// At start, before the server accepts a call: what a process that was killed mid-call left
// behind (calls_in_flight.ts) is settled as the gate would have settled it. Each left-behind call
// gets an `interrupted` audit record, is charged to its budget lines, and the approval it had
// consumed is usable again for the same arguments until its original expiry. One transaction
// for all of it, the rows deleted in it: a second start finds nothing, charges nothing twice and
// writes no second record.

import type { AuditRecord } from "../audit.js";
import type { CallInFlight } from "../calls_in_flight.js";
import type { GateContext } from "./context.js";

/** What a left-behind call is charged, and how that figure was known. */
export interface InterruptedCharge {
  seconds: number;
  /**
   * "heartbeat": from its start to the last heartbeat of the process that ran it, a lower bound
   * (the process lived at most one heartbeat interval longer; the worker records nothing);
   * "estimate": no heartbeat came after its start, so its estimate; "none": neither.
   */
  basis: "heartbeat" | "estimate" | "none";
}

/** The charge of a call left behind: measured to the last heartbeat where one came, else the estimate. */
export function interruptedCharge(call: CallInFlight): InterruptedCharge {
  const measuredMs = call.alive_ms - call.started_ms;
  if (measuredMs > 0) return { seconds: measuredMs / 1000, basis: "heartbeat" };
  const est = call.estimate?.device_seconds;
  if (est !== undefined && est > 0) return { seconds: est, basis: "estimate" };
  return { seconds: 0, basis: "none" };
}

/** The store side of the reconcile: rows left behind, deleted one by one, in one transaction. */
export interface LeftBehind {
  leftBehind(): Promise<CallInFlight[]>;
  forget(id: string): Promise<void>;
  /** Runs `fn` as one write transaction (the whole reconcile: every record, charge and delete). */
  transaction<T>(fn: () => Promise<T>): Promise<T>;
}

/** Settles every call left behind; returns their audit records. Throws (rolled back) on a write failure. */
export async function reconcileInterrupted(
  ctx: GateContext,
  store: LeftBehind,
): Promise<AuditRecord[]> {
  const { approvals, audit, budget } = ctx.deps;
  return store.transaction(async () => {
    const out: AuditRecord[] = [];
    for (const call of await store.leftBehind()) {
      const charge = interruptedCharge(call);
      // Charged only where the gate would have charged it: a call with an estimate.
      const charged = call.estimate && charge.seconds > 0;
      if (charged)
        await ctx.lines.charge(call.principal, call.tool, charge.seconds, call.estimate!);
      await budget.flush?.();
      const restored = call.approval_id
        ? await approvals.restoreUsed?.(
            call.approval_id,
            call.principal,
            call.tool,
            call.args_digest,
          )
        : undefined;
      const rec: AuditRecord = {
        time: new Date(ctx.clock()).toISOString(),
        principal: call.principal,
        tool: call.tool,
        args: call.args,
        args_digest: call.args_digest,
        estimate: call.estimate,
        outcome: "interrupted",
        code: "server_restarted",
        reason: describe(call, charge, Boolean(charged), restored?.expires_at),
        duration_ms: Math.round(charge.seconds * 1000),
        ...(call.approval_id ? { approval_id: call.approval_id } : {}),
      };
      await audit.append(rec);
      await store.forget(call.id);
      out.push(rec);
    }
    return out;
  });
}

function describe(
  call: CallInFlight,
  charge: InterruptedCharge,
  charged: boolean,
  approvalUntil: string | undefined,
): string {
  const started = new Date(call.started_ms).toISOString();
  const how =
    charge.basis === "heartbeat"
      ? `${round3(charge.seconds)} s, from its start to the server's last heartbeat at ${new Date(call.alive_ms).toISOString()} (a lower bound)`
      : charge.basis === "estimate"
        ? `its estimate of ${round3(charge.seconds)} s (no heartbeat came after its start)`
        : "nothing (no estimate, and no heartbeat came after its start)";
  const approval = !call.approval_id
    ? ""
    : approvalUntil
      ? ` Approval ${call.approval_id} is usable again for the same arguments until ${approvalUntil}.`
      : ` Approval ${call.approval_id} was not given back (expired, pruned or no longer used by this call).`;
  return `The server stopped while this call ran (started ${started}); it was not resumed. Charged ${charged ? how : "nothing (the call had no estimate)"}.${approval} Call the tool again.`;
}

function round3(x: number): number {
  return Math.round(x * 1000) / 1000;
}
