// The gate's admission steps one at a time, the single audited scope check, and the one timeout
// of an elicitation prompt.
import { afterAll, describe, expect, it } from "vitest";
import { SqliteApprovalQueue } from "../../server/stores/approvals/sqlite.js";
import { SqliteAuditTrail } from "../../server/stores/audit/sqlite.js";
import { parsePolicyConfig, type PolicyConfigInput } from "../../policies/config.js";
import { PolicyError } from "../../policies/errors.js";
import type { CostEstimate } from "../../policies/estimate.js";
import { Gate, type ElicitPrompt, type GateCall } from "../../policies/gate/gate.js";
import { ADMISSION_STEPS, checkFits, scopeRefusal } from "../../policies/gate/steps.js";
import { SqliteBudgetLedger } from "../../policies/limits/budget.js";
import { ConcurrencyLimiter } from "../../policies/limits/concurrency.js";
import { RateLimiter } from "../../policies/limits/rate.js";
import type { Principal } from "../../policies/scopes.js";
import { toolPolicyMap } from "../../policies/tool_policy.js";
import { TOOL_POLICIES } from "../../tools/registry.js";
import { captureLogger, flush, tempDir } from "./helpers.js";

const tmp = tempDir();
afterAll(() => tmp.cleanup());

const agent: Principal = { id: "agent", scopes: ["models:read", "models:load"], via: "token" };
const reader: Principal = { id: "reader", scopes: ["models:read"], via: "token" };
const admin: Principal = { id: "root", scopes: ["admin"], via: "token" };

const est = (over: Partial<CostEstimate> = {}): CostEstimate => ({
  device_seconds: 1,
  memory_bytes: 1e6,
  compile_s: 0,
  weight_bytes: 0,
  fits: true,
  ...over,
});

function makeGate(policy: PolicyConfigInput = {}) {
  // The default rules off, unless a test names its own.
  const config = parsePolicyConfig({ approvals: { rules: [] }, ...policy }, TOOL_POLICIES);
  const file = tmp.file(`steps-${Math.random().toString(36).slice(2)}.db`);
  const logger = captureLogger();
  const approvals = new SqliteApprovalQueue(file);
  const audit = new SqliteAuditTrail(file, { logger });
  const gate = new Gate({
    config,
    tools: TOOL_POLICIES,
    approvals,
    audit,
    limiter: new ConcurrencyLimiter(config.limits),
    rateLimiter: new RateLimiter(config.limits.rate_limit.per_principal_per_minute),
    budget: new SqliteBudgetLedger(file, config.limits.budget),
    logger,
  });
  return { gate, audit, approvals };
}

async function refusal(p: Promise<unknown>): Promise<PolicyError> {
  try {
    await p;
  } catch (e) {
    if (e instanceof PolicyError) return e;
    throw e;
  }
  throw new Error("expected a refusal");
}

const known = { tools: toolPolicyMap(TOOL_POLICIES) };

describe("admission steps", () => {
  it("run in the documented order", () => {
    expect(ADMISSION_STEPS.map((s) => s.name)).toEqual([
      "suspended",
      "scope",
      "rate",
      "estimate",
      "fit",
      "budget",
      "approval",
      "reserve",
      "slot",
      "consume",
    ]);
  });

  it("scope: the one rule, which admin passes", () => {
    expect(scopeRefusal(known, agent, "load_model")).toBeUndefined();
    expect(scopeRefusal(known, admin, "run_benchmark")).toBeUndefined();
    const e = scopeRefusal(known, reader, "load_model")!;
    expect(e.code).toBe("insufficient_scope");
    expect(e.details).toEqual({ required_scope: "models:load", tool: "load_model" });
    // A tool nobody declared needs admin: closed by default.
    expect(scopeRefusal(known, agent, "new_tool")?.details.required_scope).toBe("admin");
  });

  it("fit: refuses an estimate that does not fit, passing the suggestion on", () => {
    expect(() => checkFits(undefined)).not.toThrow();
    expect(() => checkFits(est())).not.toThrow();
    expect(() =>
      checkFits(est({ fits: false, reason: "9 GB > 8 GB", suggestion: "bf16" })),
    ).toThrow(/Not enough device memory: 9 GB > 8 GB\. Try: bf16\./);
  });
});

