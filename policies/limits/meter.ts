// The arithmetic of the budget cap, pure: when must a running call stop so that its budget line
// holds? A line's "left" is its limit less what the window has charged, what admitted calls hold
// (their estimates), and what running calls used beyond their estimate. A running call stops
// when left ≤ min(0, used − reserved): past its own estimate it may use what is left, and no more;
// within its estimate it gives back what an earlier call overran (the deficit), so that the line
// ends at most one stop latency over, however many calls ran in turn. Every running call's
// excess counts against every other's: concurrent calls share what is left instead of each
// taking all of it.

/**
 * A running call on a line: when it started (ms) and what it holds (its estimate), in the line's
 * unit: device-seconds, or money (micro-units) on a line whose budget is set in money.
 */
export interface Runner {
  startedMs: number;
  reservedS: number;
  /**
   * What one second of its device time costs in the line's unit: absent = 1 (a device-seconds
   * line); on a money line, the price per second of the call's device kind (limits/pricing.ts).
   */
  rate?: number;
}

/** One budget line at a moment, in its unit: its limit, the window's charges, every admitted estimate. */
export interface LineState {
  limitS: number;
  chargedS: number;
  /** Estimates of every admitted, unsettled call on the line (running ones included). */
  reservedS: number;
  runners: readonly Runner[];
}

/** Seconds the call has used at `nowMs` (device time = wall time of the work, as charged). */
export function usedS(r: Runner, nowMs: number): number {
  return Math.max(0, nowMs - r.startedMs) / 1000;
}

function rateOf(r: Runner): number {
  return r.rate ?? 1;
}

/** What the call has used at `nowMs`, in the line's unit (its seconds at its rate). */
export function usedOf(r: Runner, nowMs: number): number {
  return usedS(r, nowMs) * rateOf(r);
}

/** When the call reaches its estimate (ms). */
function reachMs(r: Runner): number {
  return r.startedMs + (r.reservedS / rateOf(r)) * 1000;
}

/** What is left of the line at `nowMs`; negative once running calls overran it. */
export function leftS(line: LineState, nowMs: number): number {
  let excess = 0;
  for (const r of line.runners) excess += Math.max(0, usedOf(r, nowMs) - r.reservedS);
  return line.limitS - line.chargedS - line.reservedS - excess;
}

/**
 * Milliseconds from `nowMs` until `runner` (one of `line.runners`) must stop, if nothing else
 * changes (no call starts or ends, no charge leaves the window): 0 = now, Infinity = never.
 * The gap left − min(0, used − reserved) only shrinks (by 1 s/s for the runner itself, before or
 * after its estimate, plus 1 s/s per other call past its own), so the answer is the first zero
 * of a falling piecewise-linear function, found segment by segment.
 */
export function stopInMs(line: LineState, runner: Runner, nowMs: number): number {
  // One candidate of the line's walk: the same falling gap, counted once.
  return lineStopInMs(line, [runner], nowMs);
}

/**
 * Milliseconds from `nowMs` until the first of `candidates` (running calls of the line not yet
 * stopped) must stop: the minimum of stopInMs over them, in one walk. The candidate nearest to
 * its estimate (the soonest to reach it) has the least headroom, so the line's gap is what is
 * left less that headroom; it falls by 1 s/s per call past its estimate, plus 1 s/s until the
 * nearest candidate reaches its own.
 */
export function lineStopInMs(
  line: LineState,
  candidates: readonly Runner[],
  nowMs: number,
): number {
  if (candidates.length === 0) return Infinity;
  // One rate on the line (always, on a device-seconds line): the nearest candidate to its
  // estimate has the least headroom, one walk. Rates apart (a money line across device kinds):
  // the least headroom is not the nearest's, so each candidate walks alone.
  const rate = rateOf(candidates[0]);
  if (line.runners.every((r) => rateOf(r) === rate)) return walk(line, candidates, nowMs);
  let soonest = Infinity;
  for (const c of candidates) soonest = Math.min(soonest, walk(line, [c], nowMs));
  return soonest;
}

/**
 * The gap falls by the rate of every call past its estimate, plus the nearest candidate's
 * rate until it reaches its own (all candidates share one rate here).
 */
function walk(line: LineState, candidates: readonly Runner[], nowMs: number): number {
  let nearest = Infinity;
  for (const r of candidates) nearest = Math.min(nearest, reachMs(r));
  const own = rateOf(candidates[0]);
  let gap = leftS(line, nowMs) - Math.min(0, ((nowMs - nearest) / 1000) * own);
  if (gap <= 0) return 0;
  const crossings: { at: number; rate: number }[] = [];
  let past = 0;
  for (const r of line.runners) {
    const at = reachMs(r);
    if (at <= nowMs) past += rateOf(r);
    else crossings.push({ at, rate: rateOf(r) });
  }
  crossings.sort((x, y) => x.at - y.at);
  let t = nowMs;
  for (const { at, rate } of crossings) {
    const slope = past + (t < nearest ? own : 0);
    const reach = t + (gap / slope) * 1000;
    if (reach <= at) return reach - nowMs;
    gap -= ((at - t) / 1000) * slope;
    t = at;
    past += rate;
  }
  return t + (gap / (past + (t < nearest ? own : 0))) * 1000 - nowMs;
}

/** Whether `runner` must stop now: what is left ≤ min(0, used − reserved), within `epsS`. */
export function dueNow(line: LineState, runner: Runner, nowMs: number, epsS = 0.001): boolean {
  return leftS(line, nowMs) - Math.min(0, usedOf(runner, nowMs) - runner.reservedS) <= epsS;
}
