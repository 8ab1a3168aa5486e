// The budget ledger: device-seconds charged per budget line over a sliding window, kept in
// SQLite so a restart does not hand everyone a fresh budget.

import type { Statement, Transaction } from "better-sqlite3";
import { systemClock, type Clock } from "../clock.js";
import { resolveDb, type SqliteDb } from "../sqlite.js";

export interface BudgetCheck {
  ok: boolean;
  used_s: number;
  /** Estimates of admitted calls not yet settled, included in used_s. */
  reserved_s: number;
  remaining_s: number;
  limit_s: number;
  window_s: number;
  /** When enough past charges leave the window for this request to fit; absent if it never can. */
  retry_after_ms?: number;
}

/** Device-seconds per principal over a sliding window. */
export interface BudgetLedger {
  /** `limitS` overrides the configured limit for this line (e.g. a read allowance). */
  check(principal: string, seconds: number, reservedSeconds?: number, limitS?: number): BudgetCheck;
  charge(principal: string, seconds: number, tool?: string): void;
  close(): void;
}

/** Charges kept in memory while their rows cannot be written (a full disk), at most. */
const MAX_PENDING_CHARGES = 100_000;

/** Kept in SQLite so a restart does not hand everyone a fresh budget. */
export class SqliteBudgetLedger implements BudgetLedger {
  private readonly db: SqliteDb;
  private readonly owned: boolean;
  private readonly limitS: number;
  private readonly windowMs: number;
  private readonly clock: Clock;

  constructor(
    pathOrDb: string | SqliteDb,
    opts: { device_seconds_per_window: number; window_s: number; clock?: Clock },
  ) {
    ({ db: this.db, owned: this.owned } = resolveDb(pathOrDb));
    this.limitS = opts.device_seconds_per_window;
    this.windowMs = opts.window_s * 1000;
    this.clock = opts.clock ?? systemClock;
    this.db.exec(`CREATE TABLE IF NOT EXISTS budget_charges (
      id INTEGER PRIMARY KEY,
      principal TEXT NOT NULL,
      time_ms INTEGER NOT NULL,
      seconds REAL NOT NULL,
      tool TEXT
    );
    CREATE INDEX IF NOT EXISTS budget_by_principal ON budget_charges (principal, time_ms);`);
  }

  /**
   * Per-principal charges inside the window, oldest first, with their running sum: a check is
   * O(1) amortised however many calls the window holds (reading them all from SQLite on every
   * call made each call slower the busier the server was). SQLite stays the record, read once
   * per principal per process, so a restart keeps the budget.
   */
  private readonly windows = new Map<
    string,
    { t: number[]; s: number[]; head: number; sum: number }
  >();
  private lastPrune = 0;
  private insertCharge?: Statement<unknown[]>;

  private window(principal: string, since: number) {
    let w = this.windows.get(principal);
    if (!w) {
      const rows = this.db
        .prepare(
          "SELECT time_ms, seconds FROM budget_charges WHERE principal = ? AND time_ms > ? ORDER BY time_ms",
        )
        .all(principal, since) as { time_ms: number; seconds: number }[];
      w = { t: rows.map((r) => r.time_ms), s: rows.map((r) => r.seconds), head: 0, sum: 0 };
      for (const x of w.s) w.sum += x;
      this.windows.set(principal, w);
    }
    while (w.head < w.t.length && w.t[w.head] <= since) w.sum -= w.s[w.head++];
    if (w.head > 1024 && w.head * 2 > w.t.length) {
      w.t = w.t.slice(w.head);
      w.s = w.s.slice(w.head);
      w.head = 0;
    }
    if (w.head === w.t.length) w.sum = 0; // no float residue once the window is empty
    return w;
  }

  check(
    principal: string,
    seconds: number,
    reservedSeconds = 0,
    limitS = this.limitS,
  ): BudgetCheck {
    const now = this.clock();
    const w = this.window(principal, now - this.windowMs);
    const used = Math.max(0, w.sum) + reservedSeconds;
    const base = {
      used_s: round3(used),
      reserved_s: round3(reservedSeconds),
      remaining_s: round3(Math.max(0, limitS - used)),
      limit_s: limitS,
      window_s: this.windowMs / 1000,
    };
    if (used + seconds <= limitS) return { ok: true, ...base };
    if (seconds + reservedSeconds > limitS) return { ok: false, ...base };
    // Walk charges oldest first until enough of them have left the window.
    let left = used;
    for (let i = w.head; i < w.t.length; i++) {
      left -= w.s[i];
      if (left + seconds <= limitS) {
        return {
          ok: false,
          ...base,
          retry_after_ms: Math.max(1, w.t[i] + this.windowMs - now + 1),
        };
      }
    }
    return { ok: false, ...base };
  }

  charge(principal: string, seconds: number, tool?: string): void {
    if (!(seconds > 0)) return;
    const now = this.clock();
    const w = this.window(principal, now - this.windowMs);
    // The in-memory window counts the charge at once (every later check sees it); the row is
    // written with the others charged in this event-loop turn, in one transaction: a commit
    // per call was most of what a charge cost.
    this.pending.push([principal, now, seconds, tool ?? null]);
    if (this.pending.length === 1) setImmediate(this.flushPending);
    w.t.push(now);
    w.s.push(seconds);
    w.sum += seconds;
    // Charges older than the window never count again; prune them now and then, not per call.
    if (now - this.lastPrune >= 10_000) {
      this.lastPrune = now;
      this.db.prepare("DELETE FROM budget_charges WHERE time_ms <= ?").run(now - this.windowMs);
    }
  }

  private pending: [string, number, number, string | null][] = [];
  private writePending?: Transaction<(rows: [string, number, number, string | null][]) => void>;

  /** Writes the charges of this turn (also on close, so none is lost to a clean shutdown). */
  private readonly flushPending = (): void => {
    if (this.pending.length === 0 || !this.db.open) return;
    const rows = this.pending;
    this.pending = [];
    this.insertCharge ??= this.db.prepare(
      "INSERT INTO budget_charges (principal, time_ms, seconds, tool) VALUES (?, ?, ?, ?)",
    );
    const insert = this.insertCharge;
    this.writePending ??= this.db.transaction(
      (batch: [string, number, number, string | null][]) => {
        for (const r of batch) insert.run(...r);
      },
    );
    try {
      this.writePending.immediate(rows);
    } catch {
      // A full or read-only disk: the window in memory still holds the charges (budgets stay
      // enforced in this process); the rows wait for the next charge's write, bounded.
      this.pending = rows.concat(this.pending).slice(-MAX_PENDING_CHARGES);
    }
  };

  close(): void {
    this.flushPending();
    if (this.owned && this.db.open) this.db.close();
  }
}

function round3(x: number): number {
  return Math.round(x * 1000) / 1000;
}
