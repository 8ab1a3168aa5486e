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

/** One budget line of a call's admission: its key, what the call needs on it, its limit. */
export interface BudgetLine {
  key: string;
  /** What the call holds on the line while it runs (its estimate, in the line's unit). */
  need: number;
  /** Overrides the configured limit for this line (e.g. a read allowance). */
  limitS?: number;
  /**
   * What this process's running calls use beyond their estimates on the line (the meter's view,
   * node-local), counted as held.
   */
  extraHeldS?: number;
  /**
   * What one device-second of the call costs on the line, in its unit (absent: 1; a money line:
   * its price per second): a shared store counts the call's overrun from it once it started.
   */
  rate?: number;
}

/** The estimate an admitted call holds on its lines until it settles or is released. */
export interface BudgetHold {
  /** Gives the held amounts back without charging anything; once (a second call does nothing). */
  release(): Promise<void>;
  /**
   * The call ended: its hold becomes the measured charges, one step (a shared store: one
   * transaction); once, and release() after it does nothing.
   */
  settle(charges: { key: string; amount: number; tool?: string }[]): Promise<void>;
  /**
   * The call's work started (a shared store): from now its use beyond the estimate counts on
   * the other processes' admissions and meters, read live from the store.
   */
  started?(): Promise<void>;
}

/** How a line stands now: for the meter (limits/meter.ts). */
export interface LineStanding {
  /** Charged inside the window. */
  charged_s: number;
  /** Held by admitted calls not yet settled (every process's, for a shared store). */
  reserved_s: number;
  limit_s: number;
  window_s: number;
  /**
   * A shared store: the other processes' calls running on the line, each its time run so far
   * (ms, the store's clock), its estimate and its rate (the meter counts their overruns as they
   * grow). Their estimates are in reserved_s.
   */
  others?: { elapsedMs: number; reservedS: number; rate: number }[];
}

export type AdmitOutcome =
  | { ok: true; hold: BudgetHold }
  /** The first line that cannot take its need, and how it stands. */
  | { ok: false; index: number; check: BudgetCheck };

/**
 * The meter's side of a shared store (BudgetLedger.shareMeter): the lines this process's calls
 * run on (with what they used beyond their estimates), and a way to have it look at them again
 * when the other processes' calls may have started or ended.
 */
export interface SharedMeter {
  /** Per line with running calls: what they used beyond their estimates now (0 included). */
  excess(): Map<string, number>;
  /** The meter reads these lines' standing again (another process's holds changed it). */
  lookAgain(keys: string[]): void;
}

/**
 * Device-seconds per budget line over a sliding window, and the estimates admitted calls hold
 * against it. Every method that reads or writes returns a promise (a shared store answers over
 * the network); SQLite answers inside the call and resolves at once. The atomic step is `admit`:
 * it checks every line and holds each line's need only if all fit, in one step (a shared store:
 * one transaction under the principal's lock), so calls admitted at once cannot all pass one
 * check made before any of them held anything.
 */
export interface BudgetLedger {
  /**
   * Would the line take `seconds` now (charges, every live hold, and `extraHeldS`)? Holds
   * nothing. `limitS` overrides the configured limit for this line.
   */
  check(
    principal: string,
    seconds: number,
    extraHeldS?: number,
    limitS?: number,
  ): Promise<BudgetCheck>;
  /** Checks every line and, only if all fit, holds each line's need: one atomic step. */
  admit(lines: BudgetLine[]): Promise<AdmitOutcome>;
  /** The line as it stands now (the meter's view). */
  standing(key: string, limitS?: number): Promise<LineStanding>;
  /** A charge without a hold (a call left behind by a killed process, reconcile.ts). */
  charge(principal: string, seconds: number, tool?: string): Promise<void>;
  /** Writes the charges queued so far now (inside the caller's transaction, if any). */
  flush?(): Promise<void>;
  /**
   * Runs `write` in the transaction of the next flush: with the charges queued in this turn (a
   * call's calls_in_flight row is deleted with its charge, or not at all).
   */
  alongside?(write: () => void): void;
  /**
   * A shared store: the meter (gate/budget_lines.ts) hands itself over, so it looks again at
   * its lines when other processes' calls may have moved (their overruns are read from their
   * holds, `BudgetHold.started`). Absent (SQLite): one process holds everything, and its meter
   * knows it all.
   */
  shareMeter?(meter: SharedMeter): void;
  close(): void | Promise<void>;
}

