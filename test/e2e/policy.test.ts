// The "boxed in" half end to end: the demo policy over HTTP with the SDK's real Client, the
// operator CLI on the same store, restarts, JWTs, concurrency bounds and the audit chain.
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import Database from "better-sqlite3";
import { SignJWT, exportJWK, generateKeyPair } from "jose";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  INITIALIZE,
  cli,
  connectHttp,
  errorOf,
  startHttpServer,
  writeConfig,
  type HttpServerProc,
  DEMO_POLICY,
  DEMO_TOKENS,
} from "../helpers/server.js";
import { call } from "./scenario.js";

const { agent: AGENT, reader: READER, operator: OPERATOR } = DEMO_TOKENS;

describe("demo policy over HTTP", () => {
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-policy-"));
  const config = writeConfig({ policy: DEMO_POLICY }, dir);
  let server: HttpServerProc;
  beforeAll(async () => {
    server = await startHttpServer(config);
  });
  afterAll(async () => {
    await server?.stop();
  });

  it("shows reader only read tools and answers load_model with a 403 insufficient_scope challenge", async () => {
    const reader = await connectHttp(server.url, READER);
    try {
      const names = (await reader.client.listTools()).tools.map((t) => t.name).sort();
      expect(names).toEqual(["check_model", "get_runtime_status", "list_models"]);
      await expect(
        reader.client.callTool({ name: "load_model", arguments: { model: "tiny-gpt2" } }),
      ).rejects.toThrow(/insufficient_scope/);
    } finally {
      await reader.close();
    }
    // The challenge itself, as RFC 6750 describes it.
    const init = await fetch(server.url, {
      method: "POST",
      headers: {
        authorization: `Bearer ${READER}`,
        "content-type": "application/json",
        accept: "application/json, text/event-stream",
      },
      body: JSON.stringify({
        jsonrpc: "2.0",
        id: 7,
        method: "tools/call",
        params: { name: "load_model", arguments: { model: "tiny-gpt2" } },
      }),
    });
    expect(init.status).toBe(403);
    expect(init.headers.get("www-authenticate")).toMatch(
      /error="insufficient_scope", scope="models:load"/,
    );
  });

  it("lets agent load tiny-gpt2 at once but all-minilm-l6-v2 only after the operator approves", async () => {
    const agent = await connectHttp(server.url, AGENT);
    try {
      const small = await call(agent.client, "load_model", { model: "tiny-gpt2" });
      expect(small.isError, JSON.stringify(small)).toBeFalsy();

      const args = { model: "all-minilm-l6-v2", dtype: "float32" };
      const asked = await call(agent.client, "load_model", args);
      expect(errorOf(asked)?.code).toBe("approval_required");
      const id = errorOf(asked)!.details.approval_id;
      expect(id).toMatch(/^apr_/);
      expect(errorOf(asked)!.details.estimate.weight_bytes).toBeGreaterThan(50_000_000);

      // Calling again before a decision: still pending.
      const early = await call(agent.client, "load_model", { ...args, approval_id: id });
      expect(errorOf(early)?.code).toBe("approval_pending");

      // The operator sees it and approves it out of band; agent cannot approve it.
      const list = await cli(config, "approvals", "list");
      expect(list.stdout, list.stderr).toContain(id);
      const byAgent = await cli(config, "approvals", "approve", id, "--token", AGENT);
      expect(byAgent.code).not.toBe(0);
      const ok = await cli(config, "approvals", "approve", id, "--token", OPERATOR);
      expect(ok.code, ok.stderr).toBe(0);

      // Other arguments with that id: refused, and the approval is not spent by it.
      const other = await call(agent.client, "load_model", {
        model: "all-minilm-l6-v2",
        dtype: "bfloat16",
        approval_id: id,
      });
      expect(errorOf(other)?.code).toBe("approval_mismatch");
      // `confirm: true` is never an approval (and is not even an argument).
      const confirm = await call(agent.client, "load_model", { ...args, confirm: true });
      expect(errorOf(confirm)?.code).toBe("invalid_argument");

      const done = await call(agent.client, "load_model", { ...args, approval_id: id });
      expect(done.isError, JSON.stringify(done)).toBeFalsy();
      await call(agent.client, "unload_model", { model: "all-minilm-l6-v2" });

      const reused = await call(agent.client, "load_model", { ...args, approval_id: id });
      expect(errorOf(reused)?.code).toBe("approval_used");

      // A denied approval.
      const again = await call(agent.client, "run_benchmark", {
        model: "tiny-gpt2",
        iterations: 2,
      });
      const id2 = errorOf(again)!.details.approval_id;
      expect(
        (await cli(config, "approvals", "deny", id2, "--token", OPERATOR, "--reason", "not now"))
          .code,
      ).toBe(0);
      const denied = await call(agent.client, "run_benchmark", {
        model: "tiny-gpt2",
        iterations: 2,
        approval_id: id2,
      });
      expect(errorOf(denied)?.code).toBe("approval_denied");
    } finally {
      await agent.close();
    }
  });

  it("audits every decision in a chain that `audit verify` checks and a tampered record fails", async () => {
    const tail = await cli(config, "audit", "tail", "-n", "50");
    expect(tail.stdout).toMatch(/approval_requested/);
    expect(tail.stdout).toMatch(/approval_granted/);
    expect(tail.stdout).toMatch(/denied.*insufficient_scope/);
    expect(tail.stdout).toMatch(/executed/);
    expect((await cli(config, "audit", "verify")).code).toBe(0);

    const db = new Database(join(dir, "data", "policy.db"));
    const row = db
      .prepare("SELECT seq, record FROM audit_log ORDER BY seq LIMIT 1 OFFSET 2")
      .get() as any;
    db.prepare("UPDATE audit_log SET record = ? WHERE seq = ?").run(
      row.record.replace(/"agent"|"reader"/, '"mallory"'),
      row.seq,
    );
    db.close();
    const bad = await cli(config, "audit", "verify");
    expect(bad.code).toBe(1);
    expect(bad.stdout).toMatch(new RegExp(`TAMPERED at record #${row.seq}`));
  });
});

