// Issue 33, minor row 8: a server killed mid-call leaves the call in calls_in_flight; the next
// start settles it once (an `interrupted` record, the charge, the approval given back for the
// same arguments until its expiry). Real SQLite stores on one file; "killed" is a gate whose
// work never ends and whose stores are never closed, the restart a new gate on the same file.
import { readFileSync } from "node:fs";
import { afterAll, describe, expect, it } from "vitest";
import { SqliteApprovalQueue } from "../../server/stores/approvals/sqlite.js";
import { SqliteAuditTrail } from "../../server/stores/audit/sqlite.js";
import { SqliteCallsInFlight, type CallInFlight } from "../../policies/calls_in_flight.js";
import { parsePolicyConfig, type PolicyConfigInput } from "../../policies/config.js";
import { PolicyError } from "../../policies/errors.js";
import type { CostEstimate } from "../../policies/estimate.js";
import { Gate, type GateCall } from "../../policies/gate/gate.js";
import { interruptedCharge } from "../../policies/gate/reconcile.js";
import { SqliteBudgetLedger } from "../../policies/limits/budget.js";
import { ConcurrencyLimiter } from "../../policies/limits/concurrency.js";
import { RateLimiter } from "../../policies/limits/rate.js";
import type { Principal } from "../../policies/scopes.js";
import { openStoreDb } from "../../policies/sqlite.js";
import { TOOL_POLICIES } from "../../tools/registry.js";
import { captureLogger, FakeClock, flush, tempDir } from "./helpers.js";

const tmp = tempDir();
afterAll(() => tmp.cleanup());

const agent: Principal = { id: "agent", scopes: ["benchmark:run", "models:read"], via: "token" };
const est: CostEstimate = {
  device_seconds: 30,
  memory_bytes: 1e6,
  compile_s: 0,
  weight_bytes: 1e6,
  fits: true,
};
const policy = JSON.parse(
  readFileSync(new URL("../../examples/policy.demo.json", import.meta.url), "utf8"),
).policy as PolicyConfigInput;
const bench = (args: Record<string, unknown>): GateCall => ({
  principal: agent,
  tool: "run_benchmark",
  args: { model: "tiny-gpt2", iterations: 5, ...args },
  device: "cpu",
  estimate: est,
});

/** One server process's policy stores on `file`, as build_policies.ts makes them. */
function serverOn(file: string, clock: FakeClock) {
  const config = parsePolicyConfig(policy, TOOL_POLICIES);
  const db = openStoreDb(file);
  const approvals = new SqliteApprovalQueue(db, { clock: clock.now });
  const audit = new SqliteAuditTrail(db, { logger: captureLogger() });
  const budget = new SqliteBudgetLedger(db, { ...config.limits.budget, clock: clock.now });
  const calls = new SqliteCallsInFlight(db, {
    clock: clock.now,
    withCharges: (write) => budget.alongside(write),
  });
  const gate = new Gate({
    tools: TOOL_POLICIES,
    config,
    approvals,
    audit,
    limiter: new ConcurrencyLimiter(config.limits, clock.now),
    rateLimiter: new RateLimiter(1000, clock.now),
    budget,
    calls,
    clock: clock.now,
    logger: captureLogger(),
  });
  const used = async () => (await budget.check("agent", 0)).used_s;
  return { gate, approvals, audit, budget, calls, db, used };
}

async function approvalFor(s: ReturnType<typeof serverOn>, call: GateCall): Promise<string> {
  const e = await s.gate.run(call, async () => ({})).catch((x: unknown) => x);
  expect((e as PolicyError).code).toBe("approval_required");
  const id = (e as PolicyError).details.approval_id as string;
  await s.approvals.approve(id, "operator");
  return id;
}

describe("interruptedCharge", () => {
  const row = (over: Partial<CallInFlight>): CallInFlight => ({
    id: "call_x",
    principal: "agent",
    tool: "run_benchmark",
    args_digest: "d",
    args: {},
    estimate: est,
    started_ms: 1000,
    alive_ms: 1000,
    ...over,
  });
  it("charges from the start to the last heartbeat when one came after the start", () => {
    expect(interruptedCharge(row({ alive_ms: 7500 }))).toEqual({
      seconds: 6.5,
      basis: "heartbeat",
    });
  });
  it("charges the estimate when no heartbeat came after the start", () => {
    expect(interruptedCharge(row({}))).toEqual({ seconds: 30, basis: "estimate" });
  });
  it("charges nothing for a call with neither", () => {
    expect(interruptedCharge(row({ estimate: null }))).toEqual({ seconds: 0, basis: "none" });
  });
});