/** Charges kept in memory while their rows cannot be written (a full disk), at most. */
const MAX_PENDING_CHARGES = 100_000;

/**
 * Kept in SQLite so a restart does not hand everyone a fresh budget. The holds of admitted calls
 * are this process's memory (NODE-LOCAL: one server writes the file). Every method answers
 * inside the call and resolves at once, so `admit`'s check and hold are one synchronous step.
 */
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
  private readonly windows = new Map<string, ChargeWindow>();
  private lastPrune = 0;
  private insertCharge?: Statement<unknown[]>;

  private window(principal: string, since: number): ChargeWindow {
    let w = this.windows.get(principal);
    if (!w) {
      const rows = this.db
        .prepare(
          "SELECT time_ms, seconds FROM budget_charges WHERE principal = ? AND time_ms > ? ORDER BY time_ms",
        )
        .all(principal, since) as { time_ms: number; seconds: number }[];
      w = new ChargeWindow();
      for (const r of rows) w.push(r.time_ms, r.seconds);
      this.windows.set(principal, w);
    }
    w.dropUntil(since);
    return w;
  }

  async check(
    principal: string,
    seconds: number,
    extraHeldS = 0,
    limitS = this.limitS,
  ): Promise<BudgetCheck> {
    return this.checkNow(principal, seconds, extraHeldS, limitS);
  }

  /**
   * Estimated amounts admitted but not yet settled, per line: held at admission, given back when
   * the call settles with its measured cost, or at once when it is refused or cancelled.
   */
  private readonly reserved = new Map<string, number>();

  private adjust(key: string, amount: number): void {
    const v = (this.reserved.get(key) ?? 0) + amount;
    if (v <= 1e-9) this.reserved.delete(key);
    else this.reserved.set(key, v);
  }

  async admit(lines: BudgetLine[]): Promise<AdmitOutcome> {
    for (let i = 0; i < lines.length; i++) {
      const l = lines[i];
      const check = this.checkNow(l.key, l.need, l.extraHeldS ?? 0, l.limitS ?? this.limitS);
      if (!check.ok) return { ok: false, index: i, check };
    }
    for (const l of lines) this.adjust(l.key, l.need);
    let held = true;
    const release = () => {
      if (!held) return;
      held = false;
      for (const l of lines) this.adjust(l.key, -l.need);
    };
    return {
      ok: true,
      hold: {
        release: async () => release(),
        settle: async (charges) => {
          release();
          for (const c of charges) this.chargeNow(c.key, c.amount, c.tool);
        },
      },
    };
  }

  async standing(key: string, limitS = this.limitS): Promise<LineStanding> {
    const w = this.window(key, this.clock() - this.windowMs);
    return {
      charged_s: round3(Math.max(0, w.sum)),
      reserved_s: this.reserved.get(key) ?? 0,
      limit_s: limitS,
      window_s: this.windowMs / 1000,
    };
  }

  private checkNow(
    principal: string,
    seconds: number,
    extraHeldS: number,
    limitS: number,
  ): BudgetCheck {
    const reservedSeconds = (this.reserved.get(principal) ?? 0) + extraHeldS;
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
    for (let i = w.head; i < w.end; i++) {
      left -= w.seconds(i);
      if (left + seconds <= limitS) {
        return {
          ok: false,
          ...base,
          retry_after_ms: Math.max(1, w.time(i) + this.windowMs - now + 1),
        };
      }
    }
    return { ok: false, ...base };
  }

  async charge(principal: string, seconds: number, tool?: string): Promise<void> {
    this.chargeNow(principal, seconds, tool);
  }

  private chargeNow(principal: string, seconds: number, tool?: string): void {
    if (!(seconds > 0)) return;
    const now = this.clock();
    const w = this.window(principal, now - this.windowMs);
    // The in-memory window counts the charge at once (every later check sees it); the row is
    // written with the others charged in this event-loop turn, in one transaction: a commit
    // per call was most of what a charge cost.
    this.pending.push([principal, now, seconds, tool ?? null]);
    this.scheduleFlush();
    w.push(now, seconds);
    // Charges older than the window never count again; prune them now and then, not per call.
    if (now - this.lastPrune >= 10_000) {
      this.lastPrune = now;
      this.db.prepare("DELETE FROM budget_charges WHERE time_ms <= ?").run(now - this.windowMs);
    }
  }

  private pending: [string, number, number, string | null][] = [];
  private writePending?: Transaction<
    (rows: [string, number, number, string | null][], also: (() => void)[]) => void
  >;

  async flush(): Promise<void> {
    this.flushPending();
  }

  alongside(write: () => void): void {
    this.pendingWrites.push(write);
    this.scheduleFlush();
  }

  private flushScheduled = false;
  private scheduleFlush(): void {
    if (this.flushScheduled) return;
    this.flushScheduled = true;
    setImmediate(() => {
      this.flushScheduled = false;
      this.flushPending();
    });
  }

  private pendingWrites: (() => void)[] = [];

  /** Writes the charges of this turn (also on close, so none is lost to a clean shutdown). */
  private readonly flushPending = (): void => {
    if ((this.pending.length === 0 && this.pendingWrites.length === 0) || !this.db.open) return;
    const rows = this.pending;
    const writes = this.pendingWrites;
    this.pending = [];
    this.pendingWrites = [];
    this.insertCharge ??= this.db.prepare(
      "INSERT INTO budget_charges (principal, time_ms, seconds, tool) VALUES (?, ?, ?, ?)",
    );
    const insert = this.insertCharge;
    this.writePending ??= this.db.transaction(
      (batch: [string, number, number, string | null][], also: (() => void)[]) => {
        for (const r of batch) insert.run(...r);
        for (const w of also) w();
      },
    );
    try {
      this.writePending.immediate(rows, writes);
    } catch {
      // A full or read-only disk: the window in memory still holds the charges (budgets stay
      // enforced in this process); the rows wait for the next charge's write, bounded.
      this.pending = rows.concat(this.pending).slice(-MAX_PENDING_CHARGES);
      this.pendingWrites = writes.concat(this.pendingWrites).slice(-MAX_PENDING_CHARGES);
    }
  };

  close(): void {
    this.flushPending();
    if (this.owned && this.db.open) this.db.close();
  }
}

