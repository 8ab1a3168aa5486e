// A shared store's calls left running by a replica that died and did not start again under its
// id (postgres/calls.ts `lapsed`): every live replica looks for them twice per call lease and
// settles what it finds as a restart settles its own (policies/gate/reconcile.ts): recorded
// interrupted, charged to the last heartbeat, their approvals given back. Claimed in the
// settling transaction, so each is settled by one replica, once.
import type { Logger } from "pino";
import type { Gate } from "../../policies/gate/gate.js";
import type { LeftBehind } from "../../policies/gate/reconcile.js";

/** The store side: the other replicas' rows whose lease lapsed, and that lease. */
export interface LapsedCalls {
  lapsed(): LeftBehind;
  readonly leaseMs: number;
}

/** Settles the lapsed calls now; what it settled (logged). A failed write leaves them for the next look. */
export async function settleLapsed(
  gate: Gate,
  calls: LapsedCalls,
  logger: Logger,
): Promise<number> {
  try {
    const settled = await gate.reconcileInterrupted(calls.lapsed());
    if (settled.length > 0)
      logger.warn(
        {
          calls: settled.map((r) => ({
            tool: r.tool,
            principal: r.principal,
            approval_id: r.approval_id,
          })),
        },
        `${settled.length} call(s) of a replica that stopped (no heartbeat for the call lease, storage.postgres.call_lease_s) were recorded interrupted, charged and their approvals given back here`,
      );
    return settled.length;
  } catch (e) {
    logger.error({ err: String(e) }, "could not settle a stopped replica's calls; looked at again");
    return 0;
  }
}

/** Looks every half lease until stopped (the returned function). */
export function watchLapsed(gate: Gate, calls: LapsedCalls, logger: Logger): () => void {
  let looking: Promise<unknown> = Promise.resolve();
  const timer = setInterval(() => {
    looking = looking.then(() => settleLapsed(gate, calls, logger));
  }, calls.leaseMs / 2);
  timer.unref();
  return () => clearInterval(timer);
}
