// Issue 11: the promises the gate makes under concurrency and for refused calls. Each test here
// fails on the gate that checked the budget before waiting for a slot and charged afterwards.
import { afterAll, describe, expect, it } from "vitest";
import { SqliteApprovalQueue } from "../../server/stores/approvals/sqlite.js";
import { SqliteAuditTrail } from "../../server/stores/audit/sqlite.js";
import { parsePolicyConfig, type PolicyConfigInput } from "../../policies/config.js";
import { PolicyError } from "../../policies/errors.js";
import type { CostEstimate } from "../../policies/estimate.js";
import { Gate, type GateCall } from "../../policies/gate/gate.js";
import { STOP_GRACE_MS } from "../../policies/gate/supervise.js";
import { SqliteBudgetLedger } from "../../policies/limits/budget.js";
import { ConcurrencyLimiter } from "../../policies/limits/concurrency.js";
import { RateLimiter } from "../../policies/limits/rate.js";
import type { Principal } from "../../policies/scopes.js";
import { captureLogger, FakeClock, flush, tempDir } from "./helpers.js";
import { TOOL_POLICIES } from "../../tools/registry.js";

const tmp = tempDir();
afterAll(() => tmp.cleanup());

const agent: Principal = {
  id: "agent",
  scopes: ["models:read", "models:load", "inference:run", "benchmark:run", "jobs:read"],
  via: "token",
};
const other: Principal = { ...agent, id: "other" };
const reader: Principal = { id: "reader", scopes: ["models:read"], via: "token" };

const est = (device_seconds: number): CostEstimate => ({
  device_seconds,
  memory_bytes: 1e6,
  compile_s: 0,
  weight_bytes: 0,
  fits: true,
});

function makeGate(policy: PolicyConfigInput) {
  // Not about approvals: the default rules off, unless a test names its own.
  const config = parsePolicyConfig({ approvals: { rules: [] }, ...policy }, TOOL_POLICIES);
  const clock = new FakeClock();
  const logger = captureLogger();
  const file = tmp.file(`adm-${Math.random().toString(36).slice(2)}.db`);
  const approvals = new SqliteApprovalQueue(file, { clock: clock.now });
  const audit = new SqliteAuditTrail(file, { logger });
  const budget = new SqliteBudgetLedger(file, { ...config.limits.budget, clock: clock.now });
  const gate = new Gate({
    tools: TOOL_POLICIES,
    config,
    approvals,
    audit,
    limiter: new ConcurrencyLimiter(config.limits, clock.now),
    rateLimiter: new RateLimiter(config.limits.rate_limit.per_principal_per_minute, clock.now),
    budget,
    clock: clock.now,
    logger,
  });
  return { gate, clock, approvals, audit, budget };
}

async function settle<T>(
  p: Promise<T>,
): Promise<{ ok: true; v: T } | { ok: false; e: PolicyError }> {
  try {
    return { ok: true, v: await p };
  } catch (e) {
    if (e instanceof PolicyError) return { ok: false, e };
    throw e;
  }
}

// No in-band approval round here (Gate.run then answers the handler's value or a refusal).
type Call = GateCall & { inBand?: undefined };
const bench = (
  principal: Principal,
  seconds: number,
  over: Partial<Omit<GateCall, "inBand">> = {},
): Call => ({
  principal,
  tool: "run_benchmark",
  args: { model: "tiny-gpt2", n: Math.random() },
  device: "cpu",
  estimate: est(seconds),
  ...over,
});

