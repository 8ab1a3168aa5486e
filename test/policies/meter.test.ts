// The cap's arithmetic (policies/limits/meter.ts): when a running call must stop so that its
// budget line holds, alone, beside other running calls, and after an earlier call overran.
import { describe, expect, it } from "vitest";
import {
  dueNow,
  leftS,
  lineStopInMs,
  stopInMs,
  type LineState,
  type Runner,
} from "../../policies/limits/meter.js";

const at = (s: number) => s * 1000;
function line(limitS: number, chargedS: number, runners: Runner[], queuedS = 0): LineState {
  const reservedS = queuedS + runners.reduce((x, r) => x + r.reservedS, 0);
  return { limitS, chargedS, reservedS, runners };
}

describe("the budget cap's arithmetic", () => {
  it("lets a lone call use its estimate plus what is left of the line", () => {
    const r = { startedMs: 0, reservedS: 2 };
    // 10 s limit, 3 charged, 2 held by the call: 5 left beyond its estimate → 7 s in all.
    expect(stopInMs(line(10, 3, [r]), r, 0)).toBeCloseTo(at(7));
    // Half-way through, the rest of it.
    expect(stopInMs(line(10, 3, [r]), r, at(4))).toBeCloseTo(at(3));
    // Past it: now.
    expect(stopInMs(line(10, 3, [r]), r, at(8))).toBe(0);
  });

  it("keeps the estimates of admitted calls that have not started out of what is left", () => {
    const r = { startedMs: 0, reservedS: 2 };
    expect(stopInMs(line(10, 0, [r], 6), r, 0)).toBeCloseTo(at(4));
  });

  it("shares what is left between concurrent calls instead of giving it to each", () => {
    // 8 calls of 1 s estimates on a 12 s line: 4 s left for all of them, not 4 s each.
    const rs = Array.from({ length: 8 }, () => ({ startedMs: 0, reservedS: 1 }));
    const l = line(12, 0, rs);
    // All pass their estimates at 1 s, then draw on the 4 s at 8 s/s: out at 1.5 s.
    for (const r of rs) expect(stopInMs(l, r, 0)).toBeCloseTo(at(1.5));
    // What they would have used when stopped: exactly the limit.
    expect(leftS(l, at(1.5))).toBeCloseTo(0);
  });

  it("counts another call's use beyond its estimate from the moment it passes it", () => {
    const a = { startedMs: 0, reservedS: 1 };
    const b = { startedMs: at(5), reservedS: 1 };
    const l = line(10, 0, [a, b]);
    // At 5 s: a has used 5 (4 beyond), b 0; left = 10 − 2 − 4 = 4. b passes its estimate at 6 s
    // (left 3 then, a draining it alone), then both drain it: out at 6 + 3/2 = 7.5 s.
    expect(stopInMs(l, b, at(5))).toBeCloseTo(at(2.5));
    expect(stopInMs(l, a, at(5))).toBeCloseTo(at(2.5));
  });

  it("makes the next call absorb an earlier call's overrun, so the line ends one stop latency over", () => {
    // a, b, c admitted on 3 × 2 s = 6 s, the whole line. a overran by 0.5 s (charged 2.5); b,
    // starting now with its 2 s estimate, stops at 1.5 s; c after it would stop at 2 − b's overrun.
    const b = { startedMs: 0, reservedS: 2 };
    expect(stopInMs(line(6, 2.5, [b], 2), b, 0)).toBeCloseTo(at(1.5));
    const c = { startedMs: 0, reservedS: 2 };
    expect(stopInMs(line(6, 2.5 + 1.7, [c]), c, 0)).toBeCloseTo(at(1.8));
    // A deficit larger than the estimate: stopped before it starts.
    expect(stopInMs(line(6, 8.5, [c]), c, 0)).toBe(0);
  });
});

describe("the line's soonest stop", () => {
  it("is the soonest of its running calls' stops, found in one walk", () => {
    // A seeded generator: the same cases every run.
    let seed = 22;
    const rnd = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
    for (let k = 0; k < 500; k++) {
      const n = 1 + Math.floor(rnd() * 8);
      const now = at(10);
      const runners = Array.from({ length: n }, () => ({
        startedMs: at(10 * rnd()),
        reservedS: 5 * rnd(),
      }));
      const l = line(5 + 30 * rnd(), 10 * rnd(), runners, 5 * rnd());
      const some = runners.filter(() => rnd() < 0.7);
      const want = Math.min(...some.map((r) => stopInMs(l, r, now)));
      const got = lineStopInMs(l, some, now);
      if (want === Infinity) expect(got).toBe(Infinity);
      else expect(got).toBeCloseTo(want, 6);
    }
  });

  it("says which calls are due when it comes", () => {
    const a = { startedMs: 0, reservedS: 1 };
    const b = { startedMs: at(0.5), reservedS: 3 };
    const l = line(5, 0, [a, b]);
    // a passes its estimate at 1 s and drains the 1 s left alone: due at 2 s; b is not (it still
    // has 1.5 s of its own estimate), and is due when the overrun meets its headroom.
    const t = lineStopInMs(l, [a, b], 0);
    expect(t).toBeCloseTo(at(2));
    expect(dueNow(l, a, t)).toBe(true);
    expect(dueNow(l, b, t)).toBe(false);
    expect(lineStopInMs(l, [b], t)).toBeCloseTo(stopInMs(l, b, t), 6);
  });
});
