// Suspended principals: a principal an alert rule stopped (policies/alerts/) is refused every
// call with `principal_suspended` until its suspension ends — at its `until` time, or when an
// operator runs `tpu-mcp principals resume ID`. Kept in policy.db, because the CLI resumes from
// another process and a restart must not lift a suspension.

import type { Statement } from "better-sqlite3";
import { PolicyError } from "./errors.js";
import { resolveDb, type SqliteDb } from "./sqlite.js";

export interface Suspension {
  principal: string;
  /** Why, in words (the rule and what it counted). */
  reason: string;
  /** The alert rule that suspended it (or "operator"). */
  rule: string;
  since: string;
  /** When it ends by itself (ISO time); null: only `tpu-mcp principals resume` ends it. */
  until: string | null;
}

/**
 * Shared state: every control-plane process must see the same suspensions (a principal suspended
 * by one server is refused by all, and resumed by the CLI for all), so a Postgres port
 * implements this interface over one table as SqliteSuspensionStore does over policy.db.
 */
export interface SuspensionStore {
  /** Records (or replaces) the principal's suspension. */
  suspend(s: Suspension): Promise<void>;
  /** Ends it (atomic: read and delete in one step); the suspension that was active, or null. */
  resume(principal: string, nowMs: number): Promise<Suspension | null>;
  /** The principal's suspension in force at `nowMs`, if any (the gate asks on every call). */
  active(principal: string, nowMs: number): Promise<Suspension | null>;
  /** Every suspension in force at `nowMs`, newest first. */
  list(nowMs: number): Promise<Suspension[]>;
  close(): void | Promise<void>;
}

interface Row {
  principal: string;
  reason: string;
  rule: string;
  since: string;
  until_ms: number | null;
}

const toSuspension = (r: Row): Suspension => ({
  principal: r.principal,
  reason: r.reason,
  rule: r.rule,
  since: r.since,
  until: r.until_ms === null ? null : new Date(r.until_ms).toISOString(),
});

export class SqliteSuspensionStore implements SuspensionStore {
  private readonly db: SqliteDb;
  private readonly owned: boolean;
  private readonly stmts: { get: Statement; upsert: Statement; del: Statement; all: Statement };

  constructor(pathOrDb: string | SqliteDb) {
    ({ db: this.db, owned: this.owned } = resolveDb(pathOrDb));
    this.db.exec(`CREATE TABLE IF NOT EXISTS principal_suspensions (
      principal TEXT PRIMARY KEY,
      reason TEXT NOT NULL,
      rule TEXT NOT NULL,
      since TEXT NOT NULL,
      until_ms INTEGER
    )`);
    // Prepared once: the gate reads the table on every call (a primary-key lookup).
    this.stmts = {
      get: this.db.prepare(
        "SELECT * FROM principal_suspensions WHERE principal = ? AND (until_ms IS NULL OR until_ms > ?)",
      ),
      upsert: this.db.prepare(
        `INSERT INTO principal_suspensions (principal, reason, rule, since, until_ms) VALUES (?, ?, ?, ?, ?)
         ON CONFLICT(principal) DO UPDATE SET reason = excluded.reason, rule = excluded.rule,
           since = excluded.since, until_ms = excluded.until_ms`,
      ),
      del: this.db.prepare("DELETE FROM principal_suspensions WHERE principal = ?"),
      all: this.db.prepare(
        "SELECT * FROM principal_suspensions WHERE until_ms IS NULL OR until_ms > ? ORDER BY since DESC",
      ),
    };
  }

  async suspend(s: Suspension): Promise<void> {
    const until = s.until === null ? null : Date.parse(s.until);
    this.stmts.upsert.run(s.principal, s.reason, s.rule, s.since, until);
  }

  async resume(principal: string, nowMs: number): Promise<Suspension | null> {
    return this.db.transaction(() => {
      const row = this.stmts.get.get(principal, nowMs) as Row | undefined;
      const was = row ? toSuspension(row) : null;
      this.stmts.del.run(principal);
      return was;
    })();
  }

  async active(principal: string, nowMs: number): Promise<Suspension | null> {
    const row = this.stmts.get.get(principal, nowMs) as Row | undefined;
    return row ? toSuspension(row) : null;
  }

  async list(nowMs: number): Promise<Suspension[]> {
    return (this.stmts.all.all(nowMs) as Row[]).map(toSuspension);
  }

  close(): void {
    if (this.owned && this.db.open) this.db.close();
  }
}

/** The command an operator runs to lift a suspension (the refusal and the webhook name it). */
export const resumeCommand = (principal: string) => `tpu-mcp principals resume ${principal}`;

/** The refusal of a suspended principal's call: why, and how the suspension ends. */
export function suspendedError(s: Suspension): PolicyError {
  const ends = s.until
    ? `It ends at ${s.until}, or earlier when an operator runs \`${resumeCommand(s.principal)}\`.`
    : `It ends when an operator runs \`${resumeCommand(s.principal)}\`.`;
  return new PolicyError(
    "principal_suspended",
    `${s.principal} is suspended since ${s.since} by the alert rule ${s.rule}: ${s.reason}. ${ends}`,
    { rule: s.rule, since: s.since, until: s.until, resume_command: resumeCommand(s.principal) },
    [resumeCommand(s.principal)],
  );
}
