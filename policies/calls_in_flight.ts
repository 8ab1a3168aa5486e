// The calls the gate has admitted and not yet charged, kept in policy.db so that a server killed
// mid-call (kill -9, a power cut of the process) leaves a row behind: on restart, reconcile.ts
// turns each row into an `interrupted` audit record, a charge and, where the call had consumed
// an approval, that approval usable again. A row is written in the transaction of the call's
// `allowed` record and deleted in the transaction of the call's charge, so an allowed call is
// either charged or left here, never both and never neither. While calls run, a heartbeat stamps their rows with the last
// moment this process was known alive: all a restart can honestly know of how long they ran.

import type { CostEstimate } from "./estimate.js";
import { systemClock, type Clock } from "./clock.js";
import { resolveDb, type SqliteDb } from "./sqlite.js";
import { randomBytes } from "node:crypto";
import type { Statement } from "better-sqlite3";

/** How often the rows of running calls are stamped alive (the charge's precision after a kill). */
export const HEARTBEAT_MS = 2_000;

/** What the gate records of a call when it is admitted. */
export interface CallStart {
  principal: string;
  tool: string;
  args_digest: string;
  /** The arguments as the audit trail shows them (redacted). */
  args: unknown;
  estimate: CostEstimate | null;
  /** The approval the call consumed, if any. */
  approval_id?: string;
}

/** A call left behind by a process that stopped before it was charged. */
export interface CallInFlight extends CallStart {
  id: string;
  started_ms: number;
  /** The last heartbeat of the process that ran it (started_ms until the first one). */
  alive_ms: number;
}

/** The gate's view: begin at admission, end when the call is charged. */
export interface CallsInFlight {
  /**
   * The call's id and the write of its row, which the gate runs inside the transaction of the
   * call's `allowed` record (both are committed, or neither); nothing is written before that.
   */
  begin(call: CallStart): { id: string; write: () => void };
  /**
   * Deletes the row, in the transaction that writes the call's charge (a shared store: the same
   * transaction as the hold's settle).
   */
  end(id: string): Promise<void>;
}

/** A calls_in_flight row as a store reads it (Postgres gives its BIGINT columns as strings). */
export interface CallRow {
  id: string;
  principal: string;
  tool: string;
  args_digest: string;
  args: string;
  estimate: string | null;
  approval_id: string | null;
  started_ms: number | string;
  alive_ms: number | string;
}

/** The call a row records: one mapping for every backend's leftBehind. */
export function callOfRow(r: CallRow): CallInFlight {
  return {
    id: r.id,
    principal: r.principal,
    tool: r.tool,
    args_digest: r.args_digest,
    args: JSON.parse(r.args),
    estimate: r.estimate ? (JSON.parse(r.estimate) as CostEstimate) : null,
    ...(r.approval_id ? { approval_id: r.approval_id } : {}),
    started_ms: Number(r.started_ms),
    alive_ms: Number(r.alive_ms),
  };
}

export class SqliteCallsInFlight implements CallsInFlight {
  private readonly db: SqliteDb;
  private readonly owned: boolean;
  private readonly clock: Clock;
  private readonly withCharges: (write: () => void) => void;
  private readonly live = new Set<string>();
  private heartbeat?: NodeJS.Timeout;

  /**
   * `withCharges` runs a write in the transaction of the budget ledger's next flush (the ledger's
   * `alongside`); without it a row is deleted at once.
   */
  constructor(
    pathOrDb: string | SqliteDb,
    opts: { clock?: Clock; withCharges?: (write: () => void) => void } = {},
  ) {
    ({ db: this.db, owned: this.owned } = resolveDb(pathOrDb));
    this.clock = opts.clock ?? systemClock;
    this.withCharges = opts.withCharges ?? ((write) => write());
    this.db.exec(`CREATE TABLE IF NOT EXISTS calls_in_flight (
      id TEXT PRIMARY KEY,
      principal TEXT NOT NULL,
      tool TEXT NOT NULL,
      args_digest TEXT NOT NULL,
      args TEXT NOT NULL,
      estimate TEXT,
      approval_id TEXT,
      started_ms INTEGER NOT NULL,
      alive_ms INTEGER NOT NULL
    )`);
  }

  begin(call: CallStart): { id: string; write: () => void } {
    const id = `call_${randomBytes(12).toString("hex")}`;
    const now = this.clock();
    this.live.add(id);
    this.heartbeat ??= setInterval(() => this.stampAlive(), HEARTBEAT_MS);
    this.heartbeat.unref?.();
    this.insert ??= this.db.prepare(
      `INSERT INTO calls_in_flight (id, principal, tool, args_digest, args, estimate, approval_id, started_ms, alive_ms)
       VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
    );
    const insert = this.insert;
    const values = [
      id,
      call.principal,
      call.tool,
      call.args_digest,
      JSON.stringify(call.args ?? null),
      call.estimate ? JSON.stringify(call.estimate) : null,
      call.approval_id ?? null,
      now,
      now,
    ];
    return { id, write: () => void insert.run(...values) };
  }

  async end(id: string): Promise<void> {
    if (!this.live.delete(id)) return;
    if (this.live.size === 0) this.stopHeartbeat();
    this.remove ??= this.db.prepare("DELETE FROM calls_in_flight WHERE id = ?");
    const remove = this.remove;
    this.withCharges(() => {
      if (this.db.open) remove.run(id);
    });
  }

  private insert?: Statement;
  private remove?: Statement;

  /** Stamps this process's running calls alive now: one statement, every HEARTBEAT_MS. */
  stampAlive(): void {
    if (!this.db.open || this.live.size === 0) return;
    try {
      const ids = [...this.live];
      this.db
        .prepare(
          `UPDATE calls_in_flight SET alive_ms = ? WHERE id IN (${ids.map(() => "?").join(",")})`,
        )
        .run(this.clock(), ...ids);
    } catch {
      // A full disk: the previous stamp stands (the charge after a kill is then only lower).
    }
  }

  private stopHeartbeat(): void {
    clearInterval(this.heartbeat);
    this.heartbeat = undefined;
  }

  /** Rows no live call of this process owns: what a stopped process left (read at start). */
  async leftBehind(): Promise<CallInFlight[]> {
    const rows = this.db
      .prepare("SELECT * FROM calls_in_flight ORDER BY started_ms, id")
      .all() as CallRow[];
    return rows.filter((r) => !this.live.has(r.id)).map(callOfRow);
  }

  /**
   * Runs `fn` in one write transaction (the other stores of policy.db join it: one handle). `fn`
   * may await, but only the stores of this handle, which answer at once: nothing else may run
   * SQL on the handle meanwhile (reconcile runs at start, before any call).
   */
  async transaction<T>(fn: () => Promise<T>): Promise<T> {
    this.db.prepare("BEGIN IMMEDIATE").run();
    try {
      const out = await fn();
      this.db.prepare("COMMIT").run();
      return out;
    } catch (e) {
      if (this.db.inTransaction) this.db.prepare("ROLLBACK").run();
      throw e;
    }
  }

  /** Deletes a reconciled row (inside the reconcile's transaction). */
  async forget(id: string): Promise<void> {
    this.db.prepare("DELETE FROM calls_in_flight WHERE id = ?").run(id);
  }

  close(): void {
    this.stopHeartbeat();
    if (this.owned && this.db.open) this.db.close();
  }
}
