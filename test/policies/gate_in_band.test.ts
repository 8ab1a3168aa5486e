// Who may decide an approval in band (issue 33): only a rule of `"assurance": "client_form"` is
// ever asked in the client, in either era (the 2025 pushed prompt, the 2026-07-28 input_required
// round), because whoever answers that form may be the agent itself. A token or a passkey rule is
// answered approval_required with the out-of-band way, whatever the client can show; the answer
// to a client_form rule is recorded under the name of what it is worth, `client-form:<principal>`.
import { randomBytes } from "node:crypto";
import { afterAll, describe, expect, it, vi } from "vitest";
import { SqliteApprovalQueue } from "../../server/stores/approvals/sqlite.js";
import { SqliteAuditTrail } from "../../server/stores/audit/sqlite.js";
import { parsePolicyConfig, type PolicyConfigInput } from "../../policies/config.js";
import { PolicyError } from "../../policies/errors.js";
import type { CostEstimate } from "../../policies/estimate.js";
import { Gate, InputRequired, type GateCall } from "../../policies/gate/gate.js";
import { SqliteBudgetLedger } from "../../policies/limits/budget.js";
import { ConcurrencyLimiter } from "../../policies/limits/concurrency.js";
import { RateLimiter } from "../../policies/limits/rate.js";
import { RequestStateSealer } from "../../policies/request_state.js";
import type { Principal } from "../../policies/scopes.js";
import { TOOL_POLICIES } from "../../tools/registry.js";
import { captureLogger, FakeClock, tempDir } from "./helpers.js";

const tmp = tempDir();
afterAll(() => tmp.cleanup());

const agent: Principal = {
  id: "agent",
  scopes: ["models:read", "models:load", "benchmark:run", "jobs:read"],
  via: "token",
};
const est: CostEstimate = {
  device_seconds: 3,
  memory_bytes: 200e6,
  compile_s: 0,
  weight_bytes: 8e6,
  fits: true,
};
const secret = randomBytes(32);

/** A gate over `file` (two gates on one file: the same server before and after a reload). */
function makeGate(policy: PolicyConfigInput, file = tmp.file(`g-${Math.random()}.db`)) {
  const config = parsePolicyConfig(policy, TOOL_POLICIES);
  const clock = new FakeClock();
  const logger = captureLogger();
  const approvals = new SqliteApprovalQueue(file, { clock: clock.now });
  const audit = new SqliteAuditTrail(file, { logger });
  const gate = new Gate({
    tools: TOOL_POLICIES,
    config,
    approvals,
    audit,
    limiter: new ConcurrencyLimiter(config.limits, clock.now),
    rateLimiter: new RateLimiter(6000, clock.now),
    budget: new SqliteBudgetLedger(file, { ...config.limits.budget, clock: clock.now }),
    requestStates: new RequestStateSealer(secret, clock.now),
    clock: clock.now,
    logger,
  });
  return { gate, approvals, audit, file };
}

const rules = (assurance?: "client_form" | "token" | "passkey"): PolicyConfigInput => ({
  approvals: { rules: [{ tool: "run_benchmark", ...(assurance ? { assurance } : {}) }] },
});

const bench = (over: Partial<GateCall> = {}): GateCall => ({
  principal: agent,
  tool: "run_benchmark",
  args: { model: "mnist-cnn", batch_sizes: [1] },
  estimate: est,
  ...over,
});

/** A client that answers every form "yes", as an agent answering its own client's prompts. */
const selfApprover = () => vi.fn(async () => "accept" as const);

async function refusal(p: Promise<unknown>): Promise<PolicyError> {
  try {
    await p;
  } catch (e) {
    if (e instanceof PolicyError) return e;
    throw e;
  }
  throw new Error("expected a PolicyError");
}

