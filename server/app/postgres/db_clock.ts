// This replica's clock against the database's. Shared expiries (budget windows, leases,
// approvals) are computed in SQL on the database's clock; what a replica computes itself and
// another replica checks (a request state's expiry) must be on that clock too. So at start the
// replica measures how far its own clock is off the database's: beyond the bound
// (`storage.postgres.max_clock_skew_ms`) it refuses to start, and within it its database clock
// is its own clock corrected by the offset, measured again every REMEASURE_MS.
import { systemClock, type Clock } from "../../../policies/clock.js";
import type { PgPool } from "../../stores/pg/pool.js";

/** The bound a replica's clock may be off the database's (storage.postgres.max_clock_skew_ms). */
export const DEFAULT_MAX_CLOCK_SKEW_MS = 5_000;
/** How often a running replica measures its offset again (its clock may be stepped meanwhile). */
const REMEASURE_MS = 30_000;

/** This clock minus the database's, ms; `rttMs`: the round trip (the measure's uncertainty). */
export interface Skew {
  skewMs: number;
  rttMs: number;
}

/** One round trip: the database's clock against the midpoint of `clock` before and after. */
export async function measureSkew(pool: PgPool, clock: Clock = systemClock): Promise<Skew> {
  const before = clock();
  const r = await pool.query("SELECT extract(epoch from clock_timestamp()) * 1000 AS now_ms");
  const after = clock();
  return {
    skewMs: Math.round((before + after) / 2 - Number(r.rows[0].now_ms)),
    rttMs: after - before,
  };
}

/** What a skew is, in words: how much, which way. */
export function describeSkew(skewMs: number): string {
  const s = Math.abs(skewMs) / 1000;
  const much = s >= 1 ? `${s.toFixed(1)} s` : `${Math.abs(skewMs)} ms`;
  return `this machine's clock is ${much} ${skewMs > 0 ? "ahead of" : "behind"} the database's`;
}

export class ClockSkewError extends Error {
  constructor(
    readonly skewMs: number,
    readonly maxSkewMs: number,
  ) {
    super(
      `${describeSkew(skewMs)}, more than storage.postgres.max_clock_skew_ms (${maxSkewMs} ms): this replica does not start, since budget windows, leases and request states' expiries are kept on the database's clock and would be read wrongly here. Sync this machine's clock with NTP (chrony, systemd-timesyncd: \`timedatectl set-ntp true\`, then check \`chronyc tracking\` or \`timedatectl timesync-status\`) and start it again.`,
    );
    this.name = "ClockSkewError";
  }
}

/** The database's clock as this replica reads it: its own clock corrected by the offset. */
export interface DatabaseClock {
  now: Clock;
  /** The offset last measured (this clock minus the database's). */
  skewMs(): number;
  close(): void;
}

/**
 * Measures the offset; throws ClockSkewError when it is beyond `maxSkewMs` (the half round trip
 * is given to the replica: a slow link alone never refuses it). `onDrift` hears a later measure
 * beyond the bound (the clock was stepped after start); the database clock follows it anyway.
 */
export async function openDatabaseClock(
  pool: PgPool,
  opts: { clock?: Clock; maxSkewMs?: number; onDrift?: (skewMs: number) => void } = {},
): Promise<DatabaseClock> {
  const clock = opts.clock ?? systemClock;
  const max = opts.maxSkewMs ?? DEFAULT_MAX_CLOCK_SKEW_MS;
  const beyond = (s: Skew) => Math.abs(s.skewMs) - s.rttMs / 2 > max;
  const first = await measureSkew(pool, clock);
  if (beyond(first)) throw new ClockSkewError(first.skewMs, max);
  let offset = first.skewMs;
  const timer = setInterval(() => {
    measureSkew(pool, clock)
      .then((s) => {
        offset = s.skewMs;
        if (beyond(s)) opts.onDrift?.(s.skewMs);
      })
      .catch(() => {});
  }, REMEASURE_MS);
  timer.unref();
  return {
    now: () => clock() - offset,
    skewMs: () => offset,
    close: () => clearInterval(timer),
  };
}