describe("budget under concurrency", () => {
  it("admits only as many queued calls as the budget holds, and releases refused reservations", async () => {
    const { gate, clock } = makeGate({
      limits: { budget: { device_seconds_per_window: 3, window_s: 3600 } },
    });
    // Five calls arrive together; run_benchmark runs one at a time, so four wait for the slot.
    let running = 0;
    let ran = 0;
    const gates: (() => void)[] = [];
    const calls = Array.from({ length: 5 }, () =>
      settle(
        gate.run(bench(agent, 1), async () => {
          running++;
          await new Promise<void>((r) => gates.push(r));
          clock.advance(1000); // each really took its estimated second
          running--;
          ran++;
        }),
      ),
    );
    await flush();
    // Release them one by one as they get the slot.
    for (let i = 0; i < 5; i++) {
      await flush();
      gates.shift()?.();
      await flush();
    }
    const results = await Promise.all(calls);
    const refused = results.filter((r) => !r.ok);
    expect(ran).toBe(3);
    expect(refused).toHaveLength(2);
    for (const r of refused) expect(!r.ok && r.e.code).toBe("budget_exceeded");
    expect(running).toBe(0);
    // No reservation is left behind: the next refusal reports nothing held by admitted calls.
    const next = await settle(gate.run(bench(agent, 1), async () => undefined));
    expect(!next.ok && next.e.details.reserved_s).toBe(0);
  });

  it("keeps each principal to its own budget while both run concurrently", async () => {
    const { gate } = makeGate({
      limits: {
        budget: { device_seconds_per_window: 2, window_s: 3600 },
        per_tool_concurrency: { run_benchmark: 4 },
      },
    });
    let ran = 0;
    const results = await Promise.all(
      [agent, other, agent, other, agent, other].map((p) =>
        settle(gate.run(bench(p, 1), async () => void ran++)),
      ),
    );
    expect(ran).toBe(4); // two each
    expect(results.filter((r) => !r.ok)).toHaveLength(2);
  });

  it("releases the reservation of a call refused while waiting (busy, cancelled)", async () => {
    const { gate } = makeGate({
      limits: {
        budget: { device_seconds_per_window: 10, window_s: 3600 },
        queue_bound: { run_benchmark: 0 },
      },
    });
    let finish!: () => void;
    const first = gate.run(bench(agent, 4), () => new Promise<void>((r) => (finish = r)));
    await flush();
    const busy = await settle(gate.run(bench(agent, 4), async () => undefined));
    expect(!busy.ok && busy.e.code).toBe("busy");
    // Only the running call's 4 s are held: 7 s more do not fit, and the refusal says why.
    const over = await settle(gate.run(bench(agent, 7), async () => undefined));
    expect(!over.ok && over.e.code).toBe("budget_exceeded");
    expect(!over.ok && over.e.details.reserved_s).toBe(4);
    finish();
    await first;
    await flush(); // p-limit frees the slot one tick after release
    // Settled (in no measured time): the whole budget is free again.
    expect((await settle(gate.run(bench(agent, 10), async () => "ran"))).ok).toBe(true);
  });
});

describe("nothing that can never run asks for approval", () => {
  it("refuses an estimate above the whole budget before creating an approval", async () => {
    const { gate, approvals } = makeGate({
      limits: { budget: { device_seconds_per_window: 5, window_s: 3600 } },
      approvals: { rules: [{ tool: "run_benchmark" }] },
    });
    const r = await settle(gate.run(bench(agent, 50), async () => "ran"));
    expect(!r.ok && r.e.code).toBe("budget_exceeded");
    expect(!r.ok && r.e.message).toMatch(/can never fit/);
    expect(await approvals.list({ status: "pending" })).toHaveLength(0);
  });

  it("refuses a call that does not fit the budget now before creating an approval", async () => {
    const { gate, approvals, clock } = makeGate({
      limits: { budget: { device_seconds_per_window: 5, window_s: 3600 } },
      approvals: { rules: [{ tool: "run_benchmark", when: { min_device_seconds: 3 } }] },
    });
    // Already spent 4 of 5 s (charged without approval: a call under the threshold).
    await gate.run(bench(agent, 2), async () => clock.advance(4000));
    const r = await settle(gate.run(bench(agent, 4), async () => "ran"));
    expect(!r.ok && r.e.code).toBe("budget_exceeded");
    expect(await approvals.list({})).toHaveLength(0);
  });
});

