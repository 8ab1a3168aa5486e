// The per-principal rate limit: one token bucket per caller, kept in memory (a restart refills
// every bucket, which a per-minute allowance can afford).

import { systemClock, type Clock } from "../clock.js";

export type RateDecision = { ok: true; remaining: number } | { ok: false; retry_after_ms: number };

/** A per-principal allowance of calls per minute (the gate's rate step). */
export interface RateLimit {
  /** Takes `cost` from the principal's allowance if it holds it: one atomic step. */
  take(principal: string, cost?: number): Promise<RateDecision>;
  /** Gives `cost` back (a reservation that turned out not to count), up to the allowance. */
  refund(principal: string, cost?: number): Promise<void>;
}

/** Token bucket per principal: bursts up to the per-minute allowance, refilled continuously. */
export class RateLimiter implements RateLimit {
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

  // In memory: answered inside the call, resolved at once.
  async take(principal: string, cost = 1): Promise<RateDecision> {
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

  /** Gives `cost` back (a reservation that turned out not to count), up to the allowance. */
  async refund(principal: string, cost = 1): Promise<void> {
    const b = this.buckets.get(principal);
    if (b) b.tokens = Math.min(this.capacity, b.tokens + cost);
  }

  // JWT subjects are unbounded in number: drop buckets that have refilled (they equal a new one).
  private prune(now: number): void {
    if (this.buckets.size < 10_000) return;
    for (const [k, b] of this.buckets) {
      if (b.tokens + (now - b.at) * this.perMs >= this.capacity) this.buckets.delete(k);
    }
  }
}
