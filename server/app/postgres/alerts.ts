// The alerts that fired, in Postgres, shared by every replica: the console lists every replica's,
// and a rule's quiet time per subject is the deployment's, so one alert fires per window, not
// one per replica. Mirrors SqliteAlertStore (policies/alerts/store.ts); `add` is also the claim:
// under the (rule, subject)'s advisory lock it stores the alert only while no alert of that rule
// and subject is still quiet, and says whether it did (the replica that lost the race does not
// fire). The newest 10,000 alerts are kept.
import {
  alertColumns,
  latchKey,
  type AlertRecord,
  type AlertStore,
} from "../../../policies/alerts/store.js";
import { inTransaction, type PgPool } from "../../stores/pg/pool.js";

/** Alerts kept; older ones are deleted as new ones come. */
const KEEP = 10_000;
/** Advisory lock namespace of an alert rule's subjects. */
const FIRE_LOCK = 7804;

interface Row {
  id: string;
  rule: string;
  kind: AlertRecord["kind"];
  subject: string;
  principal: string | null;
  message: string;
  fired_ms: string;
  quiet_until_ms: string;
  action: AlertRecord["action"];
  details: Record<string, unknown>;
}

export class PgAlerts implements AlertStore {
  constructor(private readonly pool: PgPool) {}

  /**
   * Stores the alert unless its rule is still quiet for its subject at the alert's own time
   * (another replica fired it in this window): true when stored, false when it was quiet.
   */
  add(a: AlertRecord): Promise<boolean> {
    const fired = Date.parse(a.fired_at);
    return inTransaction(this.pool, async (c) => {
      await c.query("SELECT pg_advisory_xact_lock(hashtextextended($1, $2))", [
        latchKey(a.rule, a.subject),
        FIRE_LOCK,
      ]);
      const quiet = await c.query(
        "SELECT 1 FROM alerts WHERE rule = $1 AND subject = $2 AND quiet_until_ms > $3 LIMIT 1",
        [a.rule, a.subject, fired],
      );
      if (quiet.rows.length > 0) return false;
      await c.query(
        `INSERT INTO alerts (id, rule, kind, subject, principal, message, fired_ms, quiet_until_ms,
           action, details)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
        alertColumns(a),
      );
      await c.query(
        "DELETE FROM alerts WHERE seq <= (SELECT seq FROM alerts ORDER BY seq DESC LIMIT 1 OFFSET $1)",
        [KEEP],
      );
      return true;
    });
  }

  /** The newest `limit` alerts, newest first. */
  async recent(limit: number): Promise<AlertRecord[]> {
    const r = await this.pool.query(
      "SELECT * FROM alerts ORDER BY fired_ms DESC, seq DESC LIMIT $1",
      [limit],
    );
    return (r.rows as Row[]).map((x) => ({
      id: x.id,
      rule: x.rule,
      kind: x.kind,
      subject: x.subject,
      principal: x.principal,
      message: x.message,
      fired_at: new Date(Number(x.fired_ms)).toISOString(),
      quiet_until: new Date(Number(x.quiet_until_ms)).toISOString(),
      action: x.action,
      details: x.details,
    }));
  }

  /** Every (rule, subject) still quiet at `nowMs`, as latch keys with their end. */
  async quiet(nowMs: number): Promise<[string, number][]> {
    const r = await this.pool.query(
      `SELECT rule, subject, MAX(quiet_until_ms) AS until FROM alerts WHERE quiet_until_ms > $1
       GROUP BY rule, subject`,
      [nowMs],
    );
    return (r.rows as { rule: string; subject: string; until: string }[]).map((x) => [
      latchKey(x.rule, x.subject),
      Number(x.until),
    ]);
  }

  /** Nothing of its own to close: the pool is the caller's. */
  close(): void {}
}
