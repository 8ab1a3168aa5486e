// The one limiter for failed authentication, on every path that checks a credential: /mcp and
// /metrics bearer tokens, the console's sign-in (token or passkey) and its passkey enrolment
// codes. It rations only what cannot be known without work: a credential recognised at once (a
// configured token, a JWT verified lately: Authenticator.recognize) never reaches it, so a valid
// credential is never refused because of failures that were not its own (on one machine every
// client, attacker included, is 127.0.0.1). An unknown credential reserves its evaluation first,
// so concurrent ones from one address cannot all be evaluated: an evaluation in progress counts
// as a failure until it succeeds (requests beyond that wait their turn, up to 64 per address,
// and are decided again when one ends). Checks without I/O (a passkey assertion, an enrolment
// code) ask check() before they evaluate and count their failures with fail(); like an unknown
// token, they wait out their address's back-off.
//
// Per client address (an IPv6 address by its /64): `free` failures, then exponential back-off
// (1 s, 2 s, 4 s, … up to `maxDelayMs`) with one evaluation at a time. Success never resets the
// count (a valid low-privilege token would otherwise buy unlimited guesses at another one).
// Behind it, one server-wide budget of `perMinute` evaluations that fail, for attackers with many
// addresses; a failure is charged to it only while its address is not in back-off, so one
// address cannot drain it for everyone else. Refusals are answered 429 with Retry-After by the
// caller; what happened is reported once per address and window (at most `maxReports` records),
// never once per guess. Requests refused for carrying no credential at all (noCredential()) are
// neither failures nor charged; they are only counted into the same report, so a token-less
// flood is not a log line per request either.
import type { Clock } from "../policies/clock.js";
import { RateLimiter, type RateLimit } from "../policies/limits/rate.js";

export interface AuthLimitOptions {
  /** Failures an address may make before back-off starts. */
  free: number;
  /** The longest back-off between two evaluations from one address. */
  maxDelayMs: number;
  /** Failed evaluations per minute, server-wide (bursts up to the same number). */
  perMinute: number;
  /**
   * The counter of that server-wide budget, when the storage port holds it (server/app/storage.ts);
   * absent: a bucket of this limiter's own, on its clock.
   */
  budget?: RateLimit;
  clock?: Clock;
  /** Called every `reportEveryMs` (and at close) with what the window saw; bounded. */
  report?: (lines: AuthLimitReport[]) => void;
  reportEveryMs?: number;
  /** Addresses reported one by one per window; the rest are folded into one line. */
  maxReports?: number;
}

export interface AuthLimitReport {
  /** The address (IPv6 by /64), or null for the line that folds the rest. */
  address: string | null;
  /** How many addresses the line covers (1, or more for the folded line). */
  addresses: number;
  failed: number;
  refused: number;
  /** Requests refused for carrying no credential (not failures: nothing was guessed). */
  withoutCredential: number;
  surfaces: string[];
}

export type Admission =
  { ok: true; ticket: AuthTicket } | { ok: false; retryAfterS: number; why: string };

/** One reserved evaluation: settle it once; `settle(false)` after a success is a no-op. */
export interface AuthTicket {
  settle(ok: boolean): void;
}

interface Entry {
  fails: number;
  lastFailAt: number;
  pending: number;
  /** Requests waiting for an evaluation in progress to end (at most MAX_WAITING). */
  waiters: (() => void)[];
  // Since the last report:
  failed: number;
  refused: number;
  withoutCredential: number;
  /** Whether the caller logged this window's first request without a credential itself. */
  loggedAtOnce: boolean;
  surfaces: Set<string>;
}

/** After this long without a failure an address starts again with its free failures. */
const FORGET_MS = 15 * 60_000;
/** Requests from one address that may wait for a slot; more are refused at once. */
const MAX_WAITING = 64;
/** Addresses remembered at once (an IPv6 /64 is one; the global budget bounds the rate). */
const MAX_ENTRIES = 50_000;

/** The key an address is limited by: IPv4 as is, IPv6 by its /64 (one host owns a /64). */
export function addressKey(addr: string | undefined): string {
  if (!addr) return "?";
  const v4 = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(addr);
  if (v4) return v4[1];
  if (!addr.includes(":")) return addr;
  const [head, tail] = addr.split("%")[0].split("::");
  const left = head ? head.split(":") : [];
  const right = tail !== undefined && tail !== "" ? tail.split(":") : [];
  const fill =
    tail === undefined ? [] : Array(Math.max(0, 8 - left.length - right.length)).fill("0");
  const groups = [...left, ...fill, ...right].map((g) => (parseInt(g, 16) || 0).toString(16));
  return `${groups.slice(0, 4).join(":")}::/64`;
}

