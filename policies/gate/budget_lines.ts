// The budget lines a call is charged to, the estimates held against them while admitted calls
// run, and the meter that stops a running call when a line runs out. The ledger
// (limits/budget.ts) records what calls cost; this adds what admitted calls are expected to cost,
// so calls queued behind each other cannot all pass one check, and what running calls use beyond
// their estimates, so a budget is a cap rather than a reservation (limits/meter.ts).

import type { Clock } from "../clock.js";
import type { LimitsConfig } from "../config.js";
import { PolicyError } from "../errors.js";
import type { CostEstimate } from "../estimate.js";
import type { BudgetCheck, BudgetHold, BudgetLedger } from "../limits/budget.js";
import { requiredScope, type Principal, type Scope } from "../scopes.js";
import type { ToolPolicy } from "../tool_policy.js";
import {
  dueNow,
  lineStopInMs,
  usedOf,
  usedS,
  type LineState,
  type Runner,
} from "../limits/meter.js";
import {
  costMicros,
  formatAmount,
  formatMoney,
  microsPerSecond,
  nanosPerChipHour,
  toMicros,
  type PricingConfig,
} from "../limits/pricing.js";

/** Read-scoped tools that use the device draw on a small allowance of their own as well. */
const READ_SCOPE: Scope = "models:read";
const READ_KEY_SUFFIX = "\u0000read";
/**
 * The principal's line when its budget is set in money (limits.budget.money_per_window): its own
 * key, so its charges (micro-units) never mix with device-seconds charged before the change.
 */
export const MONEY_KEY_SUFFIX = "\u0000money";

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
  /** A line in money: limitS and lineUsedS are micro-units of this currency. */
  currency?: string;
}

/** One line a call is charged to: its ledger key, its limit (absent: the ledger's), its unit. */
interface LineKey {
  key: string;
  limit?: number;
  /** Counted in money (micro-units), at the price of the call's device kind. */
  money?: boolean;
}

/** A call being metered (BudgetLines.meter); `end` stops the metering, once. */
export interface Metered {
  end(): void;
  /** Resolves once the meter first looked at the call's lines (a call due at once is stopped). */
  readonly armed: Promise<void>;
}

/** What an admitted call holds on its lines until it ends (BudgetLines.admit). */
export interface Reservation {
  /** Gives the estimate back, charging nothing; once (refused or cancelled before its work). */
  release(): Promise<void>;
  /** Charges what the call measured to every line in place of its hold; once. */
  settle(seconds: number): Promise<void>;
  /** Its work started: a shared store counts its overrun live from now (the meter's start). */
  started(): Promise<void>;
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
  /** Per line: in a money line, the estimate's cost at its kind's rate. */
  runners: Map<string, Runner>;
  /** Device-seconds: when it started and its estimate (the stop's usedS reads it). */
  runner: Runner;
  keys: LineKey[];
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
  /** The look at the line in progress: looks run one after another (each reads the ledger). */
  arming?: Promise<void>;
}

export class BudgetLines {
  constructor(
    private readonly limits: LimitsConfig,
    private readonly ledger: BudgetLedger,
    private readonly clock: Clock,
    private readonly tools: ReadonlyMap<string, ToolPolicy>,
    private readonly pricing?: PricingConfig,
  ) {
    const money = limits.budget.money_per_window;
    this.moneyLimit = money !== undefined && pricing ? toMicros(money) : undefined;
    // A shared ledger says when the other replicas' calls may have moved, on the lines this
    // process's calls run on (SQLite has no other process: it has no shareMeter).
    ledger.shareMeter?.({
      excess: () => new Map([...this.running.keys()].map((k) => [k, this.excess(k)])),
      lookAgain: (keys) => void this.rearm(keys.map((key) => ({ key }))),
    });
  }

  /** The principal's budget in micro-units when it is set in money; absent: in device-seconds. */
  private readonly moneyLimit?: number;

  /** What the estimate holds on a line, in its unit (a money line: the cost's micro-units). */
  private amount(line: LineKey, estimate: CostEstimate): number {
    return line.money ? (estimate.cost?.amount_micros ?? 0) : estimate.device_seconds;
  }

