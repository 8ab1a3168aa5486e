// The budget lines a call is charged to, the estimates held against them while admitted calls
// run, and the meter that stops a running call when a line runs out. The ledger
// (limits/budget.ts) records what calls cost; this adds what admitted calls are expected to cost,
// so calls queued behind each other cannot all pass one check, and what running calls use beyond
// their estimates, so a budget is a cap rather than a reservation (limits/meter.ts).

import type { Clock } from "../clock.js";
import type { LimitsConfig } from "../config.js";
import { PolicyError } from "../errors.js";
import type { CostEstimate } from "../estimate.js";
import type { BudgetLedger } from "../limits/budget.js";
import { requiredScope, type Principal, type Scope } from "../scopes.js";
import type { ToolPolicy } from "../tool_policy.js";
import { dueNow, lineStopInMs, usedS, type LineState, type Runner } from "../limits/meter.js";

/** Read-scoped tools that use the device draw on a small allowance of their own as well. */
const READ_SCOPE: Scope = "models:read";
const READ_KEY_SUFFIX = "\u0000read";

/** Which line stopped a metered call, and how it stood: for the call's budget_exceeded. */
export interface CapStop {
  /** The read allowance rather than the principal's budget. */
  readAllowance: boolean;
  /** Device-seconds the call had used when the line ran out (the stop is sent then). */
  usedS: number;
  limitS: number;
  windowS: number;
  /** Charged on the line in the window, plus what admitted calls hold, when it was stopped. */
  lineUsedS: number;
}

/** A call being metered (BudgetLines.meter); `end` stops the metering, once. */
export interface Metered {
  end(): void;
}

/**
 * Clears the line's timer. Node keeps the (empty) list of an unref'd timer's duration when that
 * timer is cleared, until the duration would have elapsed: the meter re-arms with a new duration
 * on every call's start and end, so those lists piled up (about 3 per call, ~500 bytes per call
 * of live heap). Ref'd again first, the timer's list goes with it; it stays unref'd while set.
 */
function clearLineTimer(line: Line): void {
  line.timer?.ref();
  clearTimeout(line.timer);
  line.timer = undefined;
}

/** Longest timer Node keeps (2^31 − 1 ms): a stop further away is looked at again then. */
const MAX_TIMER_MS = 2_147_483_647;

interface Running {
  runner: Runner;
  keys: { key: string; limit?: number }[];
  onStop: (stop: CapStop) => void;
  stopped: boolean;
}

/** The calls running on one line, and the timer set for the first of them to stop. */
interface Line {
  limit?: number;
  runs: Set<Running>;
  timer?: NodeJS.Timeout;
  /** When the timer was due (the line ran out then, however late the timer fires). */
  dueMs?: number;
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

