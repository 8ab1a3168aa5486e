// Concurrency, rate and budget limits. Every wait is bounded: a full queue refuses at once with
// `busy` and a retry hint, because an agent that waits forever is worse than one told to retry.

import type { Statement, Transaction } from "better-sqlite3";
import pLimit, { type LimitFunction } from "p-limit";
import type { LimitsConfig } from "./config.js";
import { toolConcurrency, toolQueueBound } from "./config.js";
import { PolicyError } from "./errors.js";
import { resolveDb, type SqliteDb } from "./sqlite.js";

import { systemClock, type Clock } from "./clock.js";

export type { Clock } from "./clock.js";

export type Release = () => void;
export type DeviceMode = "exclusive" | "shared" | "none";

function cancelledError(what: string): PolicyError {
  return new PolicyError("cancelled", `The call was cancelled while waiting for ${what}.`);
}

/** Moving average of how long slots are held, for retry hints. */
class HoldTimer {
  private avgMs = 1000;
  observe(ms: number): void {
    this.avgMs = this.avgMs * 0.8 + ms * 0.2;
  }
  hintMs(ahead: number, parallel: number): number {
    return Math.max(100, Math.round((this.avgMs * (ahead + 1)) / Math.max(1, parallel)));
  }
}

class ToolSlots {
  private readonly limit: LimitFunction;
  private waiting = 0;
  private readonly timer = new HoldTimer();
  constructor(
    readonly tool: string,
    concurrency: number,
    private readonly bound: number,
    private readonly now: Clock,
  ) {
    this.limit = pLimit(concurrency);
  }

  stats(): { active: number; waiting: number; concurrency: number; queue_bound: number } {
    return {
      active: this.limit.activeCount,
      waiting: this.waiting,
      concurrency: this.limit.concurrency,
      queue_bound: this.bound,
    };
  }

  acquire(signal?: AbortSignal): Promise<Release> {
    if (signal?.aborted) return Promise.reject(cancelledError(`a ${this.tool} slot`));
    // Only live waiters count: a cancelled one still sits in p-limit's queue but must not make
    // others busy.
    if (this.limit.activeCount >= this.limit.concurrency && this.waiting >= this.bound) {
      return Promise.reject(
        new PolicyError(
          "busy",
          `${this.tool} is at its limit (${this.limit.concurrency} running, ${this.waiting} waiting); retry later.`,
          {
            tool: this.tool,
            retry_after_ms: this.timer.hintMs(this.waiting, this.limit.concurrency),
            running: this.limit.activeCount,
            waiting: this.waiting,
          },
        ),
      );
    }
    return new Promise<Release>((resolve, reject) => {
      let state: "waiting" | "granted" | "aborted" = "waiting";
      this.waiting++;
      const onAbort = () => {
        if (state !== "waiting") return;
        state = "aborted";
        this.waiting--;
        reject(cancelledError(`a ${this.tool} slot`));
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      // The p-limit slot is held until `done` runs, i.e. until the lease is released.
      void this.limit(
        () =>
          new Promise<void>((done) => {
            signal?.removeEventListener("abort", onAbort);
            if (state === "aborted") return done();
            state = "granted";
            this.waiting--;
            const start = this.now();
            let released = false;
            resolve(() => {
              if (released) return;
              released = true;
              this.timer.observe(this.now() - start);
              done();
            });
          }),
      );
    });
  }
}

interface LaneWaiter {
  mode: "exclusive" | "shared";
  grant: () => void;
}

/**
 * A FIFO readers-writer lock on one device: exclusive tools (load, benchmark...) hold it alone,
 * shared ones (inference) together. A shared call queued behind an exclusive one waits its turn,
 * so a stream of inference calls cannot starve a load.
 */
class DeviceLane {
  private readers = 0;
  private writer = false;
  private readonly queue: LaneWaiter[] = [];
  private readonly timer = new HoldTimer();
  constructor(
    readonly device: string,
    private readonly bound: number,
    private readonly now: Clock,
  ) {}

  stats(): { readers: number; exclusive: boolean; waiting: number; queue_bound: number } {
    return {
      readers: this.readers,
      exclusive: this.writer,
      waiting: this.queue.length,
      queue_bound: this.bound,
    };
  }

  private fits(mode: "exclusive" | "shared"): boolean {
    return mode === "shared" ? !this.writer : !this.writer && this.readers === 0;
  }

  private take(mode: "exclusive" | "shared"): Release {
    if (mode === "shared") this.readers++;
    else this.writer = true;
    const start = this.now();
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.timer.observe(this.now() - start);
      if (mode === "shared") this.readers--;
      else this.writer = false;
      this.pump();
    };
  }

  private pump(): void {
    while (this.queue.length > 0 && this.fits(this.queue[0]!.mode)) this.queue.shift()!.grant();
  }