  /**
   * What the estimate holds on a line. An estimate on defaults alone (basis "default") over the
   * line's whole limit holds the limit instead: admitted once the line is free, and stopped by
   * the meter when it has used it. Only a measured (or requested) cost can say a call never fits:
   * a cold load priced 20 s by default takes 1–10 s (issue 44).
   */
  private held(line: LineKey, estimate: CostEstimate): number {
    const need = this.amount(line, estimate);
    if (estimate.basis !== "default") return need;
    const limit = line.limit ?? this.limits.budget.device_seconds_per_window;
    return Math.min(need, limit);
  }

  /** Micro-units per device-second of the estimate's kind (0 when it has no price). */
  private rateOf(estimate: CostEstimate): bigint {
    const kind = estimate.cost?.device_kind;
    return (kind !== undefined && this.pricing && nanosPerChipHour(this.pricing, kind)) || 0n;
  }

  /**
   * The principal's line, and for read-scoped tools its read allowance (but for a cold start:
   * a model's first check in a fresh worker is charged to the budget only).
   */
  private lines(principal: string, tool: string, estimate?: CostEstimate): LineKey[] {
    const keys: LineKey[] = [
      this.moneyLimit !== undefined
        ? { key: `${principal}${MONEY_KEY_SUFFIX}`, limit: this.moneyLimit, money: true }
        : { key: principal },
    ];
    if (requiredScope(this.tools.get(tool)) === READ_SCOPE && !estimate?.cold_start) {
      keys.push({
        key: `${principal}${READ_KEY_SUFFIX}`,
        limit: this.limits.budget.read_device_seconds_per_window,
      });
    }
    return keys;
  }

  /** Throws budget_exceeded when a line cannot take the estimate now (charges plus reservations). */
  async check(
    principal: Principal,
    tool: string,
    estimate: CostEstimate | undefined,
  ): Promise<void> {
    if (!estimate) return;
    for (const line of this.lines(principal.id, tool, estimate)) {
      const need = this.held(line, estimate);
      const b = await this.ledger.check(line.key, need, this.excess(line.key), line.limit);
      if (!b.ok) throw this.refusal(principal, line, need, b);
    }
  }

  /**
   * Checks every line and holds the estimate against each, in one step of the ledger (its
   * `admit`: calls admitted at once cannot all pass one check made before any of them held);
   * throws budget_exceeded naming the first line that cannot take it.
   */
  async admit(
    principal: Principal,
    tool: string,
    estimate: CostEstimate | undefined,
  ): Promise<Reservation> {
    if (!estimate) return NOTHING_HELD;
    const keys = this.lines(principal.id, tool, estimate);
    const lines = keys.map((l) => ({
      key: l.key,
      need: this.held(l, estimate),
      limitS: l.limit,
      extraHeldS: this.excess(l.key),
      rate: l.money ? microsPerSecond(this.rateOf(estimate)) : 1,
    }));
    const got = await this.ledger.admit(lines);
    if (!got.ok) throw this.refusal(principal, keys[got.index], lines[got.index].need, got.check);
    void this.rearm(keys);
    return this.reservation(got.hold, keys, tool, estimate);
  }

  private reservation(
    hold: BudgetHold,
    keys: LineKey[],
    tool: string,
    estimate: CostEstimate,
  ): Reservation {
    let done = false;
    return {
      release: async () => {
        if (done) return;
        done = true;
        await hold.release();
        void this.rearm(keys);
      },
      settle: async (seconds) => {
        if (done) return;
        done = true;
        await hold.settle(
          keys.map((l) => ({ key: l.key, amount: this.measured(l, seconds, estimate), tool })),
        );
        void this.rearm(keys);
      },
      started: async () => {
        if (!done) await hold.started?.();
      },
    };
  }

  /** What `seconds` of the call cost on a line, in its unit (whole micro-units on a money line). */
  private measured(line: LineKey, seconds: number, estimate?: CostEstimate): number {
    return line.money && estimate ? costMicros(seconds, this.rateOf(estimate)) : seconds;
  }