  /**
   * The principal's line, and for read-scoped tools its read allowance (but for a cold start:
   * a model's first check in a fresh worker is charged to the budget only).
   */
  private lines(
    principal: string,
    tool: string,
    estimate?: CostEstimate,
  ): { key: string; limit?: number }[] {
    const keys: { key: string; limit?: number }[] = [{ key: principal }];
    if (requiredScope(this.tools.get(tool)) === READ_SCOPE && !estimate?.cold_start) {
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
    for (const { key, limit } of this.lines(principal.id, tool, estimate)) {
      const b = this.ledger.check(key, need, this.held(key), limit);
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
    const keys = this.lines(principal, tool, estimate).map((k) => k.key);
    for (const k of keys) this.adjust(k, seconds);
    this.rearm(keys.map((key) => ({ key })));
    let done = false;
    return () => {
      if (done) return;
      done = true;
      for (const k of keys) this.adjust(k, -seconds);
      this.rearm(keys.map((key) => ({ key })));
    };
  }

  /**
   * Meters a call as it runs, on every line it is charged to: `onStop` is called (once) when its
   * device time reaches its estimate plus what is left of a line, shared with the principal's
   * other running calls (limits/meter.ts has the rule). Undefined for a call that is not charged
   * (no estimate). The meter reads the gate's clock, not worker reports: the charge is the gate's
   * wall time of the work, so the same clock bounds exactly what will be charged, also for an op
   * that reports nothing for seconds (a load, a long forward) or a worker that hangs; progress
   * messages would only say sooner what this clock already knows.
   */
  meter(
    principal: string,
    tool: string,
    estimate: CostEstimate | undefined,
    onStop: (stop: CapStop) => void,
  ): Metered | undefined {
    if (!estimate) return undefined;
    const run: Running = {
      runner: { startedMs: this.clock(), reservedS: estimate.device_seconds },
      keys: this.lines(principal, tool, estimate),
      onStop,
      stopped: false,
    };
    for (const { key, limit } of run.keys) {
      let line = this.running.get(key);
      if (!line) this.running.set(key, (line = { limit, runs: new Set() }));
      line.runs.add(run);
    }
    this.rearm(run.keys);
    let ended = false;
    return {
      end: () => {
        if (ended) return;
        ended = true;
        for (const { key } of run.keys) {
          const line = this.running.get(key);
          line?.runs.delete(run);
          if (line?.runs.size === 0) {
            clearLineTimer(line);
            this.running.delete(key);
          }
        }
        this.rearm(run.keys);
      },
    };
  }

  /** What admitted calls hold on a line: their estimates, and what running ones used beyond. */
  private held(key: string): number {
    let excess = 0;
    const now = this.clock();
    for (const r of this.running.get(key)?.runs ?? [])
      excess += Math.max(0, usedS(r.runner, now) - r.runner.reservedS);
    return (this.reserved.get(key) ?? 0) + excess;
  }

  /** Calls running on each line, metered. */
  private readonly running = new Map<string, Line>();

  /** The line as the meter sees it now. */
  private state(key: string, line: Line): LineState & { windowS: number } {
    const b = this.ledger.check(key, 0, 0, line.limit);
    return {
      limitS: b.limit_s,
      chargedS: b.used_s,
      reservedS: this.reserved.get(key) ?? 0,
      runners: [...line.runs].map((r) => r.runner),
      windowS: b.window_s,
    };
  }

  /** Something changed on these lines: looks again at when their next call must stop. */
  private rearm(keys: readonly { key: string }[]): void {
    for (const { key } of keys) this.arm(key);
  }

  /**
   * Stops the line's calls that are due, and sets one timer for the next: each event costs one
   * walk over the line's running calls, however many run (inference runs dozens at once).
   * `fired`: the timer fired, so its due time has come whatever the (injected) clock says.
   */
  private arm(key: string, fired = false): void {
    const line = this.running.get(key);
    if (!line) return;
    clearLineTimer(line);
    const due = line.dueMs;
    line.dueMs = undefined;
    const now = fired && due !== undefined ? Math.max(this.clock(), due) : this.clock();
    for (;;) {
      const state = this.state(key, line);
      const live = [...line.runs].filter((r) => !r.stopped);
      const inMs = lineStopInMs(
        state,
        live.map((r) => r.runner),
        now,
      );
      if (!Number.isFinite(inMs)) return;
      if (inMs > 1) {
        // Looked at again when it fires: a charge may have left the window meanwhile.
        line.dueMs = now + inMs;
        line.timer = setTimeout(() => this.arm(key, true), Math.min(MAX_TIMER_MS, Math.ceil(inMs)));
        line.timer.unref?.();
        return;
      }
      const stopping = live.filter((r) => dueNow(state, r.runner, now));
      // Never spin: the soonest stop is now, so one is due; bar rounding, the nearest to its estimate.
      if (stopping.length === 0)
        stopping.push(
          live.reduce((a, b) =>
            usedS(b.runner, now) - b.runner.reservedS > usedS(a.runner, now) - a.runner.reservedS
              ? b
              : a,
          ),
        );
      for (const r of stopping) r.stopped = true;
      for (const r of stopping)
        r.onStop({
          readAllowance: key !== r.keys[0].key,
          usedS: usedS(r.runner, Math.min(now, due ?? now)),
          limitS: state.limitS,
          windowS: state.windowS,
          lineUsedS: state.chargedS + state.reservedS,
        });
      if (!this.running.has(key)) return;
    }
  }

  /** Charges what the call measured to every line of the call. */
  charge(principal: string, tool: string, seconds: number, estimate?: CostEstimate): void {
    const keys = this.lines(principal, tool, estimate);
    for (const { key } of keys) this.ledger.charge(key, seconds, tool);
    this.rearm(keys);
  }

  private adjust(key: string, seconds: number): void {
    const v = (this.reserved.get(key) ?? 0) + seconds;
    if (v <= 1e-9) this.reserved.delete(key);
    else this.reserved.set(key, v);
  }
}