describe("one audited scope check per call", () => {
  it("enforceScope records a refusal once and a permitted call not at all", async () => {
    const { gate, audit } = makeGate();
    await gate.enforceScope(agent, "load_model", "HTTP 403");
    expect(await audit.tail(10)).toHaveLength(0);
    await expect(gate.enforceScope(reader, "load_model", "HTTP 403")).rejects.toThrow(
      /models:load/,
    );
    const rows = await audit.tail(10);
    expect(rows).toHaveLength(1);
    expect(rows[0]).toMatchObject({ principal: "reader", code: "insufficient_scope" });
    expect(rows[0]!.reason).toMatch(/\(HTTP 403\)$/);
  });

  it("refuse reports a missing scope before bad arguments, without taking from the rate", async () => {
    const { gate, audit } = makeGate({ limits: { rate_limit: { per_principal_per_minute: 1 } } });
    const e = await (async () => {
      try {
        await gate.refuse(reader, "load_model", { model: 42 }, "invalid_argument", "model: bad");
      } catch (err) {
        return err as PolicyError;
      }
    })();
    expect(e?.code).toBe("insufficient_scope");
    expect((await audit.tail(10)).map((r) => r.code)).toEqual(["insufficient_scope"]);
    // The reader's one call a minute is still there: its bad arguments are recorded as such.
    await gate.refuse(reader, "list_models", { x: 1 }, "invalid_argument", "x: unknown");
    expect((await audit.tail(1))[0]).toMatchObject({ code: "invalid_argument" });
  });

  it("run refuses out of scope with one record and no estimate made", async () => {
    const { gate, audit } = makeGate();
    let estimated = false;
    const call: GateCall = {
      principal: reader,
      tool: "load_model",
      args: { model: "tiny-gpt2" },
      estimator: async () => ((estimated = true), est()),
    };
    expect((await refusal(gate.run(call, async () => "ran"))).code).toBe("insufficient_scope");
    expect(estimated).toBe(false);
    expect((await audit.tail(10)).map((r) => [r.outcome, r.code])).toEqual([
      ["denied", "insufficient_scope"],
    ]);
  });
});