  /** budget_exceeded for the line that cannot take the call's need. */
  private refusal(principal: Principal, line: LineKey, need: number, b: BudgetCheck): PolicyError {
    const { key } = line;
    if (line.money) return this.moneyRefusal(need, b);
    const what =
      key === principal.id ? "Device-time budget" : "Device-time allowance for read-scoped tools";
    const when =
      b.retry_after_ms !== undefined
        ? `enough frees up in ${Math.ceil(b.retry_after_ms / 1000)} s`
        : b.reserved_s > 0 && need <= b.limit_s
          ? `calls of yours already admitted hold ${b.reserved_s} s of it; retry when they finish`
          : `it can never fit (the whole budget is ${b.limit_s} s); make the call smaller`;
    return new PolicyError(
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

  /** budget_exceeded for a budget in money, in money (micro-units on the ledger). */
  private moneyRefusal(need: number, b: BudgetCheck): PolicyError {
    const cur = this.pricing!.currency;
    const m = (x: number) => formatMoney(x, cur);
    const when =
      b.retry_after_ms !== undefined
        ? `enough frees up in ${Math.ceil(b.retry_after_ms / 1000)} s`
        : b.reserved_s > 0 && need <= b.limit_s
          ? `calls of yours already admitted hold ${m(b.reserved_s)} of it; retry when they finish`
          : `it can never fit (the whole budget is ${m(b.limit_s)}); make the call smaller`;
    return new PolicyError(
      "budget_exceeded",
      `Budget exceeded: this call costs ~${m(need)}, ${m(b.remaining_s)} of ${m(b.limit_s)} per ${b.window_s} s window remain; ${when}.`,
      {
        currency: cur,
        needed: formatAmount(need),
        remaining: formatAmount(b.remaining_s),
        used: formatAmount(b.used_s),
        reserved: formatAmount(b.reserved_s),
        limit: formatAmount(b.limit_s),
        window_s: b.window_s,
        retry_after_ms: b.retry_after_ms ?? null,
        resets_at:
          b.retry_after_ms !== undefined
            ? new Date(this.clock() + b.retry_after_ms).toISOString()
            : null,
      },
    );
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
    const runner: Runner = { startedMs: this.clock(), reservedS: estimate.device_seconds };
    const keys = this.lines(principal, tool, estimate);
    const rate = microsPerSecond(this.rateOf(estimate));
    const run: Running = {
      runner,
      // Each line's runner holds what admission held there (held: a default may hold less).
      runners: new Map(
        keys.map((l) => [
          l.key,
          { ...runner, reservedS: this.held(l, estimate), ...(l.money ? { rate } : {}) },
        ]),
      ),
      keys,
      onStop,
      stopped: false,
    };
    for (const { key, limit } of run.keys) {
      let line = this.running.get(key);
      if (!line) this.running.set(key, (line = { limit, runs: new Set() }));
      line.runs.add(run);
    }
    const armed = this.rearm(run.keys);
    let ended = false;
    return {
      armed,
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
        void this.rearm(run.keys);
      },
    };
  }

  /** What this process's running calls on a line used beyond their estimates (held as well). */
  private excess(key: string): number {
    let excess = 0;
    const now = this.clock();
    for (const run of this.running.get(key)?.runs ?? []) {
      const r = run.runners.get(key)!;
      excess += Math.max(0, usedOf(r, now) - r.reservedS);
    }
    return excess;
  }

  /** Calls running on each line, metered. */
  private readonly running = new Map<string, Line>();

  /** The line as the meter sees it: the ledger's standing and the line's running calls. */
  private async state(
    key: string,
    line: Line,
  ): Promise<LineState & { windowS: number; others: Runner[] }> {
    const b = await this.ledger.standing(key, line.limit);
    const now = this.clock();
    // Other processes' running calls (a shared store): their overruns grow meanwhile.
    const others = (b.others ?? []).map((o) => ({
      startedMs: now - o.elapsedMs,
      reservedS: o.reservedS,
      rate: o.rate,
    }));
    return {
      limitS: b.limit_s,
      chargedS: b.charged_s,
      reservedS: b.reserved_s,
      runners: [...[...line.runs].map((r) => r.runners.get(key)!), ...others],
      others,
      windowS: b.window_s,
    };
  }

  /** Something changed on these lines: looks again at when their next call must stop. */
  private rearm(keys: readonly { key: string }[]): Promise<void> {
    return Promise.all(keys.map(({ key }) => this.arm(key))).then(() => {});
  }

  /**
   * Looks at the line again (after the looks already asked for: each reads the ledger's
   * standing). `firedDue`: the timer due then fired, so that time has come whatever the
   * (injected) clock says, unless a later look moved the timer.
   */
  private arm(key: string, firedDue?: number): Promise<void> {
    const line = this.running.get(key);
    if (!line) return Promise.resolve();
    const look = (line.arming ?? Promise.resolve())
      .then(() => this.look(key, line, firedDue))
      .catch(() => {
        // The ledger could not be read: look again shortly (the calls run on meanwhile).
        if (this.running.get(key) !== line || line.timer) return;
        line.timer = setTimeout(() => void this.arm(key), 1000);
        line.timer.unref?.();
      });
    line.arming = look;
    void look.then(() => {
      if (line.arming === look) line.arming = undefined;
    });
    return look;
  }

  /**
   * Stops the line's calls that are due, and sets one timer for the next: each event costs one
   * walk over the line's running calls, however many run (inference runs dozens at once).
   */
  private async look(key: string, line: Line, firedDue?: number): Promise<void> {
    if (this.running.get(key) !== line) return;
    const standing = await this.state(key, line);
    if (this.running.get(key) !== line) return;
    clearLineTimer(line);
    const due = line.dueMs;
    line.dueMs = undefined;
    const fired = firedDue !== undefined && due === firedDue;
    const now = fired ? Math.max(this.clock(), due!) : this.clock();
    for (;;) {
      const own = [...line.runs].map((r) => r.runners.get(key)!);
      const state = { ...standing, runners: [...own, ...standing.others] };
      const live = [...line.runs].filter((r) => !r.stopped);
      const inMs = lineStopInMs(
        state,
        live.map((r) => r.runners.get(key)!),
        now,
      );
      if (!Number.isFinite(inMs)) return;
      if (inMs > 1) {
        // Looked at again when it fires: a charge may have left the window meanwhile.
        const at = now + inMs;
        line.dueMs = at;
        line.timer = setTimeout(
          () => void this.arm(key, at),
          Math.min(MAX_TIMER_MS, Math.ceil(inMs)),
        );
        line.timer.unref?.();
        return;
      }
      const on = (r: Running) => r.runners.get(key)!;
      const stopping = live.filter((r) => dueNow(state, on(r), now));
      // Never spin: the soonest stop is now, so one is due; bar rounding, the nearest to its estimate.
      if (stopping.length === 0)
        stopping.push(
          live.reduce((a, b) =>
            usedOf(on(b), now) - on(b).reservedS > usedOf(on(a), now) - on(a).reservedS ? b : a,
          ),
        );
      const money = stopping[0].keys.find((k) => k.key === key)?.money === true;
      for (const r of stopping) r.stopped = true;
      for (const r of stopping)
        r.onStop({
          readAllowance: key !== r.keys[0].key,
          usedS: usedS(r.runner, Math.min(now, due ?? now)),
          limitS: state.limitS,
          windowS: state.windowS,
          lineUsedS: state.chargedS + state.reservedS,
          ...(money && this.pricing ? { currency: this.pricing.currency } : {}),
        });
      if (this.running.get(key) !== line) return;
    }
  }

  /**
   * A charge without a reservation (a call a killed process left behind, reconcile.ts): what
   * it measured, to every line of the call.
   */
  async charge(
    principal: string,
    tool: string,
    seconds: number,
    estimate?: CostEstimate,
  ): Promise<void> {
    const keys = this.lines(principal, tool, estimate);
    for (const l of keys)
      await this.ledger.charge(l.key, this.measured(l, seconds, estimate), tool);
    void this.rearm(keys);
  }
}

/** The reservation of a call without an estimate: it holds and is charged nothing. */
const NOTHING_HELD: Reservation = {
  release: async () => {},
  settle: async () => {},
  started: async () => {},
};