describe("approvals across restarts, expiry and self-grant", () => {
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-policy2-"));
  const selfToken = "test-self-approver-token";
  const policy = {
    ...DEMO_POLICY,
    tokens: [
      ...DEMO_POLICY.tokens,
      // Holds approvals:grant AND may call tools: it must still not approve its own request.
      {
        id: "lead",
        token_sha256: "4b1a4f7e0ad4a0d4e5bd03a5d7d4f1b1c6a1a9c95f5b8b3e4a7b0c7ad0a9f3b2",
        scopes: ["models:read", "benchmark:run", "approvals:grant"],
      },
    ],
    approvals: { ...DEMO_POLICY.approvals, ttl_s: 3 },
  };
  let config: string;
  let durable: string;
  beforeAll(async () => {
    const { createHash } = await import("node:crypto");
    policy.tokens[policy.tokens.length - 1].token_sha256 = createHash("sha256")
      .update(selfToken)
      .digest("hex");
    config = writeConfig({ policy }, dir);
    // The restart test needs an approval that outlives a slow restart on a busy machine.
    durable = writeConfig({
      policy: { ...policy, approvals: { ...policy.approvals, ttl_s: 900 } },
    });
  });

  it("keeps a pending approval across a server restart", async () => {
    const config = durable;
    let server = await startHttpServer(config);
    let agent = await connectHttp(server.url, AGENT);
    const r = await call(agent.client, "run_benchmark", {
      model: "mnist-cnn",
      iterations: 2,
      warmup: 0,
    });
    const id = errorOf(r)!.details.approval_id;
    await agent.close();
    await server.stop();

    server = await startHttpServer(config);
    try {
      expect((await cli(config, "approvals", "approve", id, "--token", OPERATOR)).code).toBe(0);
      agent = await connectHttp(server.url, AGENT);
      const ok = await call(agent.client, "run_benchmark", {
        model: "mnist-cnn",
        iterations: 2,
        warmup: 0,
        approval_id: id,
      });
      expect(ok.isError, JSON.stringify(ok)).toBeFalsy();
      await agent.close();
    } finally {
      await server.stop();
    }
  });

  it("refuses an expired approval and an approval granted by the requester itself", async () => {
    const server = await startHttpServer(config);
    try {
      const lead = await connectHttp(server.url, selfToken);
      const r = await call(lead.client, "run_benchmark", {
        model: "mnist-cnn",
        iterations: 2,
        warmup: 0,
      });
      const id = errorOf(r)!.details.approval_id;
      const self = await cli(config, "approvals", "approve", id, "--token", selfToken);
      expect(self.code).not.toBe(0);
      expect(self.stderr).toMatch(/approval_self_grant/);
      await lead.close();

      const agent = await connectHttp(server.url, AGENT);
      const r2 = await call(agent.client, "run_benchmark", {
        model: "mnist-cnn",
        iterations: 3,
        warmup: 0,
      });
      const id2 = errorOf(r2)!.details.approval_id;
      // ttl_s is 3 in this config; an approval granted and then left unused expires the same way
      // (covered with a fake clock in test/policies).
      await new Promise((res) => setTimeout(res, 3500));
      const late = await call(agent.client, "run_benchmark", {
        model: "mnist-cnn",
        iterations: 3,
        warmup: 0,
        approval_id: id2,
      });
      expect(errorOf(late)?.code).toBe("approval_expired");
      await agent.close();
    } finally {
      await server.stop();
    }
  });
});

