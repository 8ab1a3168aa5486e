// The policy stores on Postgres, built from one pool: what server/app/storage.ts's Postgres branch
// puts behind the port's interfaces (approvals, passkeys, suspensions, alerts, consumed request
// states, console sessions). Each is one file here; this builder only names them together and
// closes what holds a connection of its own (the approvals' LISTEN).
import { PgAlerts } from "./alerts.js";
import { PgApprovalQueue } from "../../stores/approvals/postgres.js";
import { PgConsoleSessions } from "./console_sessions.js";
import { PgPasskeys } from "../../stores/passkeys/postgres.js";
import type { PgPool } from "../../stores/pg/pool.js";
import { PgRequestStates } from "./shared.js";
import { PgSuspensions } from "./suspensions.js";

export interface PgPolicyStoreOptions {
  /** This replica's name (recorded with each consumed request state). */
  replica: string;
  /** approvals.keep_decided_s: how long an approval is kept once over (none: nothing is deleted). */
  keepDecidedS?: number;
  /** Where a failure in the background (a listener, a lost LISTEN connection) is reported. */
  onError?: (e: unknown) => void;
}

export interface PgPolicyStores {
  /** SHARED: decided once, used once, the pending cap per principal; other replicas' changes heard. */
  approvals: PgApprovalQueue;
  /** SHARED: credentials, single-use enrolment codes, counters that only move forward. */
  passkeys: PgPasskeys;
  /** SHARED: principals an alert rule suspended. */
  suspensions: PgSuspensions;
  /** SHARED: the alerts that fired; one per rule, subject and window across replicas. */
  alertStore: PgAlerts;
  /** SHARED: request-state nonces consumed once (the gate's `consumedStates`). */
  consumedStates: PgRequestStates;
  /** SHARED: the console's sessions (only the id's hash stored). */
  consoleSessions: PgConsoleSessions;
  /** Stops the approvals' listener; the pool is the caller's to end. */
  close(): Promise<void>;
}

export function openPgPolicyStores(pool: PgPool, opts: PgPolicyStoreOptions): PgPolicyStores {
  const approvals = new PgApprovalQueue(pool, {
    keepDecidedS: opts.keepDecidedS,
    onError: opts.onError,
  });
  return {
    approvals,
    passkeys: new PgPasskeys(pool),
    suspensions: new PgSuspensions(pool),
    alertStore: new PgAlerts(pool),
    consumedStates: new PgRequestStates(pool, opts.replica),
    consoleSessions: new PgConsoleSessions(pool),
    close: () => approvals.close(),
  };
}
