// Rate limits on the shared store: one token bucket per (scope, key) as a row, refilled and taken
// in ONE statement (an upsert holds the row's lock for its update), so replicas share one
// allowance: a caller spread over three replicas gets what it gets from one. Same buckets as
// policies/limits/rate.ts (bursts up to the per-minute allowance, refilled continuously), on the
// database's clock.
import type { RateDecision, RateLimit } from "../../../policies/limits/rate.js";
import type { PgPool } from "../../stores/pg/pool.js";

// One instant per statement: the refill and the stamp read the same time.
const NOW_MS = "(extract(epoch from statement_timestamp()) * 1000)::bigint";
/** Buckets are pruned (the full ones, which equal a new bucket) every this many takes. */
const PRUNE_EVERY = 1000;

export class PgRateLimit implements RateLimit {
  private readonly capacity: number;
  private readonly perMs: number;
  private takes = 0;

  /** `scope` names the allowance (one table holds every limiter's buckets). */
  constructor(
    private readonly pool: PgPool,
    private readonly scope: string,
    perMinute: number,
  ) {
    if (!(perMinute > 0)) throw new RangeError("perMinute must be > 0");
    this.capacity = perMinute;
    this.perMs = perMinute / 60_000;
  }

  async take(key: string, cost = 1): Promise<RateDecision> {
    // The bucket refilled to now, in the update's terms (every expression reads the old row).
    const refilled = `LEAST($3::float8, b.tokens + GREATEST(0, ${NOW_MS} - b.at_ms) * $5::float8)`;
    const r = await this.pool.query(
      `INSERT INTO rate_buckets AS b (scope, key, tokens, at_ms, took)
       VALUES ($1, $2, CASE WHEN $3::float8 >= $4::float8 THEN $3::float8 - $4::float8 ELSE $3::float8 END,
               ${NOW_MS}, $3::float8 >= $4::float8)
       ON CONFLICT (scope, key) DO UPDATE SET
         tokens = CASE WHEN ${refilled} >= $4::float8 THEN ${refilled} - $4::float8 ELSE ${refilled} END,
         took = ${refilled} >= $4::float8,
         at_ms = ${NOW_MS}
       RETURNING tokens, took`,
      [this.scope, key, this.capacity, cost, this.perMs],
    );
    if (++this.takes % PRUNE_EVERY === 0) void this.prune().catch(() => {});
    const { tokens, took } = r.rows[0] as { tokens: number; took: boolean };
    if (took) return { ok: true, remaining: Math.floor(tokens) };
    return { ok: false, retry_after_ms: Math.ceil((cost - tokens) / this.perMs) };
  }

  /** Gives `cost` back, up to the allowance. */
  async refund(key: string, cost = 1): Promise<void> {
    await this.pool.query(
      "UPDATE rate_buckets SET tokens = LEAST($3::float8, tokens + $4::float8) WHERE scope = $1 AND key = $2",
      [this.scope, key, this.capacity, cost],
    );
  }

  // Keys (JWT subjects, addresses) are unbounded in number: drop buckets that have refilled.
  private async prune(): Promise<void> {
    await this.pool.query(
      `DELETE FROM rate_buckets
       WHERE scope = $1 AND tokens + GREATEST(0, ${NOW_MS} - at_ms) * $3::float8 >= $2::float8`,
      [this.scope, this.capacity, this.perMs],
    );
  }
}
