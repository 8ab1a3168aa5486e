// The arithmetic of alert rules, pure (no clock, no store): how many events a key had in the
// last window, and whether a rule that fired for a key may fire again (once per window).
//
// Counting: a window of `windowMs` is kept as BUCKETS sub-windows, so the count at `now` is the
// events of the buckets that overlap [now − windowMs, now]: every event of the last windowMs is
// counted, and events up to one bucket older may be too (a rule can fire up to windowMs/10 early,
// never late). Memory is BUCKETS numbers per key, whatever the number of events.

const BUCKETS = 10;
/** The buckets kept: one more than the window holds, for the bucket the window's start falls in. */
const SLOTS = BUCKETS + 1;

interface Counter {
  /** Index of the newest bucket (floor(t / bucketMs)). */
  at: number;
  counts: number[];
}

/** Events per key over a sliding window. */
export class EventWindows {
  private readonly counters = new Map<string, Counter>();
  private readonly bucketMs: number;

  constructor(
    readonly windowMs: number,
    private readonly maxKeys = 10_000,
  ) {
    if (!(windowMs > 0)) throw new RangeError("windowMs must be > 0");
    this.bucketMs = windowMs / BUCKETS;
  }

  /** Adds `n` events for `key` at `nowMs`; returns the key's count in the window after them. */
  add(key: string, nowMs: number, n = 1): number {
    const idx = Math.floor(nowMs / this.bucketMs);
    let c = this.counters.get(key);
    if (!c) {
      if (this.counters.size >= this.maxKeys) this.prune(idx);
      c = { at: idx, counts: new Array<number>(SLOTS).fill(0) };
      this.counters.set(key, c);
    }
    this.advance(c, idx);
    c.counts[idx % SLOTS] += n;
    return c.counts.reduce((a, b) => a + b, 0);
  }

  /** The key's count in the window at `nowMs` (0 for a key never seen). */
  count(key: string, nowMs: number): number {
    const c = this.counters.get(key);
    if (!c) return 0;
    this.advance(c, Math.floor(nowMs / this.bucketMs));
    return c.counts.reduce((a, b) => a + b, 0);
  }

  /** Forgets the key's events (its count starts again from 0). */
  reset(key: string): void {
    this.counters.delete(key);
  }

  /** Moves the counter to bucket `idx`, zeroing the buckets that left the window. */
  private advance(c: Counter, idx: number): void {
    if (idx <= c.at) return;
    const steps = Math.min(SLOTS, idx - c.at);
    for (let i = 1; i <= steps; i++) c.counts[(c.at + i) % SLOTS] = 0;
    c.at = idx;
  }

  // Many principals (JWT subjects): drop the counters whose window has emptied, then the oldest.
  private prune(idx: number): void {
    for (const [k, c] of this.counters) if (idx - c.at >= SLOTS) this.counters.delete(k);
    while (this.counters.size >= this.maxKeys) {
      const oldest = this.counters.keys().next().value as string;
      this.counters.delete(oldest);
    }
  }
}

/**
 * Once per window: a rule that fired for a key stays quiet for that key until `quietUntil`.
 * Seeded from the alert store at start, so a restart does not fire again within the window.
 */
export class FiringLatch {
  private readonly quiet = new Map<string, number>();

  constructor(seed: Iterable<[key: string, quietUntilMs: number]> = []) {
    this.seed(seed);
  }

  /** Keys known quiet (read from the store): each stays quiet until the later of its ends. */
  seed(entries: Iterable<[key: string, quietUntilMs: number]>): void {
    for (const [k, t] of entries) this.quiet.set(k, Math.max(t, this.quiet.get(k) ?? t));
  }

  /** True (and the key goes quiet until `quietUntilMs`) when the key is not quiet at `nowMs`. */
  tryFire(key: string, nowMs: number, quietUntilMs: number): boolean {
    const until = this.quiet.get(key);
    if (until !== undefined && nowMs < until) return false;
    this.quiet.set(key, quietUntilMs);
    if (this.quiet.size > 10_000)
      for (const [k, t] of this.quiet) if (t <= nowMs) this.quiet.delete(k);
    return true;
  }
}
