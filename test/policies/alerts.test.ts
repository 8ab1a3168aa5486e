// Alert rules (policies/alerts/): the pure counting and once-per-window latch, then the rules at
// work on a real gate and stores — a refusal flood suspends its principal (refused
// principal_suspended, its running call stopped as a budget stop), the suspension and the quiet
// time survive a restart (a new store over the same file), a budget rule fires once per window.
import { afterAll, describe, expect, it } from "vitest";
import { Alerts } from "../../policies/alerts/alerts.js";
import { EventWindows, FiringLatch } from "../../policies/alerts/rules.js";
import { SqliteAlertStore } from "../../policies/alerts/store.js";
import { SqliteApprovalQueue } from "../../server/stores/approvals/sqlite.js";
import { SqliteAuditTrail } from "../../server/stores/audit/sqlite.js";
import { parsePolicyConfig, type AlertRule } from "../../policies/config.js";
import { isPolicyError, type PolicyError } from "../../policies/errors.js";
import { Gate, type GateCall } from "../../policies/gate/gate.js";
import { SqliteBudgetLedger } from "../../policies/limits/budget.js";
import { ConcurrencyLimiter } from "../../policies/limits/concurrency.js";
import { RateLimiter } from "../../policies/limits/rate.js";
import type { Principal } from "../../policies/scopes.js";
import { SqliteSuspensionStore } from "../../policies/suspensions.js";
import { stopReasonOf } from "../../runtime/types.js";
import { TOOL_POLICIES } from "../../tools/registry.js";
import { captureLogger, FakeClock, tempDir } from "./helpers.js";

const tmp = tempDir();
afterAll(() => tmp.cleanup());

describe("alert rule arithmetic", () => {
  it("counts a key's events over a sliding window, forgetting those that left it", () => {
    const w = new EventWindows(60_000);
    for (let i = 0; i < 10; i++) expect(w.add("a", i * 1000)).toBe(i + 1);
    expect(w.add("b", 9_000)).toBe(1); // keys are apart
    // At 65 s the window [5 s, 65 s] holds the events of 5..9 s; the bucket of 0..5 s, which the
    // window's start falls in, still counts (early by at most a bucket, never late).
    expect(w.count("a", 65_000)).toBe(10);
    // At 66 s that bucket has left: the events of 6..9 s remain.
    expect(w.count("a", 66_000)).toBe(4);
    expect(w.count("a", 200_000)).toBe(0);
    w.reset("b");
    expect(w.count("b", 9_000)).toBe(0);
  });

  it("never misses N events within one window, however they fall on the buckets", () => {
    for (const start of [0, 1, 5_999, 6_000, 59_999]) {
      const w = new EventWindows(60_000);
      let n = 0;
      // 1,000 events spread over exactly the window's length.
      for (let i = 0; i < 1000; i++) n = w.add("k", start + (i * 59_999) / 999);
      expect(n).toBe(1000);
    }
  });

  it("fires once per window and key, and a seeded latch remembers a window across restarts", () => {
    const latch = new FiringLatch();
    expect(latch.tryFire("r/a", 0, 60_000)).toBe(true);
    expect(latch.tryFire("r/a", 59_999, 119_999)).toBe(false);
    expect(latch.tryFire("r/b", 10, 60_010)).toBe(true);
    expect(latch.tryFire("r/a", 60_000, 120_000)).toBe(true);
    const restarted = new FiringLatch([["r/a", 120_000]]);
    expect(restarted.tryFire("r/a", 100_000, 160_000)).toBe(false);
  });
});

const agent: Principal = { id: "agent", scopes: ["inference:run", "models:read"], via: "token" };
const operator: Principal = { id: "operator", scopes: ["approvals:grant"], via: "token" };

function makeGate(rules: AlertRule[], file = tmp.file(`alerts-${Math.random()}.db`)) {
  const config = parsePolicyConfig({ approvals: { rules: [] } }, TOOL_POLICIES);
  const clock = new FakeClock();
  const logger = captureLogger();
  const budget = new SqliteBudgetLedger(file, { ...config.limits.budget, clock: clock.now });
  const audit = new SqliteAuditTrail(file, { logger, now: clock.now });
  const suspensions = new SqliteSuspensionStore(file);
  const store = new SqliteAlertStore(file);
  const ref: { alerts?: Alerts } = {};
  const gate = new Gate({
    tools: TOOL_POLICIES,
    config,
    approvals: new SqliteApprovalQueue(file, { clock: clock.now }),
    audit,
    limiter: new ConcurrencyLimiter(config.limits, clock.now),
    rateLimiter: new RateLimiter(1_000_000, clock.now),
    budget,
    suspensions,
    observer: {
      refused: (p, c) => ref.alerts?.refused(p, c),
      charged: (p) => ref.alerts?.charged(p),
    },
    clock: clock.now,
    logger,
  });
  ref.alerts = new Alerts({
    rules,
    store,
    logger,
    suspend: (s) => gate.suspendPrincipal(s),
    audit: (rec) => void audit.append({ time: new Date(clock.now()).toISOString(), ...rec }),
    budgetUse: (p) => budget.check(p, 0),
    pendingApprovals: async () => [],
    webhooks: [],
    clock: clock.now,
  });
  return { gate, clock, audit, suspensions, store, alerts: ref.alerts, logger, file };
}

