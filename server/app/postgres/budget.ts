// The budget on the shared store: device-seconds (or money) charged per budget line over a
// sliding window, and the estimates admitted calls hold against it, so a principal's budget is
// ONE cap however many replicas admit its calls.
//
// - Admission (`admit`) is one transaction under the advisory lock of each of the call's lines
//   (taken in key order, so two admissions never wait on each other crosswise): it reads the
//   window's charges and every replica's live holds and reserves the call's need on every line,
//   or on none. Two replicas admitting for one principal take turns.
// - A running call's use beyond its estimate is held too, read live: its hold's rows carry when
//   its work started (`started`, the database's clock) and its rate, so every other replica's
//   admission computes its overrun in the admitting statement, and their meters get it as a
//   running call whose overrun grows (`standing`'s others). Its own overrun each replica counts
//   from its meter directly (`extraHeldS`), never from the row, so nothing is counted twice.
// - Holds carry a lease that their replica renews; a replica that died stops renewing, and what
//   it held stops counting once the lease has run out (its running calls are then charged by a
//   live replica, lapsed_calls.ts). A replica that starts drops what a previous run of itself
//   held (its left-behind calls are charged by the reconcile).
// - Times are the database's clock (replicas' clocks may disagree; the database's is one).
import { randomBytes } from "node:crypto";
import type {
  AdmitOutcome,
  BudgetCheck,
  BudgetHold,
  BudgetLedger,
  BudgetLine,
  LineStanding,
  SharedMeter,
} from "../../../policies/limits/budget.js";
import { queryable } from "../../stores/pg/ambient.js";
import { inTransaction, NOW_MS, type PgClient, type PgPool } from "../../stores/pg/pool.js";

export interface PgBudgetOptions {
  /** The principal's limit per window (a line's own limit overrides it). */
  limitS: number;
  windowS: number;
  /** This replica's name: its holds and overruns are its rows. */
  replica: string;
  /** A hold its replica stopped renewing counts no longer than this (default 15 s). */
  leaseS?: number;
  /** How often this replica renews its holds and its meter looks again (default 1 s). */
  renewMs?: number;
}

/**
 * A line's key as stored: the gate's keys carry a NUL before a line's suffix (the read allowance,
 * the money line), which a Postgres TEXT cannot hold; escaped so that no two keys meet.
 */
export function storedKey(key: string): string {
  return key.replace(/\\/g, "\\\\").replace(/\u0000/g, "\\0");
}

interface LineRead {
  now: number;
  charged: number;
  /** Every replica's holds (their estimates). */
  held: number;
  /** Every other replica's running calls' use beyond their estimates, now. */
  overrun: number;
}

/** An other replica's running call on a line (LineStanding's others). */
interface OtherRun {
  elapsedMs: number;
  reservedS: number;
  rate: number;
}

/** A live hold's row of another replica whose call's work started: its overrun now, in SQL. */
const OVERRUN = `GREATEST(0, rate * (${NOW_MS} - started_ms) / 1000.0 - seconds)`;

/** The budget ledger on Postgres: a BudgetLedger whose holds every replica sees. */
export class PgBudget implements BudgetLedger {
  private readonly leaseMs: number;
  private readonly windowMs: number;
  private readonly timer: NodeJS.Timeout;
  private meter?: SharedMeter;
  /** This replica's holds not yet released or settled (renewed while any remain). */
  private readonly holds = new Set<string>();
  private renewals = 0;

  constructor(
    private readonly pool: PgPool,
    private readonly opts: PgBudgetOptions,
  ) {
    this.leaseMs = Math.round((opts.leaseS ?? 15) * 1000);
    this.windowMs = Math.round(opts.windowS * 1000);
    this.timer = setInterval(() => void this.renew().catch(() => {}), opts.renewMs ?? 1000);
    this.timer.unref();
  }

  /**
   * Opens the replica's ledger: what a previous run of this same replica held is dropped now
   * (that process is gone; its calls are charged by the reconcile at start).
   */
  static async open(pool: PgPool, opts: PgBudgetOptions): Promise<PgBudget> {
    await pool.query("DELETE FROM budget_reservations WHERE replica = $1", [opts.replica]);
    return new PgBudget(pool, opts);
  }

  /** The meter looks again at its running lines after each renewal (others' calls moved). */
  shareMeter(meter: SharedMeter): void {
    this.meter = meter;
  }