describe("admission before cost", () => {
  it("makes the estimate only for a caller in scope and under its rate", async () => {
    const { gate } = makeGate({ limits: { rate_limit: { per_principal_per_minute: 1 } } });
    let estimated = 0;
    const estimator = async () => (estimated++, est(1));
    const call = (p: Principal): GateCall => ({
      principal: p,
      tool: "run_benchmark",
      args: {},
      device: "cpu",
      estimator,
    });
    expect((await settle(gate.run(call(reader), async () => 1))).ok).toBe(false);
    expect(estimated).toBe(0);
    await gate.run(call(agent), async () => 1);
    expect(estimated).toBe(1);
    const r = await settle(gate.run(call(agent), async () => 1));
    expect(!r.ok && r.e.code).toBe("rate_limited");
    expect(estimated).toBe(1);
  });

  it("hands fn the deadline it enforces", async () => {
    const { gate, clock } = makeGate({ limits: { call_timeout_s: { run_benchmark: 30 } } });
    const t0 = clock.now();
    const seen = await gate.run(bench(agent, 1), async (_s, d) => {
      clock.advance(10_000);
      return { at: d.at, remaining: d.remainingMs() };
    });
    // Stopped at 30 s; the runtime waits until the gate gives up on a stopped call's answer.
    expect(seen.at).toBe(t0 + 30_000);
    expect(seen.remaining).toBe(20_000 + STOP_GRACE_MS);
  });
});

describe("refused input", () => {
  it("audits a refusal with the argument digest only and counts it against the rate", async () => {
    const { gate, audit } = makeGate({ limits: { rate_limit: { per_principal_per_minute: 3 } } });
    const args = { model: "nope", texts: ["secret text"] };
    await gate.refuse(agent, "run_inference", args, "unknown_model", "model: not in the catalog");
    await gate.refuse(agent, "run_inference", args, "invalid_argument", "texts: bad");
    await gate.refuse(agent, "run_inference", args, "invalid_argument", "texts: bad");
    await expect(
      gate.refuse(agent, "run_inference", args, "invalid_argument", "texts: bad"),
    ).rejects.toThrow(expect.objectContaining({ code: "rate_limited" }));
    const agentRows = async () => (await audit.tail(10)).filter((r) => r.principal === "agent");
    // The same call refused again is counted, not recorded again, until its window ends.
    expect((await agentRows()).map((r) => r.code)).toEqual([
      "unknown_model",
      "invalid_argument",
      "rate_limited",
    ]);
    await audit.flushRefusals();
    const rows = await agentRows();
    expect(rows.map((r) => [r.code, r.count])).toEqual([
      ["unknown_model", undefined],
      ["invalid_argument", undefined],
      ["rate_limited", undefined],
      ["invalid_argument", 1],
    ]);
    expect(rows[3].first_seq).toBe(rows[1].seq);
    for (const r of rows) {
      expect(r.args_digest).toMatch(/^[0-9a-f]{64}$/);
      expect(JSON.stringify(r)).not.toContain("secret text");
    }
  });
});