describe("a call left running by a killed server", () => {
  it("is settled once at the next start: interrupted, charged, its approval usable again", async () => {
    const file = tmp.file("killed.db");
    const clock = new FakeClock();
    const first = serverOn(file, clock);
    const call = bench({});
    const id = await approvalFor(first, call);
    let started = false;
    // The work never ends: the process is "killed" while it runs.
    void first.gate
      .run(bench({ approval_id: id }), () => {
        started = true;
        return new Promise<never>(() => {});
      })
      .catch(() => {});
    await flush();
    expect(started).toBe(true);
    expect((await first.approvals.get(id))!.status).toBe("used");
    clock.advance(12_000);
    first.calls.stampAlive();
    clock.advance(1_500); // past the last heartbeat: not known, not charged

    const second = serverOn(file, clock);
    const settled = await second.gate.reconcileInterrupted(second.calls);
    expect(settled).toHaveLength(1);
    const tail = await second.audit.tail(2);
    expect(tail.map((r) => r.outcome)).toEqual(["allowed", "interrupted"]);
    expect(tail[1]).toMatchObject({
      approval_id: id,
      code: "server_restarted",
      duration_ms: 12_000,
    });
    expect(tail[1]!.args_digest).toBe(tail[0]!.args_digest);
    expect(await second.used()).toBe(12);
    const back = (await second.approvals.get(id))!;
    expect(back.status).toBe("approved");
    expect(back.expires_at).toBe((await first.approvals.get(id))!.expires_at);

    // A second start finds nothing: no second record, no second charge.
    const third = serverOn(file, clock);
    expect(await third.gate.reconcileInterrupted(third.calls)).toEqual([]);
    expect(await third.used()).toBe(12);
    expect((await third.audit.tail(1))[0]!.outcome).toBe("interrupted");

    // Other arguments with that id are refused; the same arguments run on it, once.
    const other = await third.gate
      .run(bench({ iterations: 6, approval_id: id }), async () => ({}))
      .catch((e: PolicyError) => e);
    expect((other as PolicyError).code).toBe("approval_mismatch");
    await expect(third.gate.run(bench({ approval_id: id }), async () => "ran")).resolves.toBe(
      "ran",
    );
    expect((await third.approvals.get(id))!.status).toBe("used");
    // A call that ended is charged and leaves nothing behind.
    const fourth = serverOn(file, clock);
    expect(await fourth.gate.reconcileInterrupted(fourth.calls)).toEqual([]);
  });

  it("is charged its estimate when killed before the first heartbeat, and an expired approval stays used", async () => {
    const file = tmp.file("expired.db");
    const clock = new FakeClock();
    const first = serverOn(file, clock);
    const id = await approvalFor(first, bench({ iterations: 7 }));
    void first.gate
      .run(bench({ iterations: 7, approval_id: id }), () => new Promise<never>(() => {}))
      .catch(() => {});
    await flush();
    clock.advance(3600_000); // past the approval's TTL

    const second = serverOn(file, clock);
    const [rec] = await second.gate.reconcileInterrupted(second.calls);
    expect(rec).toMatchObject({ outcome: "interrupted", duration_ms: 30_000 });
    expect(rec!.reason).toContain("not given back");
    expect((await second.approvals.get(id))!.status).toBe("used");
    expect(await second.used()).toBe(30);
  });
  // Issue 43 row 10: the approval goes back only to the call that had used it. A left-behind row
  // that names another principal or other arguments (a data dir written by hand, or a bug that
  // mixes rows) leaves it used, and the approval itself stays bound to its principal and digest.
  for (const [what, change] of [
    ["another principal", "principal = 'mallory'"],
    ["other arguments (another digest)", "args_digest = 'sha256:0000'"],
  ] as const) {
    it(`does not give the approval back to a left-behind row naming ${what}`, async () => {
      const file = tmp.file(`tampered-${what.length}.db`);
      const clock = new FakeClock();
      const first = serverOn(file, clock);
      const id = await approvalFor(first, bench({ iterations: 8 }));
      void first.gate
        .run(bench({ iterations: 8, approval_id: id }), () => new Promise<never>(() => {}))
        .catch(() => {});
      await flush();
      expect((await first.approvals.get(id))!.status).toBe("used");
      first.db.prepare(`UPDATE calls_in_flight SET ${change} WHERE approval_id = ?`).run(id);

      const second = serverOn(file, clock);
      const [rec] = await second.gate.reconcileInterrupted(second.calls);
      expect(rec).toMatchObject({ outcome: "interrupted", approval_id: id });
      expect(rec!.reason).toContain("not given back");
      expect((await second.approvals.get(id))!.status).toBe("used");
      // Still the agent's, for these arguments, and used: nobody runs on it.
      const again = await second.gate
        .run(bench({ iterations: 8, approval_id: id }), async () => "ran")
        .catch((e: PolicyError) => e);
      expect((again as PolicyError).code).toBe("approval_used");
    });
  }

  it("a given-back approval still refuses another principal and other arguments", async () => {
    const file = tmp.file("bound.db");
    const clock = new FakeClock();
    const first = serverOn(file, clock);
    const id = await approvalFor(first, bench({ iterations: 9 }));
    void first.gate
      .run(bench({ iterations: 9, approval_id: id }), () => new Promise<never>(() => {}))
      .catch(() => {});
    await flush();
    const second = serverOn(file, clock);
    await second.gate.reconcileInterrupted(second.calls);
    expect((await second.approvals.get(id))!.status).toBe("approved");
    const mallory: Principal = { ...agent, id: "mallory" };
    const theirs = await second.gate
      .run({ ...bench({ iterations: 9, approval_id: id }), principal: mallory }, async () => "ran")
      .catch((e: PolicyError) => e);
    expect((theirs as PolicyError).code).toBe("approval_not_found");
    const other = await second.gate
      .run(bench({ iterations: 10, approval_id: id }), async () => "ran")
      .catch((e: PolicyError) => e);
    expect((other as PolicyError).code).toBe("approval_mismatch");
    // Neither refusal used it: the agent's own call with its arguments runs on it.
    await expect(
      second.gate.run(bench({ iterations: 9, approval_id: id }), async () => "ran"),
    ).resolves.toBe("ran");
  });
});
