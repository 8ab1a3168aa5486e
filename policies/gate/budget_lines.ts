// The budget lines a call is charged to, and the estimates held against them while admitted
// calls run. The ledger (limits/budget.ts) records what calls cost; this adds what admitted
// calls are expected to cost, so calls queued behind each other cannot all pass one check.

import type { Clock } from "../clock.js";
import type { LimitsConfig } from "../config.js";
import { PolicyError } from "../errors.js";
import type { CostEstimate } from "../estimate.js";
import type { BudgetLedger } from "../limits/budget.js";
import { requiredScope, type Principal, type Scope } from "../scopes.js";
import type { ToolPolicy } from "../tool_policy.js";

/** Read-scoped tools that use the device draw on a small allowance of their own as well. */
const READ_SCOPE: Scope = "models:read";
const READ_KEY_SUFFIX = "\u0000read";

/** What a capped call may use while it runs (BudgetLines.claimCap). */
export interface Cap {
  /** Seconds the call may run before the line runs out. */
  seconds: number;
  limit_s: number;
  window_s: number;
  /** Gives back the hold raised for the run. */
  release: () => void;
}

export class BudgetLines {
  /**
   * Estimated device-seconds admitted but not yet settled, per budget line. Reserved at
   * admission (before waiting for a slot), released when the call settles with its measured
   * cost, or at once when it is refused or cancelled.
   */
  private readonly reserved = new Map<string, number>();

  constructor(
    private readonly limits: LimitsConfig,
    private readonly ledger: BudgetLedger,
    private readonly clock: Clock,
    private readonly tools: ReadonlyMap<string, ToolPolicy>,
  ) {}

  /** The principal's line, and for read-scoped tools its read allowance. */
  private lines(principal: string, tool: string): { key: string; limit?: number }[] {
    const keys: { key: string; limit?: number }[] = [{ key: principal }];
    if (requiredScope(this.tools.get(tool)) === READ_SCOPE) {
      keys.push({
        key: `${principal}${READ_KEY_SUFFIX}`,
        limit: this.limits.budget.read_device_seconds_per_window,
      });
    }
    return keys;
  }

  /** Throws budget_exceeded when a line cannot take the estimate now (charges plus reservations). */
  check(principal: Principal, tool: string, estimate: CostEstimate | undefined): void {
    if (!estimate) return;
    const need = estimate.device_seconds;
    for (const { key, limit } of this.lines(principal.id, tool)) {
      const b = this.ledger.check(key, need, this.reserved.get(key) ?? 0, limit);
      if (b.ok) continue;
      const what =
        key === principal.id ? "Device-time budget" : "Device-time allowance for read-scoped tools";
      const when =
        b.retry_after_ms !== undefined
          ? `enough frees up in ${Math.ceil(b.retry_after_ms / 1000)} s`
          : b.reserved_s > 0 && need <= b.limit_s
            ? `calls of yours already admitted hold ${b.reserved_s} s of it; retry when they finish`
            : `it can never fit (the whole budget is ${b.limit_s} s); make the call smaller`;
      throw new PolicyError(
        "budget_exceeded",
        `${what} exceeded: this call needs ~${need} s, ${b.remaining_s} s of ${b.limit_s} s per ${b.window_s} s window remain; ${when}.`,
        {
          needed_s: need,
          remaining_s: b.remaining_s,
          used_s: b.used_s,
          reserved_s: b.reserved_s,
          limit_s: b.limit_s,
          window_s: b.window_s,
          retry_after_ms: b.retry_after_ms ?? null,
          resets_at:
            b.retry_after_ms !== undefined
              ? new Date(this.clock() + b.retry_after_ms).toISOString()
              : null,
        },
      );
    }
  }

  /** Holds the estimate against every line of the call; the returned function releases it once. */
  reserve(principal: string, tool: string, estimate: CostEstimate | undefined): () => void {
    const seconds = estimate?.device_seconds ?? 0;
    const keys = this.lines(principal, tool).map((k) => k.key);
    for (const k of keys) this.adjust(k, seconds);
    let done = false;
    return () => {
      if (done) return;
      done = true;
      for (const k of keys) this.adjust(k, -seconds);
    };
  }

  /**
   * For a call about to run: the seconds it may use before a capped line of its own (the read
   * allowance) runs out: the line's limit less what the window has charged and what every other
   * admitted call holds. Undefined when no line of the call is capped, or it is not charged (no
   * estimate). While the call runs its hold on those lines is raised to that many seconds, so
   * calls running at once (on other lanes or workers) cannot spend the same seconds twice;
   * `release` gives the extra hold back, once.
   */
  claimCap(principal: string, tool: string, estimate: CostEstimate | undefined): Cap | undefined {
    if (!estimate) return undefined;
    const own = estimate.device_seconds;
    let cap: Cap | undefined;
    const capped: string[] = [];
    for (const { key, limit } of this.lines(principal, tool)) {
      if (limit === undefined) continue;
      capped.push(key);
      const others = Math.max(0, (this.reserved.get(key) ?? 0) - own);
      const b = this.ledger.check(key, 0, others, limit);
      const left = Math.max(0, limit - b.used_s);
      if (!cap || left < cap.seconds)
        cap = { seconds: left, limit_s: b.limit_s, window_s: b.window_s, release: () => {} };
    }
    if (!cap) return undefined;
    const extra = Math.max(0, cap.seconds - own);
    for (const k of capped) this.adjust(k, extra);
    let done = false;
    cap.release = () => {
      if (done) return;
      done = true;
      for (const k of capped) this.adjust(k, -extra);
    };
    return cap;
  }

  /** Charges what the call measured to every line of the call. */
  charge(principal: string, tool: string, seconds: number): void {
    for (const { key } of this.lines(principal, tool)) this.ledger.charge(key, seconds, tool);
  }

  private adjust(key: string, seconds: number): void {
    const v = (this.reserved.get(key) ?? 0) + seconds;
    if (v <= 1e-9) this.reserved.delete(key);
    else this.reserved.set(key, v);
  }
}