const flood: AlertRule = {
  name: "flood",
  kind: "refusals",
  threshold: 5,
  window_s: 60,
  action: "suspend",
  suspend_s: 0,
};

const infer = (n: number): GateCall => ({
  principal: agent,
  tool: "run_inference",
  args: { model: "mnist-cnn", n },
  device: "cpu",
});

/** The alerts stored, once every one fired so far has been claimed and acted on. */
async function firedOf(alerts: Alerts) {
  await alerts.drain();
  return alerts.recent();
}

async function codeOf(p: Promise<unknown>): Promise<string> {
  try {
    await p;
    return "ok";
  } catch (e) {
    if (isPolicyError(e)) return e.code;
    throw e;
  }
}

describe("alert rules at work on the gate", () => {
  it("suspends a flooding principal, stops its running call, and the CLI's resume restores it", async () => {
    const { gate, audit, alerts, file } = makeGate([flood]);
    // A call that runs until it is stopped, and reports why.
    let reason: unknown;
    const running = gate.run(
      infer(0),
      (signal) =>
        new Promise((resolve) =>
          signal.addEventListener("abort", () => {
            reason = signal.reason;
            resolve("partial");
          }),
        ),
    );
    await new Promise((r) => setTimeout(r, 10));
    for (let i = 0; i < 4; i++)
      await expect(
        gate.refuse(agent, "run_inference", { i }, "unknown_model", "no"),
      ).resolves.toBeUndefined();
    expect(await gate.suspended()).toEqual([]);
    await gate.refuse(agent, "run_inference", { i: 5 }, "unknown_model", "no"); // the 5th: suspended
    await alerts.drain();
    expect(await gate.suspended()).toMatchObject([
      { principal: "agent", rule: "flood", until: null },
    ]);
    expect(await running).toBe("partial");
    expect((reason as PolicyError).code).toBe("principal_suspended");
    expect(stopReasonOf(reason)).toBe("budget");

    // Every call is refused now, with the reason and how it ends.
    const refused = gate.run(infer(1), async () => "ran");
    await expect(refused).rejects.toMatchObject({ code: "principal_suspended" });
    await refused.catch((e: PolicyError) =>
      expect(e.message).toContain(
        "It ends when an operator runs `tpu-mcp principals resume agent`",
      ),
    );
    await expect(gate.enforceScope(agent, "load_model")).rejects.toThrow(/suspended/);
    expect(await firedOf(alerts)).toHaveLength(1);

    // Another process over the same file (a restart, the CLI) sees the suspension and lifts it.
    const other = makeGate([flood], file);
    expect(await other.gate.suspended()).toHaveLength(1);
    expect(await other.gate.resumePrincipal("agent", operator)).toMatchObject({ rule: "flood" });
    expect(await codeOf(gate.run(infer(2), async () => "ran"))).toBe("ok");

    const trail = await audit.tail(50);
    expect(trail.filter((r) => r.outcome === "alert")).toHaveLength(1);
    expect(trail.find((r) => r.outcome === "suspended")).toMatchObject({
      principal: "agent",
      code: "principal_suspended",
    });
    expect(trail.find((r) => r.outcome === "resumed")).toMatchObject({ approver: "operator" });
    expect(trail.find((r) => r.outcome === "failed")).toMatchObject({
      code: "principal_suspended",
    });
  });

  it("does not count a suspended principal's refusals, and the quiet time survives a restart", async () => {
    const { gate, alerts, clock, file } = makeGate([{ ...flood, action: "notify" }]);
    for (let i = 0; i < 12; i++)
      await gate.refuse(agent, "run_inference", { i }, "unknown_model", "no");
    expect(await firedOf(alerts)).toHaveLength(1); // once in the window, not at 5 and 10
    const restarted = makeGate([{ ...flood, action: "notify" }], file);
    restarted.clock.ms = clock.ms + 1000;
    for (let i = 0; i < 6; i++)
      await restarted.gate.refuse(agent, "run_inference", { i }, "unknown_model", "no");
    expect(await firedOf(restarted.alerts)).toHaveLength(1);
    // After the window, a new flood fires again.
    restarted.clock.ms += 61_000;
    for (let i = 0; i < 6; i++)
      await restarted.gate.refuse(agent, "run_inference", { i }, "unknown_model", "no");
    expect(await firedOf(restarted.alerts)).toHaveLength(2);
  });

  it("does not count the server's own refusals (busy, a worker starting or gone)", async () => {
    const { gate, alerts } = makeGate([{ ...flood, action: "notify" }]);
    for (const code of ["busy", "runtime_setting_up", "worker_unavailable", "engine_unavailable"])
      for (let i = 0; i < 12; i++) await gate.refuse(agent, "run_inference", { i }, code, "no");
    expect(await firedOf(alerts)).toHaveLength(0);
    for (let i = 0; i < 5; i++)
      await gate.refuse(agent, "run_inference", { i }, "rate_limited", "no");
    expect(await firedOf(alerts)).toHaveLength(1);
  });

  it("a budget rule fires once per budget window when the principal's use reaches its percent", async () => {
    const { gate, alerts, clock } = makeGate([
      { name: "budget-half", kind: "budget", percent: 50, action: "notify", suspend_s: 900 },
    ]);
    const est = {
      device_seconds: 1000,
      memory_bytes: 1,
      compile_s: 0,
      weight_bytes: 0,
      fits: true,
    };
    const work = (ms: number) => async () => {
      clock.ms += ms;
      return "done";
    };
    await gate.run({ ...infer(0), estimate: est }, work(1_000_000)); // 1,000 s of 3,600
    expect(await firedOf(alerts)).toHaveLength(0);
    await gate.run({ ...infer(1), estimate: est }, work(900_000)); // 1,900 s: 52.8 %
    await gate.run({ ...infer(2), estimate: est }, work(100_000));
    const fired = await firedOf(alerts);
    expect(fired).toHaveLength(1);
    expect(fired[0]).toMatchObject({ rule: "budget-half", subject: "agent", action: "notify" });
    expect(fired[0].details.percent_used).toBeGreaterThanOrEqual(50);
  });
});