  private async read(c: PgClient | PgPool, key: string): Promise<LineRead> {
    const r = await c.query(
      `SELECT ${NOW_MS} AS now_ms,
        (SELECT COALESCE(SUM(seconds), 0) FROM budget_charges
          WHERE principal = $1 AND time_ms > ${NOW_MS} - $2::bigint) AS charged,
        (SELECT COALESCE(SUM(seconds), 0) FROM budget_reservations
          WHERE principal = $1 AND expires_ms > ${NOW_MS}) AS held,
        (SELECT COALESCE(SUM(${OVERRUN}), 0) FROM budget_reservations
          WHERE principal = $1 AND replica <> $3 AND started_ms IS NOT NULL
            AND expires_ms > ${NOW_MS}) AS overrun`,
      [storedKey(key), this.windowMs, this.opts.replica],
    );
    const row = r.rows[0];
    return {
      now: Number(row.now_ms),
      charged: Number(row.charged),
      held: Number(row.held),
      overrun: Number(row.overrun),
    };
  }

  /** SQLite's decision (limits/budget.ts), on what the database holds for the line. */
  private async decide(
    c: PgClient | PgPool,
    key: string,
    seconds: number,
    extraHeldS: number,
    limitS: number,
  ): Promise<BudgetCheck> {
    const line = await this.read(c, key);
    const reserved = line.held + line.overrun + extraHeldS;
    const used = Math.max(0, line.charged) + reserved;
    const base = {
      used_s: round3(used),
      reserved_s: round3(reserved),
      remaining_s: round3(Math.max(0, limitS - used)),
      limit_s: limitS,
      window_s: this.windowMs / 1000,
    };
    if (used + seconds <= limitS + 1e-9) return { ok: true, ...base };
    if (seconds + reserved > limitS) return { ok: false, ...base };
    // Charges oldest first until enough of them have left the window (a refusal only).
    const rows = (
      await c.query(
        `SELECT time_ms, seconds FROM budget_charges
         WHERE principal = $1 AND time_ms > $2::bigint - $3::bigint ORDER BY time_ms`,
        [storedKey(key), line.now, this.windowMs],
      )
    ).rows as { time_ms: string; seconds: number }[];
    let left = used;
    for (const r of rows) {
      left -= Number(r.seconds);
      if (left + seconds <= limitS)
        return {
          ok: false,
          ...base,
          retry_after_ms: Math.max(1, Number(r.time_ms) + this.windowMs - line.now + 1),
        };
    }
    return { ok: false, ...base };
  }

  check(
    key: string,
    seconds: number,
    extraHeldS = 0,
    limitS = this.opts.limitS,
  ): Promise<BudgetCheck> {
    return this.decide(this.pool, key, seconds, extraHeldS, limitS);
  }

  /**
   * Checks every line and holds each line's need only if all fit: one transaction, under each
   * line's advisory lock.
   */
  admit(lines: BudgetLine[]): Promise<AdmitOutcome> {
    return inTransaction(this.pool, async (c) => {
      for (const key of [...new Set(lines.map((l) => storedKey(l.key)))].sort())
        await c.query("SELECT pg_advisory_xact_lock(hashtextextended($1, 7801))", [key]);
      return this.holdIfAllFit(c, lines);
    });
  }

  /**
   * The same decision without the locks or the transaction: each read is its own snapshot, so
   * two replicas can both read the room before either holds it. Kept to show (test/postgres)
   * that the lock is what makes the cap hold; never used by the server.
   */
  admitOnStaleRead(lines: BudgetLine[]): Promise<AdmitOutcome> {
    return this.holdIfAllFit(this.pool, lines);
  }

  private async holdIfAllFit(c: PgClient | PgPool, lines: BudgetLine[]): Promise<AdmitOutcome> {
    for (let i = 0; i < lines.length; i++) {
      const l = lines[i]!;
      const check = await this.decide(
        c,
        l.key,
        l.need,
        l.extraHeldS ?? 0,
        l.limitS ?? this.opts.limitS,
      );
      if (!check.ok) return { ok: false, index: i, check };
    }
    const id = `res_${randomBytes(12).toString("hex")}`;
    await c.query(
      `INSERT INTO budget_reservations (id, principal, seconds, rate, replica, created_ms, expires_ms)
       SELECT $1, k, s, r, $5, ${NOW_MS}, ${NOW_MS} + $6::bigint
       FROM unnest($2::text[], $3::float8[], $4::float8[]) AS t(k, s, r)`,
      [
        id,
        lines.map((l) => storedKey(l.key)),
        lines.map((l) => l.need),
        lines.map((l) => l.rate ?? 1),
        this.opts.replica,
        this.leaseMs,
      ],
    );
    this.holds.add(id);
    return { ok: true, hold: this.hold(id) };
  }