/** The one key of the server-wide budget. */
const SERVER = "*";

export class AuthLimiter {
  private readonly entries = new Map<string, Entry>();
  private readonly clock: Clock;
  /** The server-wide budget of failed evaluations: one bucket (the project's token bucket). */
  private readonly budget: RateLimit;
  private readonly timer: NodeJS.Timeout;
  /** Addresses whose first request without a credential was logged at once, this window. */
  private loggedAtOnce = 0;

  constructor(private readonly opts: AuthLimitOptions) {
    this.clock = opts.clock ?? Date.now;
    this.budget = opts.budget ?? new RateLimiter(opts.perMinute, this.clock);
    this.timer = setInterval(() => this.flush(), opts.reportEveryMs ?? 60_000);
    this.timer.unref();
  }

  /** The back-off after `fails` failures (0 while the free ones last). */
  delayMs(fails: number): number {
    if (fails < this.opts.free) return 0;
    return Math.min(this.opts.maxDelayMs, 1000 * 2 ** Math.min(30, fails - this.opts.free));
  }

  /**
   * Reserves one evaluation of a credential from `address`, or says how long to wait. While the
   * free failures last, a request beyond them waits for an evaluation in progress to end (a
   * client's parallel requests are queued, not refused), then is decided again.
   */
  async admit(address: string | undefined, surface: string): Promise<Admission> {
    const key = addressKey(address);
    for (;;) {
      const now = this.clock();
      const e = this.entry(key, now);
      const busy = e.fails < this.opts.free && e.fails + e.pending >= this.opts.free;
      if (!busy || e.waiters.length >= MAX_WAITING) return this.decide(e, now, surface);
      await new Promise<void>((wake) => e.waiters.push(wake));
    }
  }

  /**
   * For a check without a reservation, before it is evaluated: the refusal when its address is
   * in back-off (counted and reported, nothing evaluated or charged), else null.
   */
  check(address: string | undefined, surface: string): { retryAfterS: number; why: string } | null {
    const now = this.clock();
    const e = this.entry(addressKey(address), now);
    const wait = this.backoff(e, now);
    if (!wait) return null;
    e.refused++;
    e.surfaces.add(surface);
    return { retryAfterS: Math.max(1, Math.ceil(wait.waitMs / 1000)), why: wait.why };
  }

  /**
   * Counts one failure that was evaluated without a reservation (a refused passkey assertion, a
   * wrong enrolment code; the caller asked check() first). Reported like any other; says how long
   * the address now waits when it is in back-off (the caller answers 429 then).
   */
  fail(address: string | undefined, surface: string): { retryAfterS: number } | null {
    const now = this.clock();
    const e = this.entry(addressKey(address), now);
    // Charged to the server-wide budget only outside the address's back-off: evaluations that
    // ended after it began (concurrent ones) must not spend everyone else's budget.
    if (!this.backoff(e, now)) this.budget.take(SERVER).catch(() => {});
    e.fails++;
    e.failed++;
    e.surfaces.add(surface);
    e.lastFailAt = now;
    const wait = this.delayMs(e.fails);
    return wait > 0 ? { retryAfterS: Math.max(1, Math.ceil(wait / 1000)) } : null;
  }

  /**
   * Counts one request refused for carrying no credential (no back-off, no budget: nothing was
   * guessed) into the window's report. True when the caller should log this one at once: the
   * address's first of the window, for at most `maxReports` addresses per window; the rest are
   * only in the report.
   */
  noCredential(address: string | undefined, surface: string): boolean {
    const e = this.entry(addressKey(address), this.clock());
    e.withoutCredential++;
    e.surfaces.add(surface);
    if (e.withoutCredential > 1 || this.loggedAtOnce >= (this.opts.maxReports ?? 10)) return false;
    this.loggedAtOnce++;
    e.loggedAtOnce = true;
    return true;
  }

  /** How long `e` must wait before its next evaluation, and why; null when it may go now. */
  private backoff(e: Entry, now: number): { waitMs: number; why: string } | null {
    if (e.fails < this.opts.free) return null;
    const wait = e.lastFailAt + this.delayMs(e.fails) - now;
    if (e.pending > 0)
      return {
        waitMs: Math.max(wait, 1000),
        why: "an authentication from this address is in progress",
      };
    if (wait > 0) return { waitMs: wait, why: "too many failed authentications from this address" };
    return null;
  }

