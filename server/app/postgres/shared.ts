// The state replicas must agree on, in Postgres: each promise is one transaction, so it holds
// however many replicas race for it.
//
// - Budget admission is budget.ts (PgBudget); rate limits rate.ts; jobs jobs.ts.
// - (Approvals, decided once and used once, are approvals.ts's PgApprovalQueue.)
// - A request state's nonce is consumed once: its INSERT conflicts on every replay.
// - (The audit trail, one chain with one head row, is audit.ts's PgAuditTrail.)
import type { ConsumedStates } from "../../../policies/gate/types.js";
import { NOW_MS, type PgPool } from "../../stores/pg/pool.js";

export { PgBudget } from "./budget.js";

/**
 * Request-state nonces, each consumed once across every replica (the gate's ConsumedStates:
 * an in-band answer's state is refused the second time it is presented, wherever).
 */
export class PgRequestStates implements ConsumedStates {
  private lastPruneMs = -Infinity;

  /**
   * `keepS`: how long a consumed nonce is remembered. A state is refused as expired once past
   * its own expiry (the elicitation timeout, minutes), so a nonce older than that can never be
   * presented again; the default keeps a day.
   */
  constructor(
    private readonly pool: PgPool,
    private readonly replica: string,
    private readonly opts: { keepS?: number } = {},
  ) {}

  /** True the first time `nonce` is presented anywhere; false on every replay. */
  async consume(nonce: string): Promise<boolean> {
    const r = await this.pool.query(
      `INSERT INTO consumed_states (nonce, consumed_ms, replica) VALUES ($1, ${NOW_MS}, $2)
       ON CONFLICT (nonce) DO NOTHING`,
      [nonce, this.replica],
    );
    if (Date.now() - this.lastPruneMs >= 600_000) await this.prune();
    return r.rowCount === 1;
  }

  /** Forgets nonces consumed longer than `keepS` ago; how many. */
  async prune(): Promise<number> {
    this.lastPruneMs = Date.now();
    const r = await this.pool.query(
      `DELETE FROM consumed_states WHERE consumed_ms < ${NOW_MS} - $1::bigint`,
      [Math.round((this.opts.keepS ?? 86_400) * 1000)],
    );
    return r.rowCount ?? 0;
  }
}
