import { readFileSync } from "node:fs";
import { afterAll, describe, expect, it, vi } from "vitest";
import { SqliteApprovalQueue } from "../../server/stores/approvals/sqlite.js";
import { SqliteAuditTrail } from "../../server/stores/audit/sqlite.js";
import {
  parsePolicyConfig,
  type ApprovalRule,
  type PolicyConfigInput,
} from "../../policies/config.js";
import { PolicyError } from "../../policies/errors.js";
import type { CostEstimate } from "../../policies/estimate.js";
import { matchApprovalRule, ruleApplies } from "../../policies/gate/approval_flow.js";
import { Gate, type ElicitPrompt, type GateCall } from "../../policies/gate/gate.js";
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
  scopes: [
    "models:read",
    "models:load",
    "models:unload",
    "inference:run",
    "benchmark:run",
    "jobs:read",
  ],
  via: "token",
};
const reader: Principal = { id: "reader", scopes: ["models:read"], via: "token" };
const operator: Principal = { id: "operator", scopes: ["approvals:grant"], via: "token" };

const est = (over: Partial<CostEstimate> = {}): CostEstimate => ({
  device_seconds: 10,
  memory_bytes: 200e6,
  compile_s: 0,
  weight_bytes: 8e6,
  fits: true,
  ...over,
});

const demoPolicy = JSON.parse(
  readFileSync(new URL("../../examples/policy.demo.json", import.meta.url), "utf8"),
).policy as PolicyConfigInput;

function makeGate(
  policy: PolicyConfigInput = demoPolicy,
  deps: Partial<ConstructorParameters<typeof Gate>[0]> = {},
) {
  const config = parsePolicyConfig(policy, TOOL_POLICIES);
  const clock = new FakeClock();
  const logger = captureLogger();
  const file = tmp.file(`gate-${Math.random().toString(36).slice(2)}.db`);
  const approvals = new SqliteApprovalQueue(file, { clock: clock.now });
  const audit = new SqliteAuditTrail(file, { logger });
  const budget = new SqliteBudgetLedger(file, { ...config.limits.budget, clock: clock.now });
  const limiter = new ConcurrencyLimiter(config.limits, clock.now);
  const rateLimiter = new RateLimiter(config.limits.rate_limit.per_principal_per_minute, clock.now);
  const gate = new Gate({
    tools: TOOL_POLICIES,
    config,
    approvals,
    audit,
    limiter,
    rateLimiter,
    budget,
    clock: clock.now,
    logger,
    ...deps,
  });
  return { gate, clock, approvals, audit, budget, logger, config };
}

async function refusal(p: Promise<unknown>): Promise<PolicyError> {
  try {
    await p;
  } catch (e) {
    if (e instanceof PolicyError) return e;
    throw e;
  }
  throw new Error("expected a PolicyError");
}

const loadMinilm = (over: Partial<GateCall> = {}): GateCall => ({
  principal: agent,
  tool: "load_model",
  args: { model: "all-minilm-l6-v2", device: "cpu", dtype: "float32" },
  device: "cpu",
  estimate: est({ weight_bytes: 90_900_000 }),
  ...over,
});

describe("approval rules", () => {
  const rule = (r: Partial<ApprovalRule> & { tool: string }): ApprovalRule => r as ApprovalRule;

  it("matches by tool, principal and ANY estimate threshold", () => {
    const r = rule({
      tool: "load_model",
      principals: ["agent"],
      when: { min_weight_bytes: 50e6, min_device_seconds: 600 },
    });
    expect(ruleApplies(r, "agent", "load_model", est({ weight_bytes: 90e6 }))).toBe(true);
    expect(ruleApplies(r, "agent", "load_model", est({ device_seconds: 601 }))).toBe(true);
    expect(ruleApplies(r, "agent", "load_model", est())).toBe(false);
    expect(ruleApplies(r, "other", "load_model", est({ weight_bytes: 90e6 }))).toBe(false);
    expect(ruleApplies(r, "agent", "run_benchmark", est({ weight_bytes: 90e6 }))).toBe(false);
  });

  it("treats a threshold without an estimate as met, and '*' as every tool", () => {
    expect(
      ruleApplies(
        rule({ tool: "load_model", when: { min_memory_bytes: 1 } }),
        "a",
        "load_model",
        undefined,
      ),
    ).toBe(true);
    expect(ruleApplies(rule({ tool: "*" }), "a", "get_job", undefined)).toBe(true);
  });

  it("applies the demo rules: every benchmark, and loads over 50 MB", () => {
    const { config } = makeGate();
    const rules = config.approvals.rules;
    expect(matchApprovalRule(rules, "agent", "run_benchmark", est())).toBeDefined();
    expect(
      matchApprovalRule(rules, "agent", "load_model", est({ weight_bytes: 90_900_000 })),
    ).toBeDefined();
    expect(
      matchApprovalRule(rules, "agent", "load_model", est({ weight_bytes: 8_000_000 })),
    ).toBeUndefined();
    expect(matchApprovalRule(rules, "agent", "run_inference", est())).toBeUndefined();
  });
});

