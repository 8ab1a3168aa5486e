// Admission counts what running calls have used beyond their estimates (policies/gate/
// budget_lines.ts, held): a call that overran takes the overrun off what a new call may be
// admitted on, not only off the running calls' own shares.
import { afterAll, describe, expect, it } from "vitest";
import { parsePolicyConfig } from "../../policies/config.js";
import type { CostEstimate } from "../../policies/estimate.js";
import { PolicyError } from "../../policies/errors.js";
import { BudgetLines } from "../../policies/gate/budget_lines.js";
import { SqliteBudgetLedger } from "../../policies/limits/budget.js";
import type { Principal } from "../../policies/scopes.js";
import { toolPolicyMap } from "../../policies/tool_policy.js";
import { TOOL_POLICIES } from "../../tools/registry.js";
import { FakeClock, tempDir } from "./helpers.js";

const tmp = tempDir();
afterAll(() => tmp.cleanup());

const est = (device_seconds: number): CostEstimate => ({
  device_seconds,
  memory_bytes: 1e6,
  compile_s: 0,
  weight_bytes: 0,
  fits: true,
});
const agent: Principal = { id: "agent", scopes: ["benchmark:run"], via: "token" };

function lines(limitS: number) {
  const config = parsePolicyConfig(
    { approvals: { rules: [] }, limits: { budget: { device_seconds_per_window: limitS } } },
    TOOL_POLICIES,
  );
  const clock = new FakeClock();
  const ledger = new SqliteBudgetLedger(tmp.file(`lines-${Math.random()}.db`), {
    ...config.limits.budget,
    clock: clock.now,
  });
  return {
    clock,
    lines: new BudgetLines(config.limits, ledger, clock.now, toolPolicyMap(TOOL_POLICIES)),
  };
}

const refusal = async (fn: () => Promise<void>) => {
  try {
    await fn();
  } catch (e) {
    return e as PolicyError;
  }
  return undefined;
};

describe("admission on a budget line", () => {
  it("refuses a call that fits the estimates but not what a running call overran", async () => {
    const { clock, lines: l } = lines(10);
    // One call estimated at 1 s, running 5 s: 4 s past its estimate, 5 s of 10 left.
    const held = await l.admit(agent, "run_benchmark", est(1));
    const run = l.meter("agent", "run_benchmark", est(1), () => {})!;
    clock.advance(5_000);
    expect(await refusal(() => l.check(agent, "run_benchmark", est(4.5)))).toBeUndefined();
    const e = await refusal(() => l.check(agent, "run_benchmark", est(6)));
    expect(e?.code).toBe("budget_exceeded");
    expect(e?.details.reserved_s).toBeCloseTo(5, 3); // its estimate and its overrun
    run.end();
    await held.release();
  });
});

// Issue 44 (item 5): a cold load priced 20 s by default (no load of it measured yet) was refused
// "it can never fit" on a 10 s budget, though it takes 1–10 s. An estimate on defaults alone
// holds the whole line instead, and the meter stops it when it has used it.
describe("an estimate on defaults alone over the whole budget", () => {
  const guess = (s: number): CostEstimate => ({ ...est(s), basis: "default" });

  it("is admitted on a free line, holds all of it, and is stopped when it has used it", async () => {
    const { clock, lines: l } = lines(10);
    const held = await l.admit(agent, "load_model", guess(20));
    const stops: number[] = [];
    const run = l.meter("agent", "load_model", guess(20), (s) => stops.push(s.usedS))!;
    await run.armed;
    expect(stops).toEqual([]);
    // It holds the whole line: nothing else fits beside it.
    const e = await refusal(() => l.check(agent, "load_model", est(0.5)));
    expect(e?.code).toBe("budget_exceeded");
    expect(e?.details.reserved_s).toBe(10);
    // Ten seconds in, the line is used up: the next look at it stops the call.
    clock.advance(10_000);
    const other = l.meter("agent", "load_model", est(0.01), () => {})!;
    await other.armed;
    other.end();
    expect(stops).toEqual([10]);
    run.end();
    await held.settle(10);
  });

  it("waits for the whole line to be free rather than never fitting", async () => {
    const { lines: l } = lines(10);
    const first = await l.admit(agent, "load_model", est(1));
    await first.settle(1);
    const e = await refusal(() => l.admit(agent, "load_model", guess(20)).then(() => {}));
    expect(e?.code).toBe("budget_exceeded");
    expect(e?.message).toMatch(/enough frees up in \d+ s/);
    expect(e?.message).not.toMatch(/never fit/);
  });

  it("is still refused as never fitting when it rests on measured calls", async () => {
    const { lines: l } = lines(10);
    for (const basis of ["measured", "requested"] as const) {
      const e = await refusal(() =>
        l.admit(agent, "load_model", { ...est(20), basis }).then(() => {}),
      );
      expect(e?.code).toBe("budget_exceeded");
      expect(e?.message).toMatch(/can never fit \(the whole budget is 10 s\)/);
    }
  });
});