  acquire(mode: "exclusive" | "shared", signal?: AbortSignal): Promise<Release> {
    if (signal?.aborted) return Promise.reject(cancelledError(`device ${this.device}`));
    if (this.queue.length === 0 && this.fits(mode)) return Promise.resolve(this.take(mode));
    if (this.queue.length >= this.bound) {
      return Promise.reject(
        new PolicyError(
          "busy",
          `Device ${this.device} is busy (${this.writer ? "held exclusively" : `${this.readers} shared calls`}, ${this.queue.length} waiting); retry later.`,
          {
            device: this.device,
            retry_after_ms: this.timer.hintMs(this.queue.length, 1),
            waiting: this.queue.length,
          },
        ),
      );
    }
    return new Promise<Release>((resolve, reject) => {
      const waiter: LaneWaiter = {
        mode,
        grant: () => {
          signal?.removeEventListener("abort", onAbort);
          resolve(this.take(mode));
        },
      };
      const onAbort = () => {
        const i = this.queue.indexOf(waiter);
        if (i < 0) return;
        this.queue.splice(i, 1);
        // A cancelled exclusive waiter may have been the only thing holding shared ones back.
        this.pump();
        reject(cancelledError(`device ${this.device}`));
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      this.queue.push(waiter);
    });
  }
}

/** "tpu" and "tpu:0" are the same device lane. */
export function deviceKey(device: string): string {
  return device.includes(":") ? device : `${device}:0`;
}

export class ConcurrencyLimiter {
  private readonly tools = new Map<string, ToolSlots>();
  private readonly lanes = new Map<string, DeviceLane>();
  private readonly exclusive: ReadonlySet<string>;
  private readonly shared: ReadonlySet<string>;

  constructor(
    private readonly limits: LimitsConfig,
    private readonly clock: Clock = systemClock,
  ) {
    this.exclusive = new Set(limits.device_exclusive_tools);
    this.shared = new Set(limits.device_shared_tools);
  }

  deviceMode(tool: string): DeviceMode {
    if (this.exclusive.has(tool)) return "exclusive";
    if (this.shared.has(tool)) return "shared";
    return "none";
  }

  private slots(tool: string): ToolSlots {
    let s = this.tools.get(tool);
    if (!s) {
      s = new ToolSlots(
        tool,
        toolConcurrency(this.limits, tool),
        toolQueueBound(this.limits, tool),
        this.clock,
      );
      this.tools.set(tool, s);
    }
    return s;
  }

  private lane(device: string): DeviceLane {
    const key = deviceKey(device);
    let l = this.lanes.get(key);
    if (!l) {
      l = new DeviceLane(key, this.limits.device_queue_bound, this.clock);
      this.lanes.set(key, l);
    }
    return l;
  }

  /**
   * A tool slot, then (for device tools) the device lane — always in that order, so two callers
   * can never hold one each and wait for the other. Rejects with busy or cancelled.
   */
  async acquire(tool: string, device: string | undefined, signal?: AbortSignal): Promise<Release> {
    const releaseTool = await this.slots(tool).acquire(signal);
    const mode = this.deviceMode(tool);
    if (mode === "none" || !device) return releaseTool;
    try {
      const releaseLane = await this.lane(device).acquire(mode, signal);
      return () => {
        releaseLane();
        releaseTool();
      };
    } catch (e) {
      releaseTool();
      throw e;
    }
  }

  async run<T>(
    tool: string,
    device: string | undefined,
    fn: () => Promise<T>,
    signal?: AbortSignal,
  ): Promise<T> {
    const release = await this.acquire(tool, device, signal);
    try {
      return await fn();
    } finally {
      release();
    }
  }

  /** Queue depths for get_runtime_status and metrics. */
  stats(): {
    tools: Record<string, ReturnType<ToolSlots["stats"]>>;
    devices: Record<string, ReturnType<DeviceLane["stats"]>>;
  } {
    return {
      tools: Object.fromEntries([...this.tools].map(([k, v]) => [k, v.stats()])),
      devices: Object.fromEntries([...this.lanes].map(([k, v]) => [k, v.stats()])),
    };
  }
}

export type RateDecision = { ok: true; remaining: number } | { ok: false; retry_after_ms: number };

/** Token bucket per principal: bursts up to the per-minute allowance, refilled continuously. */
export class RateLimiter {
  private readonly buckets = new Map<string, { tokens: number; at: number }>();
  private readonly capacity: number;
  private readonly perMs: number;

  constructor(
    perMinute: number,
    private readonly clock: Clock = systemClock,
  ) {
    if (!(perMinute > 0)) throw new RangeError("perMinute must be > 0");
    this.capacity = perMinute;
    this.perMs = perMinute / 60_000;
  }

  take(principal: string, cost = 1): RateDecision {
    const now = this.clock();
    const b = this.buckets.get(principal) ?? { tokens: this.capacity, at: now };
    b.tokens = Math.min(this.capacity, b.tokens + Math.max(0, now - b.at) * this.perMs);
    b.at = now;
    this.buckets.set(principal, b);
    if (b.tokens >= cost) {
      b.tokens -= cost;
      this.prune(now);
      return { ok: true, remaining: Math.floor(b.tokens) };
    }
    return { ok: false, retry_after_ms: Math.ceil((cost - b.tokens) / this.perMs) };
  }

  // JWT subjects are unbounded in number: drop buckets that have refilled (they equal a new one).
  private prune(now: number): void {
    if (this.buckets.size < 10_000) return;
    for (const [k, b] of this.buckets) {
      if (b.tokens + (now - b.at) * this.perMs >= this.capacity) this.buckets.delete(k);
    }
  }
}

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