describe("Gate", () => {
  it("runs an allowed call and audits allowed then executed", async () => {
    const { gate, audit } = makeGate();
    const fn = vi.fn(async (signal: AbortSignal) => (signal.aborted ? "aborted" : "ok"));
    const out = await gate.run(
      {
        principal: agent,
        tool: "load_model",
        args: { model: "tiny-gpt2", device: "cpu" },
        device: "cpu",
        estimate: est(),
      },
      fn,
    );
    expect(out).toBe("ok");
    expect(fn).toHaveBeenCalledOnce();
    expect((await audit.tail(10)).map((r) => r.outcome)).toEqual(["allowed", "executed"]);
    expect((await audit.verify()).ok).toBe(true);
  });

  it("checks scope first, before memory or approval", async () => {
    const { gate, audit, approvals } = makeGate();
    const fn = vi.fn(async () => "never");
    const e = await refusal(
      gate.run(
        loadMinilm({ principal: reader, estimate: est({ fits: false, weight_bytes: 9e9 }) }),
        fn,
      ),
    );
    expect(e.code).toBe("insufficient_scope");
    expect(e.details.required_scope).toBe("models:load");
    expect(fn).not.toHaveBeenCalled();
    expect(await approvals.list()).toHaveLength(0);
    expect((await audit.tail(1))[0]).toMatchObject({
      outcome: "denied",
      code: "insufficient_scope",
      principal: "reader",
    });
  });

  it("refuses what does not fit before asking for approval, passing the suggestion on", async () => {
    const { gate, approvals } = makeGate();
    const e = await refusal(
      gate.run(
        loadMinilm({
          estimate: est({
            weight_bytes: 90e6,
            fits: false,
            reason: "needs 18.0 GiB, device has 16.0 GiB free",
            suggestion: "use dtype bfloat16",
          }),
        }),
        async () => "never",
      ),
    );
    expect(e.code).toBe("insufficient_memory");
    expect(e.message).toContain("needs 18.0 GiB, device has 16.0 GiB free");
    expect(e.details.suggestion).toBe("use dtype bfloat16");
    expect(await approvals.list()).toHaveLength(0);
  });

  it("names a console to start on the same data only while it knows none (stdio), and no console without one", async () => {
    const start = {
      command: "npx -y tpu-mcp http --home /h",
      url: "http://localhost:7801/console/",
    };
    const approveCommand = (id: string) => `npx -y tpu-mcp approvals approve ${id} --home /h`;
    const stdio = await refusal(
      makeGate(demoPolicy, { approveCommand, consoleStart: start }).gate.run(loadMinilm(), vi.fn()),
    );
    const id = stdio.details.approval_id as string;
    expect(stdio.message).toContain(
      `approve it in a console (start one on this server's data with \`${start.command}\`, then open ${start.url}), or to run \`${approveCommand(id)}\` (from any folder).`,
    );
    expect(stdio.details).toMatchObject({
      console_command: start.command,
      approve_command: approveCommand(id),
    });

    const served = await refusal(
      makeGate(demoPolicy, {
        approveCommand,
        consoleStart: start,
        consoleUrl: () => "http://localhost:9/console/",
      }).gate.run(loadMinilm(), vi.fn()),
    );
    expect(served.message).toContain("in the console (http://localhost:9/console/#/approvals/");
    expect(served.message).not.toContain(start.command);
    expect(served.details.console_command).toBeUndefined();

    // No console can be served (none built): only the command, and no console is promised.
    const none = await refusal(
      makeGate(demoPolicy, { approveCommand }).gate.run(loadMinilm(), vi.fn()),
    );
    expect(none.message).toContain(
      `Ask an operator to run \`${approveCommand(none.details.approval_id as string)}\``,
    );
    expect(none.message).not.toMatch(/console/);
  });

  it("asks for approval out of band, then runs once with the approved id", async () => {
    const { gate, audit } = makeGate();
    const fn = vi.fn(async () => "loaded");

    const first = await refusal(gate.run(loadMinilm(), fn));
    expect(first.code).toBe("approval_required");
    const id = first.details.approval_id as string;
    expect(id).toMatch(/^apr_/);
    expect(first.message).toContain(`node bin/tpu-mcp.js approvals approve ${id}`);
    expect(first.message).toContain("approval_id");
    expect(first.details.expires_at).toBeTypeOf("string");
    expect((await audit.tail(1))[0]).toMatchObject({
      outcome: "approval_requested",
      code: "approval_required",
      approval_id: id,
    });

    // Asking again without an id returns the same pending request instead of piling up new ones.
    const again = await refusal(gate.run(loadMinilm(), fn));
    expect(again.details.approval_id).toBe(id);

    // Presenting the id before the decision is not enough.
    const early = await refusal(
      gate.run(loadMinilm({ args: { ...loadMinilm().args, approval_id: id } }), fn),
    );
    expect(early.code).toBe("approval_pending");

    await gate.decideApproval(id, operator, "approve");
    const withId = loadMinilm({
      args: { device: "cpu", dtype: "float32", model: "all-minilm-l6-v2", approval_id: id },
    });
    await expect(gate.run(withId, fn)).resolves.toBe("loaded");
    expect(fn).toHaveBeenCalledOnce();

    const reuse = await refusal(gate.run(withId, fn));
    expect(reuse.code).toBe("approval_used");
    expect(fn).toHaveBeenCalledOnce();

    const outcomes = (await audit.tail(20)).map((r) => r.outcome);
    expect(outcomes).toEqual([
      "approval_requested",
      "approval_requested",
      "denied",
      "approval_granted",
      "allowed",
      "executed",
      "denied",
    ]);
    expect((await audit.verify()).ok).toBe(true);
  });

  it("never treats confirm: true or an unusable approval_id as approval", async () => {
    const { gate } = makeGate();
    const fn = vi.fn(async () => "x");
    const confirm = await refusal(
      gate.run(loadMinilm({ args: { ...loadMinilm().args, confirm: true } }), fn),
    );
    expect(confirm.code).toBe("approval_required");
    const bogus = await refusal(
      gate.run(loadMinilm({ args: { ...loadMinilm().args, approval_id: "apr_0000" } }), fn),
    );
    expect(bogus.code).toBe("approval_not_found");
    expect(fn).not.toHaveBeenCalled();
  });

  it("binds the approval to the exact arguments and principal", async () => {
    const { gate, approvals } = makeGate();
    const fn = vi.fn(async () => "x");
    const id = (await refusal(gate.run(loadMinilm(), fn))).details.approval_id as string;
    await gate.decideApproval(id, operator, "approve");
    const otherArgs = await refusal(
      gate.run(
        loadMinilm({
          args: { model: "all-minilm-l6-v2", device: "cpu", dtype: "float16", approval_id: id },
        }),
        fn,
      ),
    );
    expect(otherArgs.code).toBe("approval_mismatch");
    const otherPrincipal = await refusal(
      gate.run(
        loadMinilm({
          principal: { ...agent, id: "agent2" },
          args: { ...loadMinilm().args, approval_id: id },
        }),
        fn,
      ),
    );
    expect(otherPrincipal.code).toBe("approval_not_found");
    expect((await approvals.get(id))!.status).toBe("approved");
    expect(fn).not.toHaveBeenCalled();
  });

  it("reports expired and denied approvals with their own codes and audit outcomes", async () => {
    const { gate, clock, audit } = makeGate();
    const fn = async () => "x";
    const id1 = (await refusal(gate.run(loadMinilm(), fn))).details.approval_id as string;
    await gate.decideApproval(id1, operator, "deny", "not today");
    const denied = await refusal(
      gate.run(loadMinilm({ args: { ...loadMinilm().args, approval_id: id1 } }), fn),
    );
    expect(denied.code).toBe("approval_denied");
    expect(denied.message).toContain("not today");

    const bench: GateCall = {
      principal: agent,
      tool: "run_benchmark",
      args: { model: "tiny-gpt2" },
      device: "cpu",
      estimate: est(),
    };
    const id2 = (await refusal(gate.run(bench, fn))).details.approval_id as string;
    await gate.decideApproval(id2, operator, "approve");
    clock.advance(901_000);
    const expired = await refusal(
      gate.run({ ...bench, args: { ...bench.args, approval_id: id2 } }, fn),
    );
    expect(expired.code).toBe("approval_expired");
    expect((await audit.tail(1))[0]!.outcome).toBe("approval_expired");
  });

  it("lets only a different identity with approvals:grant decide", async () => {
    const { gate, audit } = makeGate();
    const id = (await refusal(gate.run(loadMinilm(), async () => "x"))).details
      .approval_id as string;
    await expect(gate.decideApproval(id, reader, "approve")).rejects.toThrow(
      expect.objectContaining({ code: "insufficient_scope" }),
    );
    const selfOp: Principal = { ...agent, scopes: [...agent.scopes, "approvals:grant"] };
    await expect(gate.decideApproval(id, selfOp, "approve")).rejects.toThrow(
      expect.objectContaining({ code: "approval_self_grant" }),
    );
    expect((await audit.tail(2)).map((r) => r.code)).toEqual([
      "insufficient_scope",
      "approval_self_grant",
    ]);
    expect((await gate.decideApproval(id, operator, "approve")).status).toBe("approved");
  });

  it("uses elicitation when the client supports it and the rule allows it (client_form)", async () => {
    const { gate, audit } = makeGate({
      ...demoPolicy,
      approvals: {
        ...demoPolicy.approvals,
        rules: demoPolicy.approvals!.rules!.map((r) => ({ ...r, assurance: "client_form" })),
        elicitation: true,
      },
    });
    const fn = vi.fn(async () => "ok");
    const elicit = vi.fn<(p: ElicitPrompt) => Promise<"accept">>(async () => "accept");
    await expect(gate.run(loadMinilm({ elicit }), fn)).resolves.toBe("ok");
    expect(elicit.mock.calls[0]![0]).toMatchObject({ tool: "load_model" });
    expect(await audit.tail(3)).toMatchObject([
      { outcome: "approval_granted", approver: "client-form:agent", assurance: "client_form" },
      { outcome: "allowed" },
      { outcome: "executed" },
    ]);

    const decline = await refusal(gate.run(loadMinilm({ elicit: async () => "decline" }), fn));
    expect(decline.code).toBe("approval_declined");
    const cancel = await refusal(gate.run(loadMinilm({ elicit: async () => "cancel" }), fn));
    expect(cancel.code).toBe("approval_declined");
    expect((await audit.tail(1))[0]).toMatchObject({
      outcome: "approval_denied",
      code: "approval_declined",
    });

    // A client whose elicitation fails falls back to the out-of-band path.
    const broken = await refusal(
      gate.run(
        loadMinilm({
          elicit: async () => {
            throw new Error("client does not support elicitation");
          },
        }),
        fn,
      ),
    );
    expect(broken.code).toBe("approval_required");
    expect(fn).toHaveBeenCalledOnce();
  });

  it("does not elicit when the config says approvals are decided out of band", async () => {
    const { gate } = makeGate();
    const elicit = vi.fn(async () => "accept" as const);
    const e = await refusal(gate.run(loadMinilm({ elicit }), async () => "x"));
    expect(e.code).toBe("approval_required");
    expect(elicit).not.toHaveBeenCalled();
  });

  it("rate-limits per principal, before the estimate and approval checks", async () => {
    const { gate, clock } = makeGate({ limits: { rate_limit: { per_principal_per_minute: 2 } } });
    const call: GateCall = { principal: agent, tool: "list_models", args: {} };
    await gate.run(call, async () => 1);
    await gate.run(call, async () => 2);
    const e = await refusal(gate.run(call, async () => 3));
    expect(e.code).toBe("rate_limited");
    expect(e.details.retry_after_ms).toBe(30_000);
    await expect(gate.run({ ...call, principal: reader }, async () => 4)).resolves.toBe(4);
    clock.advance(30_000);
    await expect(gate.run(call, async () => 5)).resolves.toBe(5);
  });

  it("checks the budget with the estimate and charges the measured device time", async () => {
    const { gate, clock } = makeGate({
      limits: { budget: { device_seconds_per_window: 150, window_s: 3600 } },
    });
    const call: GateCall = {
      principal: agent,
      tool: "run_inference",
      args: { texts: ["a"] },
      device: "cpu",
      estimate: est({ device_seconds: 60 }),
    };
    await gate.run(call, async () => clock.advance(100_000)); // ran 100 s, though 60 were estimated
    const e = await refusal(gate.run(call, async () => "x"));
    expect(e.code).toBe("budget_exceeded");
    expect(e.details).toMatchObject({ remaining_s: 50, limit_s: 150, needed_s: 60 });
    expect(e.details.retry_after_ms).toBeGreaterThan(0);
    expect(e.details.resets_at).toBeTypeOf("string");
    clock.advance(3_600_000);
    await expect(gate.run(call, async () => "again")).resolves.toBe("again");
  });

  it("refuses with busy at once when the tool queue is full", async () => {
    const { gate, audit } = makeGate({
      limits: { per_tool_concurrency: { load_model: 1 }, queue_bound: { load_model: 0 } },
    });
    let finish!: () => void;
    const running = gate.run(
      {
        principal: agent,
        tool: "load_model",
        args: { model: "tiny-gpt2" },
        device: "cpu",
        estimate: est(),
      },
      () => new Promise<string>((r) => (finish = () => r("done"))),
    );
    await flush();
    const e = await refusal(
      gate.run(
        {
          principal: agent,
          tool: "load_model",
          args: { model: "tiny-gpt2", dtype: "float16" },
          device: "cpu",
          estimate: est(),
        },
        async () => "x",
      ),
    );
    expect(e.code).toBe("busy");
    expect(e.details.retry_after_ms).toBeGreaterThan(0);
    expect((await audit.tail(1))[0]).toMatchObject({ outcome: "denied", code: "busy" });
    finish();
    await expect(running).resolves.toBe("done");
  });

  it("times out a call, aborting the signal handed to fn", async () => {
    const { gate, audit } = makeGate({ limits: { call_timeout_s: { run_inference: 0.02 } } });
    let seen: AbortSignal | undefined;
    const e = await refusal(
      gate.run({ principal: agent, tool: "run_inference", args: {}, device: "cpu" }, (signal) => {
        seen = signal;
        return new Promise((_, reject) =>
          signal.addEventListener("abort", () => reject(new Error("worker cancelled"))),
        );
      }),
    );
    expect(e.code).toBe("timeout");
    expect(seen!.aborted).toBe(true);
    expect((await audit.tail(1))[0]).toMatchObject({ outcome: "failed", code: "timeout" });
  });

  it("passes the caller's cancellation through to fn", async () => {
    const { gate } = makeGate();
    const ac = new AbortController();
    const p = gate.run(
      { principal: agent, tool: "run_inference", args: {}, device: "cpu", signal: ac.signal },
      (signal) =>
        new Promise((_, reject) =>
          signal.addEventListener("abort", () => reject(new Error("stopped"))),
        ),
    );
    await flush();
    ac.abort();
    expect((await refusal(p)).code).toBe("cancelled");
  });

  it("audits a failing fn with its code and still charges the device time", async () => {
    const { gate, audit, budget, clock } = makeGate();
    const err = Object.assign(new Error("worker died"), { code: "worker_died" });
    await expect(
      gate.run(
        {
          principal: agent,
          tool: "run_inference",
          args: { texts: ["x"] },
          device: "cpu",
          estimate: est(),
        },
        async () => {
          clock.advance(5_000);
          throw err;
        },
      ),
    ).rejects.toBe(err);
    expect((await audit.tail(1))[0]).toMatchObject({
      outcome: "failed",
      code: "worker_died",
      duration_ms: 5000,
    });
    expect((await budget.check("agent", 0)).used_s).toBe(5);
  });

  it("redacts texts in the audit and refuses non-finite arguments", async () => {
    const { gate, audit } = makeGate();
    await gate.run(
      {
        principal: agent,
        tool: "run_inference",
        args: { model: "m", texts: ["top secret"] },
        device: "cpu",
      },
      async () => 1,
    );
    expect(JSON.stringify(await audit.tail(2))).not.toContain("top secret");
    expect((await audit.tail(1))[0]!.args).toEqual({
      model: "m",
      texts: { redacted: true, count: 1, total_chars: 10 },
    });
    const e = await refusal(
      gate.run({ principal: agent, tool: "run_inference", args: { x: NaN } }, async () => 1),
    );
    expect(e.code).toBe("invalid_argument");
  });
});