describe("read-scoped device time", () => {
  it("bounds what a reader's check_model calls may spend, even with budget to spare", async () => {
    const { gate, clock } = makeGate({
      limits: { budget: { device_seconds_per_window: 3600, read_device_seconds_per_window: 10 } },
    });
    const check = (): GateCall => ({
      principal: reader,
      tool: "check_model",
      args: { model: "all-minilm-l6-v2", n: Math.random() },
      device: "cpu",
      estimate: est(4),
    });
    await gate.run(check(), async () => clock.advance(4000));
    await gate.run(check(), async () => clock.advance(4000));
    const r = await settle(gate.run(check(), async () => "ran"));
    expect(!r.ok && r.e.code).toBe("budget_exceeded");
    expect(!r.ok && r.e.message).toMatch(/read-scoped/);
  });

  // Issue 23 (finding 2): the allowance held estimates only; a check estimated low ran on.
  const check = (estimate: number, device = "cpu"): GateCall => ({
    principal: reader,
    tool: "check_model",
    args: { model: "all-minilm-l6-v2", n: Math.random() },
    device,
    estimate: est(estimate),
  });
  /** Work that runs until the gate cancels it, then takes `stopMs` (fake) to stop. */
  const untilCancelled =
    (clock: FakeClock, stopMs: number) =>
    (signal: AbortSignal): Promise<never> =>
      new Promise((_, reject) =>
        signal.addEventListener("abort", () => {
          clock.advance(stopMs);
          reject(signal.reason);
        }),
      );

  it("stops a running check when its device time reaches what is left of the allowance, whatever its estimate", async () => {
    const { gate, clock, budget, audit } = makeGate({
      limits: { budget: { device_seconds_per_window: 3600, read_device_seconds_per_window: 0.3 } },
    });
    // 0.1 s of the allowance already used: 0.2 s are left for a call estimated at 0.01 s.
    await gate.run(check(0.05), async () => clock.advance(100));
    const r = await settle(gate.run(check(0.01), untilCancelled(clock, 250)));
    expect(!r.ok && r.e.code).toBe("budget_exceeded");
    expect(!r.ok && r.e.message).toMatch(/allowance for read-scoped tools ran out/);
    expect(!r.ok && r.e.details.stopped_after_s).toBeCloseTo(0.2, 3);
    expect((await audit.tail(1))[0]).toMatchObject({ outcome: "failed", code: "budget_exceeded" });
    await flush();
    // Charged up to its stop (the 250 ms it took to stop are not the line's), on the allowance
    // and the budget alike: the allowance ends exactly at its limit.
    expect((await budget.check("reader\u0000read", 0)).used_s).toBeCloseTo(0.3, 3);
    expect((await budget.check("reader", 0)).used_s).toBeCloseTo(0.3, 3);
    // Nothing left: the next check is refused before it starts.
    const next = await settle(gate.run(check(0.01), async () => "ran"));
    expect(!next.ok && next.e.message).toMatch(/read-scoped tools exceeded/);
  }, 10_000);

  it("never lets checks running at once on two devices spend the same allowance twice", async () => {
    const { gate, clock } = makeGate({
      limits: { budget: { device_seconds_per_window: 3600, read_device_seconds_per_window: 0.3 } },
    });
    // Both start now; each runs (on the fake clock) until the moment it is stopped.
    const t0 = clock.now();
    const untilStopped = (signal: AbortSignal): Promise<never> =>
      new Promise((_, reject) =>
        signal.addEventListener("abort", () => {
          const ranS = (signal.reason as PolicyError).details.stopped_after_s as number;
          clock.ms = Math.max(clock.ms, t0 + ranS * 1000);
          reject(signal.reason);
        }),
      );
    const [a, b] = await Promise.all([
      settle(gate.run(check(0.01, "cpu"), untilStopped)),
      settle(gate.run(check(0.01, "cuda:0"), untilStopped)),
    ]);
    // Each is stopped at what it may use (or refused before it starts, which uses nothing).
    const used = [a, b].map((r) => {
      expect(!r.ok && r.e.code).toBe("budget_exceeded");
      return !r.ok ? ((r.e.details.stopped_after_s as number | undefined) ?? 0) : Infinity;
    });
    expect(used[0] + used[1]).toBeLessThanOrEqual(0.3 + 0.001);
  }, 10_000);

  it("leaves a call that is not charged (no estimate) and a call of other scopes uncapped", async () => {
    const { gate, clock } = makeGate({
      limits: { budget: { device_seconds_per_window: 3600, read_device_seconds_per_window: 0 } },
    });
    const listed = await gate.run(
      { principal: reader, tool: "list_models", args: {}, device: undefined },
      async () => {
        await new Promise((r) => setTimeout(r, 30));
        return "listed";
      },
    );
    expect(listed).toBe("listed");
    const ran = await gate.run(bench(agent, 1), async () => {
      await new Promise((r) => setTimeout(r, 30));
      clock.advance(1000);
      return "ran";
    });
    expect(ran).toBe("ran");
  });
});