describe("JWT bearer tokens", () => {
  it("accepts a token for this server's audience and refuses one for another audience with 401", async () => {
    const { publicKey, privateKey } = await generateKeyPair("ES256");
    const jwk = { ...(await exportJWK(publicKey)), kid: "k1", alg: "ES256" };
    const policy = {
      jwt: {
        issuer: "https://issuer.test",
        audience: "https://tpu-mcp.test/mcp",
        jwks: { keys: [jwk] },
      },
    };
    const server = await startHttpServer(writeConfig({ policy }));
    const sign = (aud: string) =>
      new SignJWT({ scope: "models:read" })
        .setProtectedHeader({ alg: "ES256", kid: "k1" })
        .setIssuer("https://issuer.test")
        .setAudience(aud)
        .setSubject("alice")
        .setIssuedAt()
        .setExpirationTime("5m")
        .sign(privateKey);
    try {
      const good = await connectHttp(server.url, await sign("https://tpu-mcp.test/mcp"));
      expect((await good.client.listTools()).tools.map((t) => t.name)).toContain("list_models");
      await good.close();
      const wrong = await fetch(server.url, {
        method: "POST",
        headers: {
          authorization: `Bearer ${await sign("https://someone-else.test")}`,
          "content-type": "application/json",
          accept: "application/json, text/event-stream",
        },
        body: JSON.stringify(INITIALIZE),
      });
      expect(wrong.status).toBe(401);
      expect(wrong.headers.get("www-authenticate")).toMatch(/invalid_token/);
    } finally {
      await server.stop();
    }
  });
});

describe("concurrency bound", () => {
  it("answers a 17th concurrent call over a bound of 16 with busy at once", async () => {
    const policy = {
      ...DEMO_POLICY,
      limits: {
        ...DEMO_POLICY.limits,
        per_tool_concurrency: { run_inference: 16 },
        queue_bound: { run_inference: 0 },
        rate_limit: { per_principal_per_minute: 1000 },
      },
    };
    const server = await startHttpServer(writeConfig({ policy }));
    try {
      const agent = await connectHttp(server.url, AGENT);
      expect((await call(agent.client, "load_model", { model: "tiny-gpt2" })).isError).toBeFalsy();
      const texts = Array.from({ length: 16 }, (_, i) => `prompt number ${i}`);
      const results = await Promise.all(
        Array.from({ length: 17 }, () =>
          call(agent.client, "run_inference", { model: "tiny-gpt2", texts, max_new_tokens: 32 }),
        ),
      );
      const busy = results.filter((r) => errorOf(r)?.code === "busy");
      const ok = results.filter((r) => !r.isError);
      expect(busy).toHaveLength(1);
      expect(ok).toHaveLength(16);
      expect(errorOf(busy[0])!.details.retry_after_ms).toBeGreaterThan(0);
      await agent.close();
    } finally {
      await server.stop();
    }
  }, 180_000); // 17 generations on two cores can be slow when the machine is busy
});