describe("alert rules without a principal", () => {
  function alertsOf(
    rules: AlertRule[],
    pending: () => any[] = () => [],
    file = tmp.file(`alerts-np-${Math.random()}.db`),
  ) {
    const clock = new FakeClock();
    const audited: any[] = [];
    const fired: string[] = [];
    const alerts = new Alerts({
      rules,
      store: new SqliteAlertStore(file),
      logger: captureLogger(),
      suspend: async () => {
        throw new Error("nothing is suspended by these rules");
      },
      audit: (rec) => audited.push(rec),
      budgetUse: async () => ({ used_s: 0, limit_s: 1, window_s: 1 }),
      pendingApprovals: async () => pending(),
      webhooks: [],
      clock: clock.now,
      onFired: (a) => fired.push(a.id),
    });
    return { alerts, clock, audited, fired };
  }

  it("fires once per window across two processes on one store: the store's claim decides", async () => {
    const file = tmp.file(`alerts-two-${Math.random()}.db`);
    const rule: AlertRule = {
      name: "crash-loop",
      kind: "worker_restarts",
      threshold: 2,
      window_s: 600,
    };
    // Both started before either fired: neither's latch knows of the other's alert.
    const a = alertsOf([rule], undefined, file);
    const b = alertsOf([rule], undefined, file);
    await Promise.all([a.alerts.drain(), b.alerts.drain()]);
    for (const x of [a, b]) {
      x.alerts.workerRestarted("w0");
      x.alerts.workerRestarted("w0");
    }
    await Promise.all([a.alerts.drain(), b.alerts.drain()]);
    expect(await a.alerts.recent()).toHaveLength(1);
    // The first claimed the window; the second neither audits nor tells of its own.
    expect([a.fired.length, b.fired.length]).toEqual([1, 0]);
    expect([a.audited.length, b.audited.length]).toEqual([1, 0]);
    // After the window, the second fires (its clock moved past the first's quiet time).
    b.clock.advance(601_000);
    b.alerts.workerRestarted("w0");
    b.alerts.workerRestarted("w0");
    expect(await firedOf(b.alerts)).toHaveLength(2);
    expect(b.fired).toHaveLength(1);
  });

  it("a worker restarting `threshold` times within the window fires once", async () => {
    const { alerts, clock, audited } = alertsOf([
      { name: "crash-loop", kind: "worker_restarts", threshold: 3, window_s: 600 },
    ]);
    alerts.workerRestarted("w0");
    clock.advance(100_000);
    alerts.workerRestarted("w1"); // another worker counts apart
    alerts.workerRestarted("w0");
    expect(await firedOf(alerts)).toHaveLength(0);
    clock.advance(100_000);
    alerts.workerRestarted("w0");
    alerts.workerRestarted("w0");
    expect(await firedOf(alerts)).toMatchObject([
      { rule: "crash-loop", subject: "w0", principal: null, action: "notify" },
    ]);
    expect(audited).toMatchObject([
      { principal: "tpu-mcp", outcome: "alert", code: "worker_restarts" },
    ]);
  });

  it("an approval waiting longer than after_s fires once for that approval", async () => {
    const created = new Date(Date.parse("2025-01-01T00:00:00Z")).toISOString();
    const pending = [
      { id: "apr_1", principal: "agent", tool: "run_benchmark", created_at: created },
    ];
    const { alerts, clock } = alertsOf(
      [{ name: "waiting", kind: "approval_waiting", after_s: 600 }],
      () => pending,
    );
    clock.advance(599_000);
    await alerts.scanApprovals();
    expect(await firedOf(alerts)).toHaveLength(0);
    clock.advance(2_000);
    await alerts.scanApprovals();
    await alerts.scanApprovals();
    expect(await firedOf(alerts)).toMatchObject([
      { rule: "waiting", subject: "apr_1", principal: "agent" },
    ]);
    expect((await alerts.recent())[0].message).toContain("has waited 601 s");
  });
});
