// Suspended principals in Postgres, shared by every replica: a principal an alert rule suspended
// through one replica is refused by all, and `tpu-mcp principals resume` lifts it for all.
// Mirrors SqliteSuspensionStore (policies/suspensions.ts): one row per principal, replaced by a
// newer suspension; the times are the caller's (`nowMs`), as there.
import type { Suspension, SuspensionStore } from "../../../policies/suspensions.js";
import type { PgPool } from "../../stores/pg/pool.js";

interface Row {
  principal: string;
  reason: string;
  rule: string;
  since: string;
  until_ms: string | null;
}

const toSuspension = (r: Row): Suspension => ({
  principal: r.principal,
  reason: r.reason,
  rule: r.rule,
  since: r.since,
  until: r.until_ms === null ? null : new Date(Number(r.until_ms)).toISOString(),
});

const IN_FORCE = "(until_ms IS NULL OR until_ms > $1)";

export class PgSuspensions implements SuspensionStore {
  constructor(private readonly pool: PgPool) {}

  /** Records (or replaces) the principal's suspension. */
  async suspend(s: Suspension): Promise<void> {
    await this.pool.query(
      `INSERT INTO principal_suspensions (principal, reason, rule, since, until_ms)
       VALUES ($1, $2, $3, $4, $5)
       ON CONFLICT (principal) DO UPDATE SET reason = excluded.reason, rule = excluded.rule,
         since = excluded.since, until_ms = excluded.until_ms`,
      [s.principal, s.reason, s.rule, s.since, s.until === null ? null : Date.parse(s.until)],
    );
  }

  /** Ends it, in one statement: the suspension that was in force, or null when there was none. */
  async resume(principal: string, nowMs: number): Promise<Suspension | null> {
    const r = await this.pool.query(
      "DELETE FROM principal_suspensions WHERE principal = $2 RETURNING *, " +
        `${IN_FORCE} AS in_force`,
      [nowMs, principal],
    );
    const row = r.rows[0] as (Row & { in_force: boolean }) | undefined;
    return row?.in_force ? toSuspension(row) : null;
  }

  async active(principal: string, nowMs: number): Promise<Suspension | null> {
    const r = await this.pool.query(
      `SELECT * FROM principal_suspensions WHERE principal = $2 AND ${IN_FORCE}`,
      [nowMs, principal],
    );
    return r.rows[0] ? toSuspension(r.rows[0] as Row) : null;
  }

  async list(nowMs: number): Promise<Suspension[]> {
    const r = await this.pool.query(
      `SELECT * FROM principal_suspensions WHERE ${IN_FORCE} ORDER BY since DESC`,
      [nowMs],
    );
    return (r.rows as Row[]).map(toSuspension);
  }

  /** Nothing of its own to close: the pool is the caller's. */
  close(): void {}
}