  private async decide(e: Entry, now: number, surface: string): Promise<Admission> {
    const refuse = (waitMs: number, why: string): Admission => {
      e.refused++;
      e.surfaces.add(surface);
      return { ok: false, retryAfterS: Math.max(1, Math.ceil(waitMs / 1000)), why };
    };
    const wait = this.backoff(e, now);
    if (wait) return refuse(wait.waitMs, wait.why);
    if (e.fails < this.opts.free && e.fails + e.pending >= this.opts.free) {
      return refuse(1000, "too many authentications in progress from this address");
    }
    // The slot is held while the server-wide budget answers, so no other request takes it.
    e.pending++;
    let server;
    try {
      server = await this.budget.take(SERVER);
    } catch {
      server = { ok: false as const, retry_after_ms: 1000 };
    }
    if (!server.ok) {
      e.pending--;
      for (const wake of e.waiters.splice(0)) wake();
      return refuse(server.retry_after_ms, "too many failed authentications on this server");
    }
    let settled = false;
    return {
      ok: true,
      ticket: {
        settle: (ok) => {
          if (settled) return;
          settled = true;
          e.pending--;
          // Every waiter decides again (in order): a success frees a slot, a failure may start
          // the back-off, which refuses them.
          for (const wake of e.waiters.splice(0)) wake();
          if (ok) {
            // A success gives its reservation back to the server-wide budget.
            this.budget.refund(SERVER).catch(() => {});
            return;
          }
          e.fails++;
          e.failed++;
          e.surfaces.add(surface);
          e.lastFailAt = this.clock();
        },
      },
    };
  }

  private entry(key: string, now: number): Entry {
    let e = this.entries.get(key);
    if (e && e.pending === 0 && e.fails > 0 && now - e.lastFailAt > FORGET_MS) e.fails = 0;
    if (!e) {
      if (this.entries.size >= MAX_ENTRIES) this.prune(now, true);
      e = {
        fails: 0,
        lastFailAt: 0,
        pending: 0,
        waiters: [],
        failed: 0,
        refused: 0,
        withoutCredential: 0,
        loggedAtOnce: false,
        surfaces: new Set(),
      };
      this.entries.set(key, e);
    }
    return e;
  }

  /** Drops forgotten addresses; when `hard`, also the oldest idle ones until there is room. */
  private prune(now: number, hard = false): void {
    for (const [k, e] of this.entries) {
      const idle =
        e.pending === 0 &&
        e.waiters.length === 0 &&
        e.failed === 0 &&
        e.refused === 0 &&
        e.withoutCredential === 0;
      if (idle && (e.fails === 0 || now - e.lastFailAt > FORGET_MS)) this.entries.delete(k);
    }
    if (!hard) return;
    for (const [k, e] of this.entries) {
      if (this.entries.size < MAX_ENTRIES) break;
      if (e.pending === 0 && e.waiters.length === 0) this.entries.delete(k);
    }
  }

  /** Reports the window's failures and refusals (bounded), then forgets what is over. */
  flush(): void {
    // A lone request without a credential that the caller logged at once needs no second line.
    const seen = [...this.entries].filter(
      ([, e]) => e.failed > 0 || e.refused > 0 || e.withoutCredential > (e.loggedAtOnce ? 1 : 0),
    );
    const weight = (e: Entry) => e.failed + e.refused + e.withoutCredential;
    seen.sort((a, b) => weight(b[1]) - weight(a[1]));
    const max = this.opts.maxReports ?? 10;
    const lines: AuthLimitReport[] = seen.slice(0, max).map(([k, e]) => ({
      address: k,
      addresses: 1,
      failed: e.failed,
      refused: e.refused,
      withoutCredential: e.withoutCredential,
      surfaces: [...e.surfaces].sort(),
    }));
    const rest = seen.slice(max);
    if (rest.length) {
      lines.push({
        address: null,
        addresses: rest.length,
        failed: rest.reduce((n, [, e]) => n + e.failed, 0),
        refused: rest.reduce((n, [, e]) => n + e.refused, 0),
        withoutCredential: rest.reduce((n, [, e]) => n + e.withoutCredential, 0),
        surfaces: [...new Set(rest.flatMap(([, e]) => [...e.surfaces]))].sort(),
      });
    }
    // Every entry, not only those reported: a lone logged one must not carry into the next window.
    for (const [, e] of this.entries) {
      e.failed = 0;
      e.refused = 0;
      e.withoutCredential = 0;
      e.loggedAtOnce = false;
      e.surfaces.clear();
    }
    this.loggedAtOnce = 0;
    this.prune(this.clock());
    if (lines.length) this.opts.report?.(lines);
  }

  close(): void {
    clearInterval(this.timer);
    this.flush();
  }
}
