// The alerts that fired, kept in policy.db: the console lists them, and a restart reads which
// rule is quiet for which key (fired once in its window) so that it does not fire again.

import type { Statement } from "better-sqlite3";
import { resolveDb, type SqliteDb } from "../sqlite.js";

export type AlertKind = "refusals" | "budget" | "approval_waiting" | "worker_restarts";

export interface AlertRecord {
  id: string;
  rule: string;
  kind: AlertKind;
  /** What it is about: a principal id, a worker name, an approval id. */
  subject: string;
  /** The principal it concerns, when it concerns one. */
  principal: string | null;
  message: string;
  fired_at: string;
  /** Until when the rule stays quiet for this subject (the end of its window). */
  quiet_until: string;
  action: "notify" | "suspend";
  /** The figures the rule saw (count, window_s, percent, waited_s...). */
  details: Record<string, unknown>;
}

/**
 * Shared state: the alerts and each rule's quiet time per subject must be the same for every
 * control-plane process (one alert per window, not one per server). Every method that reads or
 * writes returns a promise (SQLite's resolve at once). `add` is the claim of the window: one step
 * that stores the alert only while its rule is not quiet for its subject, so of two processes
 * firing the same rule for the same subject in one window, one stores it and the other is told
 * it did not.
 */
export interface AlertStore {
  /**
   * Stores the alert unless its rule is still quiet for its subject at the alert's own time
   * (it fired already in this window): true when stored, false when it was quiet.
   */
  add(a: AlertRecord): Promise<boolean>;
  /** The newest `limit` alerts, newest first. */
  recent(limit: number): Promise<AlertRecord[]>;
  /** Every (rule, subject) still quiet at `nowMs`, as latch keys with their end. */
  quiet(nowMs: number): Promise<[key: string, quietUntilMs: number][]>;
  close(): void;
}

/** The latch key of a rule and a subject. */
export const latchKey = (rule: string, subject: string) => JSON.stringify([rule, subject]);

/**
 * An alert's column values in the stores' order (id, rule, kind, subject, principal, message,
 * fired_ms, quiet_until_ms, action, details): SQLite's and Postgres's inserts take the same.
 */
export function alertColumns(a: AlertRecord): (string | number | null)[] {
  return [
    a.id,
    a.rule,
    a.kind,
    a.subject,
    a.principal,
    a.message,
    Date.parse(a.fired_at),
    Date.parse(a.quiet_until),
    a.action,
    JSON.stringify(a.details),
  ];
}

/** Alerts kept; older ones are deleted as new ones come. */
const KEEP = 10_000;

interface Row {
  id: string;
  rule: string;
  kind: AlertKind;
  subject: string;
  principal: string | null;
  message: string;
  fired_ms: number;
  quiet_until_ms: number;
  action: "notify" | "suspend";
  details: string;
}

export class SqliteAlertStore implements AlertStore {
  private readonly db: SqliteDb;
  private readonly owned: boolean;
  private readonly stmts: {
    insert: Statement;
    isQuiet: Statement;
    recent: Statement;
    quiet: Statement;
    prune: Statement;
  };

  constructor(pathOrDb: string | SqliteDb) {
    ({ db: this.db, owned: this.owned } = resolveDb(pathOrDb));
    this.db.exec(`CREATE TABLE IF NOT EXISTS alerts (
      id TEXT PRIMARY KEY,
      rule TEXT NOT NULL,
      kind TEXT NOT NULL,
      subject TEXT NOT NULL,
      principal TEXT,
      message TEXT NOT NULL,
      fired_ms INTEGER NOT NULL,
      quiet_until_ms INTEGER NOT NULL,
      action TEXT NOT NULL,
      details TEXT NOT NULL
    );
    CREATE INDEX IF NOT EXISTS alerts_by_time ON alerts (fired_ms);`);
    this.stmts = {
      insert: this.db.prepare(
        `INSERT INTO alerts (id, rule, kind, subject, principal, message, fired_ms, quiet_until_ms, action, details)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
      ),
      isQuiet: this.db.prepare(
        "SELECT 1 FROM alerts WHERE rule = ? AND subject = ? AND quiet_until_ms > ? LIMIT 1",
      ),
      recent: this.db.prepare("SELECT * FROM alerts ORDER BY fired_ms DESC, rowid DESC LIMIT ?"),
      quiet: this.db.prepare(
        "SELECT rule, subject, MAX(quiet_until_ms) AS until FROM alerts WHERE quiet_until_ms > ? GROUP BY rule, subject",
      ),
      prune: this.db.prepare(
        "DELETE FROM alerts WHERE rowid <= (SELECT rowid FROM alerts ORDER BY rowid DESC LIMIT 1 OFFSET ?)",
      ),
    };
  }

  async add(a: AlertRecord): Promise<boolean> {
    const fired = Date.parse(a.fired_at);
    // The check and the insert in one write transaction: another process on the file waits.
    const claim = this.db.transaction(() => {
      if (this.stmts.isQuiet.get(a.rule, a.subject, fired) !== undefined) return false;
      this.stmts.insert.run(...alertColumns(a));
      this.stmts.prune.run(KEEP);
      return true;
    });
    return claim.immediate();
  }

  async recent(limit: number): Promise<AlertRecord[]> {
    return (this.stmts.recent.all(limit) as Row[]).map((r) => ({
      id: r.id,
      rule: r.rule,
      kind: r.kind,
      subject: r.subject,
      principal: r.principal,
      message: r.message,
      fired_at: new Date(r.fired_ms).toISOString(),
      quiet_until: new Date(r.quiet_until_ms).toISOString(),
      action: r.action,
      details: JSON.parse(r.details) as Record<string, unknown>,
    }));
  }

  async quiet(nowMs: number): Promise<[string, number][]> {
    return (this.stmts.quiet.all(nowMs) as { rule: string; subject: string; until: number }[]).map(
      (r) => [latchKey(r.rule, r.subject), r.until],
    );
  }

  close(): void {
    if (this.owned && this.db.open) this.db.close();
  }
}