/**
 * One principal's charges inside the window, oldest first, with their running sum: time (ms) and
 * seconds side by side in one Float64Array, 16 bytes a charge (two plain arrays boxed both
 * numbers, ~48 bytes a charge: a busy window holds every charge of the last hour).
 */
class ChargeWindow {
  private buf = new Float64Array(2 * MIN_SLOTS);
  /** The oldest charge still in the window, and one past the newest. */
  head = 0;
  end = 0;
  sum = 0;

  time(i: number): number {
    return this.buf[2 * i];
  }

  seconds(i: number): number {
    return this.buf[2 * i + 1];
  }

  push(timeMs: number, seconds: number): void {
    if (2 * (this.end + 1) > this.buf.length) this.refit(1);
    this.buf[2 * this.end] = timeMs;
    this.buf[2 * this.end + 1] = seconds;
    this.end++;
    this.sum += seconds;
  }

  /** Charges at or before `sinceMs` leave the window. */
  dropUntil(sinceMs: number): void {
    while (this.head < this.end && this.time(this.head) <= sinceMs)
      this.sum -= this.seconds(this.head++);
    // No float residue once the window is empty, and its space is reused from the start.
    if (this.head === this.end) this.head = this.end = this.sum = 0;
  }

  /** Moves the live charges to the start of a buffer sized for them plus `more` (grown or shrunk). */
  private refit(more: number): void {
    const live = this.end - this.head;
    let slots = this.buf.length / 2;
    while (live + more > slots) slots *= 2;
    while (slots > MIN_SLOTS && (live + more) * 4 < slots) slots /= 2;
    if (slots === this.buf.length / 2) this.buf.copyWithin(0, 2 * this.head, 2 * this.end);
    else {
      const buf = new Float64Array(2 * slots);
      buf.set(this.buf.subarray(2 * this.head, 2 * this.end));
      this.buf = buf;
    }
    this.head = 0;
    this.end = live;
  }
}

const MIN_SLOTS = 64;

function round3(x: number): number {
  return Math.round(x * 1000) / 1000;
}