describe("an answer in the client decides only a client_form rule", () => {
  for (const assurance of [undefined, "token", "passkey"] as const) {
    const name = assurance ?? "default (token)";
    it(`a ${name} rule: the 2025 prompt is never shown; approval_required with the way out of band`, async () => {
      const { gate } = makeGate(rules(assurance));
      const elicit = selfApprover();
      const ran = vi.fn(async () => "ran");
      const e = await refusal(gate.run(bench({ elicit }), ran));
      expect(e.code).toBe("approval_required");
      expect(elicit).not.toHaveBeenCalled();
      expect(ran).not.toHaveBeenCalled();
      expect(e.message).toMatch(/An answer in the client cannot decide this approval/);
      expect(e.details.assurance).toBe(assurance ?? "token");
      if (assurance === "passkey") expect(e.message).toMatch(/with their passkey/);
      else expect(e.details.approve_command).toMatch(/approvals approve apr_/);
    });

    it(`a ${name} rule: the 2026-07-28 era is not answered input_required`, async () => {
      const { gate } = makeGate(rules(assurance));
      const e = await refusal(gate.run(bench({ inBand: { canAsk: true } }), async () => "ran"));
      expect(e.code).toBe("approval_required");
      expect(e.details.request_state).toBeUndefined();
    });
  }

  it("a client_form rule is asked in 2025; the yes is recorded as client-form:<principal>", async () => {
    const { gate, approvals, audit } = makeGate(rules("client_form"));
    const elicit = selfApprover();
    await expect(gate.run(bench({ elicit }), async () => "ran")).resolves.toBe("ran");
    expect(elicit).toHaveBeenCalledOnce();
    const granted = (await audit.tail(5)).find((r) => r.outcome === "approval_granted")!;
    expect(granted).toMatchObject({ approver: "client-form:agent", assurance: "client_form" });
    expect((await approvals.get(granted.approval_id!))?.decided_by).toBe("client-form:agent");
  });

  it("a client_form rule is asked in 2026-07-28; the retry with the state and a yes runs it", async () => {
    const { gate, audit } = makeGate(rules("client_form"));
    const ask = await gate.run(bench({ inBand: { canAsk: true } }), async () => "ran");
    expect(ask).toBeInstanceOf(InputRequired);
    const state = (ask as InputRequired).state;
    const retry = bench({ inBand: { canAsk: true, state, answer: "accept" } });
    await expect(gate.run(retry, async () => "ran")).resolves.toBe("ran");
    expect((await audit.tail(5)).find((r) => r.outcome === "approval_granted")).toMatchObject({
      approver: "client-form:agent",
      assurance: "client_form",
    });
  });

  it("approvals.elicitation false asks nobody, a client_form rule included", async () => {
    const { gate } = makeGate({
      approvals: {
        rules: [{ tool: "run_benchmark", assurance: "client_form" }],
        elicitation: false,
      },
    });
    const elicit = selfApprover();
    expect((await refusal(gate.run(bench({ elicit }), async () => "ran"))).code).toBe(
      "approval_required",
    );
    expect(elicit).not.toHaveBeenCalled();
    const modern = await refusal(gate.run(bench({ inBand: { canAsk: true } }), async () => "ran"));
    expect(modern.code).toBe("approval_required");
  });
});

describe("a rule raised or lowered between the request and the answer", () => {
  it("a rule raised to token: the approval made under client_form is no longer asked, and its sealed state is refused", async () => {
    const before = makeGate(rules("client_form"));
    const ask = (await before.gate.run(
      bench({ inBand: { canAsk: true } }),
      async () => "ran",
    )) as InputRequired;
    expect(ask).toBeInstanceOf(InputRequired);
    // The operator reloads with the rule raised; the store (and the sealing key) are the same.
    const after = makeGate(rules("token"), before.file);
    const elicit = selfApprover();
    const again = await refusal(after.gate.run(bench({ elicit }), async () => "ran"));
    expect(again.code).toBe("approval_required");
    // Another approval policy: a new request under the raised rule, not the one asked before.
    expect(again.details.approval_id).not.toBe(ask.approvalId);
    expect(again.details.assurance).toBe("token");
    expect(elicit).not.toHaveBeenCalled();
    const retry = bench({
      inBand: { canAsk: true, state: ask.state, answer: "accept" },
    });
    const e = await refusal(after.gate.run(retry, async () => "ran"));
    expect(e.code).toBe("invalid_request_state");
    expect(e.details.why).toBe("assurance");
    expect((await after.approvals.get(ask.approvalId))?.status).toBe("pending");
  });

  it("a rule lowered to client_form: an approval made under token never becomes one the form decides", async () => {
    const before = makeGate(rules("token"));
    const first = await refusal(before.gate.run(bench(), async () => "ran"));
    const id = first.details.approval_id as string;
    const after = makeGate(rules("client_form"), before.file);
    // The old request is not asked in band: the call makes a new one under the lowered rule, and
    // only that one is the form's to decide.
    const elicit = selfApprover();
    await expect(after.gate.run(bench({ elicit }), async () => "ran")).resolves.toBe("ran");
    expect(elicit).toHaveBeenCalledTimes(1);
    expect(JSON.stringify(elicit.mock.calls[0])).not.toContain(id);
    const old = (await after.approvals.get(id))!;
    expect(old).toMatchObject({ status: "pending", assurance: "token" });
    // Approved out of band after all, it no longer counts under the new policy: asked again.
    await after.approvals.approve(id, "operator");
    const stale = await refusal(
      after.gate.run(bench({ args: { ...bench().args, approval_id: id } }), async () => "ran"),
    );
    expect(stale.code).toBe("approval_required");
    expect(stale.details.stale_approval_id).toBe(id);
  });
});