describe("elicitation: decided and timed by the gate", () => {
  const policy = (elicitation: boolean): PolicyConfigInput => ({
    approvals: {
      rules: [{ tool: "load_model", assurance: "client_form" }],
      elicitation,
      elicitation_timeout_s: 0.05,
    },
  });
  const load = (over: Partial<GateCall> = {}): GateCall => ({
    principal: agent,
    tool: "load_model",
    args: { model: "tiny-gpt2" },
    estimate: est(),
    ...over,
  });

  it("stops waiting after elicitation_timeout_s, withdraws the prompt and leaves the request to an operator", async () => {
    const { gate, audit, approvals } = makeGate(policy(true));
    let withdrawn: AbortSignal | undefined;
    const elicit = (_p: ElicitPrompt, signal: AbortSignal) => {
      withdrawn = signal;
      return new Promise<never>(() => {}); // the user never answers
    };
    const t0 = Date.now();
    const e = await refusal(gate.run(load({ elicit }), async () => "ran"));
    // Nobody declined: the code is the out-of-band one, naming the still open request.
    expect(e.code).toBe("approval_required");
    expect(e.details.prompt).toBe("unanswered");
    expect(e.message).toMatch(/within 0\.05 s/);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(40);
    expect(withdrawn?.aborted).toBe(true);
    expect((await approvals.get(e.details.approval_id as string))?.status).toBe("pending");
    expect((await audit.tail(1))[0]).toMatchObject({ outcome: "approval_requested" });
  });

  it("an operator's decision while the prompt is up withdraws it: approved, the call runs once; denied, it is refused", async () => {
    const { gate, approvals } = makeGate({
      approvals: {
        rules: [{ tool: "load_model", assurance: "client_form" }],
        elicitation_timeout_s: 60,
      },
    });
    const operator: Principal = { id: "ops", scopes: ["approvals:grant"], via: "token" };
    const shown: AbortSignal[] = [];
    const elicit = (_p: ElicitPrompt, signal: AbortSignal) => {
      shown.push(signal);
      return new Promise<never>(() => {}); // the user never answers
    };
    const decideWhenAsked = async (decision: "approve" | "deny") => {
      while (shown.length === 0) await flush();
      const id = (await approvals.list({ status: "pending" }))[0]!.id;
      await gate.decideApproval(
        id,
        operator,
        decision,
        decision === "deny" ? "not now" : undefined,
      );
      return id;
    };
    const [ran, id] = await Promise.all([
      gate.run(load({ elicit }), async () => "ran"),
      decideWhenAsked("approve"),
    ]);
    expect(ran).toBe("ran");
    expect(shown[0]!.aborted).toBe(true);
    expect(await approvals.get(id)).toMatchObject({ status: "used", decided_by: "ops" });

    shown.length = 0;
    const [refused] = await Promise.all([
      refusal(gate.run(load({ elicit, args: { model: "tiny-chat" } }), async () => "ran")),
      decideWhenAsked("deny"),
    ]);
    expect(refused.code).toBe("approval_denied");
    expect(refused.message).toMatch(/denied by ops: not now/);
    expect(shown[0]!.aborted).toBe(true);
  });

  it("ends a cancelled call but keeps its prompt up: a late answer is recorded, and the retry with its id runs", async () => {
    const { gate, approvals } = makeGate({
      approvals: {
        rules: [{ tool: "load_model", assurance: "client_form" }],
        elicitation_timeout_s: 60,
      },
    });
    const caller = new AbortController();
    let withdrawn: AbortSignal | undefined;
    let answer!: (a: "accept") => void;
    const elicit = (_p: ElicitPrompt, signal: AbortSignal) => {
      withdrawn = signal;
      setTimeout(() => caller.abort(), 5); // the client gives up on its request
      return new Promise<"accept">((r) => (answer = r));
    };
    const e = await refusal(gate.run(load({ elicit, signal: caller.signal }), async () => "ran"));
    expect(e.code).toBe("cancelled");
    const id = e.details.approval_id as string;
    expect(withdrawn?.aborted).toBe(false);
    expect((await approvals.get(id))?.status).toBe("pending");

    answer("accept"); // the person answers after the client stopped waiting
    await flush();
    expect(await approvals.get(id)).toMatchObject({
      status: "approved",
      decided_by: "client-form:agent",
    });
    const retry = load({ args: { model: "tiny-gpt2", approval_id: id } });
    await expect(gate.run(retry, async () => "ran")).resolves.toBe("ran");
    expect((await approvals.get(id))?.status).toBe("used");
  });

  it("lets a retry join the prompt still up instead of asking twice; a decline is recorded", async () => {
    const { gate, approvals } = makeGate({
      approvals: {
        rules: [{ tool: "load_model", assurance: "client_form" }],
        elicitation_timeout_s: 60,
      },
    });
    const caller = new AbortController();
    let asked = 0;
    let answer!: (a: "accept" | "decline") => void;
    const elicit = () => {
      asked++;
      return new Promise<"accept" | "decline">((r) => (answer = r));
    };
    const first = gate.run(load({ elicit, signal: caller.signal }), async () => "ran");
    await flush();
    caller.abort();
    expect((await refusal(first)).code).toBe("cancelled");
    const retry = gate.run(load({ elicit }), async () => "ran");
    await flush();
    expect(asked).toBe(1);
    answer("decline");
    const e = await refusal(retry);
    expect(e.code).toBe("approval_declined");
    expect(await approvals.get(e.details.approval_id as string)).toMatchObject({
      status: "denied",
      decided_by: "client-form:agent",
    });
  });

  it("leaves an answered prompt alone (no withdrawal after the answer)", async () => {
    const { gate } = makeGate(policy(true));
    let signal: AbortSignal | undefined;
    const elicit = async (_p: ElicitPrompt, s: AbortSignal) => ((signal = s), "accept" as const);
    await expect(gate.run(load({ elicit }), async () => "ran")).resolves.toBe("ran");
    expect(signal?.aborted).toBe(false);
  });

  it("asks nobody when the policy decides approvals out of band", async () => {
    const { gate, approvals } = makeGate(policy(false));
    let asked = false;
    const elicit = async () => ((asked = true), "accept" as const);
    expect((await refusal(gate.run(load({ elicit }), async () => "ran"))).code).toBe(
      "approval_required",
    );
    expect(asked).toBe(false);
    expect(await approvals.list({ status: "pending" })).toHaveLength(1);
  });
});