  private hold(id: string): BudgetHold {
    let done = false;
    return {
      // From now on the other replicas count its overrun (the database's clock).
      started: async () => {
        if (done) return;
        await this.pool.query(
          `UPDATE budget_reservations SET started_ms = ${NOW_MS} WHERE id = $1 AND started_ms IS NULL`,
          [id],
        );
      },
      release: async () => {
        if (done) return;
        done = true;
        this.holds.delete(id);
        await this.pool.query("DELETE FROM budget_reservations WHERE id = $1", [id]);
      },
      // The hold becomes the measured charges in one transaction: both, or neither.
      settle: async (charges) => {
        if (done) return;
        done = true;
        this.holds.delete(id);
        await inTransaction(this.pool, async (c) => {
          await c.query("DELETE FROM budget_reservations WHERE id = $1", [id]);
          await this.insertCharges(c, charges);
        });
      },
    };
  }

  private async insertCharges(
    c: PgClient | PgPool,
    charges: { key: string; amount: number; tool?: string }[],
  ): Promise<void> {
    const kept = charges.filter((x) => x.amount > 0);
    if (kept.length === 0) return;
    await c.query(
      `INSERT INTO budget_charges (principal, time_ms, seconds, tool, replica)
       SELECT k, ${NOW_MS}, s, t, $4 FROM unnest($1::text[], $2::float8[], $3::text[]) AS x(k, s, t)`,
      [
        kept.map((x) => storedKey(x.key)),
        kept.map((x) => x.amount),
        kept.map((x) => x.tool ?? null),
        this.opts.replica,
      ],
    );
  }

  /**
   * The line as the meter sees it: charges, every hold, and the other replicas' running calls
   * (their overruns grow as the meter waits; it counts them from their time run so far).
   */
  async standing(key: string, limitS = this.opts.limitS): Promise<LineStanding> {
    const line = await this.read(this.pool, key);
    const rows = (
      await this.pool.query(
        `SELECT ${NOW_MS} - started_ms AS elapsed_ms, seconds, rate FROM budget_reservations
         WHERE principal = $1 AND replica <> $2 AND started_ms IS NOT NULL
           AND expires_ms > ${NOW_MS}`,
        [storedKey(key), this.opts.replica],
      )
    ).rows as { elapsed_ms: string; seconds: number; rate: number }[];
    const others: OtherRun[] = rows.map((r) => ({
      elapsedMs: Math.max(0, Number(r.elapsed_ms)),
      reservedS: Number(r.seconds),
      rate: Number(r.rate),
    }));
    return {
      charged_s: round3(Math.max(0, line.charged)),
      reserved_s: line.held,
      limit_s: limitS,
      window_s: this.windowMs / 1000,
      others,
    };
  }

  /** A charge without a hold (reconcile.ts): joins the transaction in progress, if any. */
  async charge(key: string, seconds: number, tool?: string): Promise<void> {
    await this.insertCharges(queryable(this.pool), [{ key, amount: seconds, tool }]);
  }

  /** Charged inside the window now. */
  async charged(key: string): Promise<number> {
    return (await this.read(this.pool, key)).charged;
  }

  /**
   * One renewal: this replica's holds get a fresh lease, and the meter looks again at its
   * running lines, where other replicas' calls may have started or ended since. Charges that
   * left the window are pruned now and then.
   */
  async renew(): Promise<void> {
    if (this.holds.size > 0)
      await this.pool.query(
        `UPDATE budget_reservations SET expires_ms = ${NOW_MS} + $2::bigint WHERE id = ANY($1)`,
        [[...this.holds], this.leaseMs],
      );
    const running = [...(this.meter?.excess().keys() ?? [])];
    if (running.length > 0) this.meter?.lookAgain(running);
    if (++this.renewals % 60 === 0) {
      await this.pool.query(`DELETE FROM budget_charges WHERE time_ms <= ${NOW_MS} - $1::bigint`, [
        this.windowMs,
      ]);
      await this.pool.query(`DELETE FROM budget_reservations WHERE expires_ms <= ${NOW_MS}`);
    }
  }

  /** Stops renewing (what this replica still holds runs out with its lease). */
  close(): void {
    clearInterval(this.timer);
  }
}

function round3(x: number): number {
  return Math.round(x * 1000) / 1000;
}
