// Access: foreign Origins, missing/expired/foreign tokens, scope escalation (single calls and
// batches), one principal reaching for another's jobs, approvals and outputs, and a session id
// replayed with another token. Every attempt must be refused; those with a known principal must
// be in the audit trail, the others in the server log.
import { join } from "node:path";
import { writeFileSync } from "node:fs";
import { SignJWT, exportJWK, generateKeyPair } from "jose";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  INITIALIZE,
  connectHttp,
  startHttpServer,
  type HttpServerProc,
} from "../helpers/server.js";
import {
  auditRows,
  baseConfig,
  cleanupTemp,
  cli,
  DEMO_POLICY,
  errorOf,
  sha256,
  sleep,
  tempDir,
  TOKENS,
  until,
} from "./helpers.js";
import { scaled } from "../helpers/calibrate.js";

const T = { timeout: scaled(300_000) };
const AGENT2 = "hardening-agent2-token";
const EXPIRED = "hardening-expired-token";
const AUD = "https://tpu-mcp.hardening.test/mcp";
const ISS = "https://issuer.hardening.test";
const INIT = INITIALIZE;
const call = (client: any, name: string, args: Record<string, unknown> = {}) =>
  client.callTool({ name, arguments: args }, undefined, {
    timeout: scaled(120_000),
  }) as Promise<any>;

describe("access control over HTTP", () => {
  let server: HttpServerProc;
  let dir: string;
  let cfg: string;
  let keys: Awaited<ReturnType<typeof generateKeyPair>>;
  let otherKeys: Awaited<ReturnType<typeof generateKeyPair>>;
  const refusals: string[] = [];

  beforeAll(async () => {
    dir = tempDir();
    keys = await generateKeyPair("ES256");
    otherKeys = await generateKeyPair("ES256");
    const jwk = { ...(await exportJWK(keys.publicKey)), kid: "k1", alg: "ES256" };
    const agentScopes = DEMO_POLICY.tokens.find((t: any) => t.id === "agent").scopes;
    const policy = {
      ...DEMO_POLICY,
      tokens: [
        ...DEMO_POLICY.tokens,
        { id: "agent2", token_sha256: sha256(AGENT2), scopes: agentScopes },
        {
          id: "expired",
          token_sha256: sha256(EXPIRED),
          scopes: ["admin"],
          expires_at: "2020-01-01T00:00:00Z",
        },
      ],
      jwt: { issuer: ISS, audience: AUD, jwks: { keys: [jwk] } },
      limits: { ...DEMO_POLICY.limits, rate_limit: { per_principal_per_minute: 10_000 } },
    };
    cfg = join(dir, "config.json");
    writeFileSync(
      cfg,
      JSON.stringify(
        baseConfig(dir, {
          policy,
          inference: { inline_max_elements: 4 },
          http: { resource_url: AUD },
        }),
      ),
    );
    server = await startHttpServer(cfg);
  });
  afterAll(async () => {
    await server?.stop();
    cleanupTemp();
  });

  const post = (headers: Record<string, string>, body: unknown = INIT) =>
    fetch(server.url, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        accept: "application/json, text/event-stream",
        ...headers,
      },
      body: typeof body === "string" ? body : JSON.stringify(body),
    });
  const bearer = (t: string) => ({ authorization: `Bearer ${t}` });
  const jwt = (
    opts: {
      aud?: string;
      iss?: string;
      exp?: string | number;
      key?: any;
      scope?: string;
      alg?: string;
    } = {},
  ) =>
    new SignJWT({ scope: opts.scope ?? "models:read" })
      .setProtectedHeader({ alg: opts.alg ?? "ES256", kid: "k1" })
      .setIssuer(opts.iss ?? ISS)
      .setAudience(opts.aud ?? AUD)
      .setSubject("alice")
      .setIssuedAt()
      .setExpirationTime(opts.exp ?? "5m")
      .sign(opts.key ?? keys.privateKey);

  it(
    "refuses foreign Origins, missing, unknown, expired and foreign tokens before anything runs",
    T,
    async () => {
      const cases: [string, Record<string, string>, number][] = [
        [
          "foreign Origin with a valid token",
          { ...bearer(TOKENS.agent), origin: "https://evil.example" },
          403,
        ],
        ["null Origin", { ...bearer(TOKENS.agent), origin: "null" }, 403],
        ["foreign Origin, no token", { origin: "https://evil.example" }, 403],
        ["no Origin, no token", {}, 401],
        ["empty bearer", { authorization: "Bearer " }, 401],
        ["basic auth", { authorization: "Basic YWdlbnQ6cHc=" }, 401],
        ["unknown static token", bearer("tpu_not_a_token"), 401],
        ["expired static token", bearer(EXPIRED), 401],
        ["token hash instead of token", bearer(sha256(TOKENS.agent)), 401],
        [
          "JWT for another audience",
          bearer(await jwt({ aud: "https://someone-else.test/mcp" })),
          401,
        ],
        ["JWT from another issuer", bearer(await jwt({ iss: "https://evil-issuer.test" })), 401],
        ["JWT signed with another key", bearer(await jwt({ key: otherKeys.privateKey })), 401],
        ["expired JWT", bearer(await jwt({ exp: Math.floor(Date.now() / 1000) - 3600 })), 401],
        ["unsigned JWT (alg none)", bearer(unsignedJwt()), 401],
      ];
      for (const [what, headers, status] of cases) {
        const r = await post(headers);
        expect(r.status, what).toBe(status);
        if (status === 401)
          expect(r.headers.get("www-authenticate"), what).toMatch(/^Bearer resource_metadata=/);
        const text = await r.text();
        expect(text, what).not.toMatch(/demo-agent-token|stack|\/work\//);
        refusals.push(what);
      }
      // A token in the query string is not a bearer token.
      const q = await fetch(`${server.url}?access_token=${TOKENS.agent}`, {
        method: "POST",
        headers: {
          "content-type": "application/json",
          accept: "application/json, text/event-stream",
        },
        body: JSON.stringify(INIT),
      });
      expect(q.status).toBe(401);
      // A good JWT works, so the refusals above were about the tokens.
      const ok = await connectHttp(server.url, await jwt());
      expect((await ok.client.listTools()).tools.map((t) => t.name).sort()).toEqual([
        "check_model",
        "get_runtime_status",
        "list_models",
      ]);
      await ok.close();
    },
  );

  it(
    "refuses scope escalation: reader calling costly tools, alone or inside a batch, and audits it",
    T,
    async () => {
      const reader = await connectHttp(server.url, TOKENS.reader);
      try {
        for (const [name, args] of [
          ["load_model", { model: "tiny-gpt2" }],
          ["unload_model", { model: "tiny-gpt2" }],
          ["run_inference", { model: "tiny-gpt2", texts: ["x"] }],
          ["run_benchmark", { model: "mnist-cnn" }],
          ["get_job", { job_id: "job_000000000000000000000000" }],
        ] as const) {
          await expect(call(reader.client, name, args), name).rejects.toThrow(/insufficient_scope/);
        }
        // The same with the reader's own session id, as a raw batch mixing allowed and forbidden calls.
        const sid = reader.transport.sessionId!;
        const batch = [
          {
            jsonrpc: "2.0",
            id: 101,
            method: "tools/call",
            params: { name: "list_models", arguments: {} },
          },
          {
            jsonrpc: "2.0",
            id: 102,
            method: "tools/call",
            params: { name: "load_model", arguments: { model: "tiny-gpt2" } },
          },
        ];
        const r = await post(
          { ...bearer(TOKENS.reader), "mcp-session-id": sid, "mcp-protocol-version": "2025-11-25" },
          batch,
        );
        expect(r.status).toBe(403);
        expect(r.headers.get("www-authenticate")).toMatch(/insufficient_scope/);
        // The operator's approvals:grant opens no tool at all.
        const op = await connectHttp(server.url, TOKENS.operator);
        expect((await op.client.listTools()).tools).toEqual([]);
        await expect(call(op.client, "get_runtime_status")).rejects.toThrow(/insufficient_scope/);
        await op.close();
      } finally {
        await reader.close();
      }
      const rows = auditRows(join(dir, "data"));
      const denied = rows.filter(
        (a) =>
          a.principal === "reader" && a.outcome === "denied" && a.code === "insufficient_scope",
      );
      expect(denied.map((a) => a.tool)).toEqual(
        expect.arrayContaining([
          "load_model",
          "unload_model",
          "run_inference",
          "run_benchmark",
          "get_job",
        ]),
      );
      expect(
        rows.filter((a) => a.principal === "operator" && a.code === "insufficient_scope").length,
      ).toBeGreaterThanOrEqual(1);
      // Nothing from the forbidden batch ran: tiny-gpt2 was never loaded by anyone.
      expect(rows.some((a) => a.tool === "load_model" && a.outcome === "executed")).toBe(false);
    },
  );

  it("keeps jobs, approvals and outputs to their principal", T, async () => {
    const agent = await connectHttp(server.url, TOKENS.agent);
    const agent2 = await connectHttp(server.url, AGENT2);
    try {
      // A job of agent's.
      const job = await call(agent.client, "load_model", { model: "mnist-cnn", wait: false });
      expect(job.isError, JSON.stringify(job)).toBeFalsy();
      const jobId = job.structuredContent.job_id;
      for (const tool of ["get_job", "cancel_job"]) {
        const r = await call(agent2.client, tool, { job_id: jobId });
        expect(errorOf(r)?.code, tool).toBe("job_not_found");
        expect(JSON.stringify(r)).not.toContain("mnist-cnn");
      }
      const done = await until(
        async () => {
          const j = await call(agent.client, "get_job", { job_id: jobId });
          return j.structuredContent.status !== "running" ? j.structuredContent : undefined;
        },
        120_000,
        250,
      );
      expect(done.status).toBe("succeeded"); // agent2's cancel_job did not reach it

      // An output resource of agent's (inline_max_elements is 4, so 10 logits are stored).
      const x = { dtype: "float32", shape: [1, 1, 28, 28], data: Array(784).fill(0.3) };
      const inf = await call(agent.client, "run_inference", { model: "mnist-cnn", tensors: [x] });
      expect(inf.isError, JSON.stringify(inf).slice(0, 300)).toBeFalsy();
      const uri = inf.structuredContent.outputs[0].resource_uri as string;
      expect(uri).toMatch(/^tpu:\/\/outputs\/out_/);
      expect((await agent.client.readResource({ uri })).contents.length).toBe(1);
      await expect(agent2.client.readResource({ uri })).rejects.toThrow(/not found/i);
      const reader = await connectHttp(server.url, TOKENS.reader);
      await expect(reader.client.readResource({ uri })).rejects.toThrow(/not found/i);
      expect(JSON.stringify(await agent2.client.listResources())).not.toContain(uri);
      await reader.close();

      // An approval of agent's, used by agent2 with the very same arguments.
      const args = { model: "all-minilm-l6-v2" };
      const asked = await call(agent.client, "load_model", args);
      const apr = errorOf(asked)!.details.approval_id;
      expect((await cli(cfg, "approvals", "approve", apr, "--token", TOKENS.operator)).code).toBe(
        0,
      );
      const stolen = await call(agent2.client, "load_model", { ...args, approval_id: apr });
      expect(errorOf(stolen)?.code).toBe("approval_not_found");
      // ... and it is still there for agent, once.
      const own = await call(agent.client, "load_model", { ...args, approval_id: apr });
      expect(own.isError, JSON.stringify(own).slice(0, 300)).toBeFalsy();
      await call(agent.client, "unload_model", args);
      expect(
        errorOf(await call(agent.client, "load_model", { ...args, approval_id: apr }))?.code,
      ).toBe("approval_used");
      // Deciding needs a token with approvals:grant: agent2, the reader and an unknown token cannot.
      const asked2 = await call(agent.client, "load_model", {
        model: "all-minilm-l6-v2",
        dtype: "bfloat16",
      });
      const apr2 = errorOf(asked2)!.details.approval_id;
      for (const t of [AGENT2, TOKENS.reader, "nope", EXPIRED]) {
        expect((await cli(cfg, "approvals", "approve", apr2, "--token", t)).code, t).not.toBe(0);
      }
      expect(
        errorOf(
          await call(agent.client, "load_model", {
            model: "all-minilm-l6-v2",
            dtype: "bfloat16",
            approval_id: apr2,
          }),
        )?.code,
      ).toBe("approval_pending");
    } finally {
      await agent.close();
      await agent2.close();
    }
    const rows = auditRows(join(dir, "data"));
    expect(
      rows.some(
        (a) =>
          a.principal === "agent2" &&
          a.tool === "load_model" &&
          a.outcome === "denied" &&
          /approval_(mismatch|not_found)/.test(a.code),
      ),
    ).toBe(true);
    expect(
      rows.some(
        (a) => a.principal === "agent2" && (a.tool === "get_job" || a.tool === "cancel_job"),
      ),
    ).toBe(true);
  });

  it("refuses a session id replayed with another principal's token", T, async () => {
    const agent = await connectHttp(server.url, TOKENS.agent);
    try {
      const sid = agent.transport.sessionId!;
      expect(sid).toBeTruthy();
      const h = { "mcp-session-id": sid, "mcp-protocol-version": "2025-11-25" };
      const list = { jsonrpc: "2.0", id: 5, method: "tools/list" };
      const load = {
        jsonrpc: "2.0",
        id: 6,
        method: "tools/call",
        params: { name: "load_model", arguments: { model: "tiny-gpt2" } },
      };
      const status = {
        jsonrpc: "2.0",
        id: 7,
        method: "tools/call",
        params: { name: "get_runtime_status", arguments: {} },
      };
      const r1 = await post({ ...bearer(TOKENS.reader), ...h }, list);
      expect(r1.status).toBe(404);
      const r2 = await post({ ...bearer(TOKENS.reader), ...h }, load);
      expect([403, 404]).toContain(r2.status);
      const r3 = await post({ ...bearer(AGENT2), ...h }, status);
      expect(r3.status).toBe(404);
      const r4 = await post({ ...h }, status);
      expect(r4.status).toBe(401);
      const r5 = await post({ ...bearer(await jwt({ scope: "admin" })), ...h }, status);
      expect(r5.status).toBe(404);
      // A GET (SSE stream) and a DELETE on the session with another token are refused too.
      const g = await fetch(server.url, {
        method: "GET",
        headers: { ...bearer(TOKENS.reader), ...h, accept: "text/event-stream" },
      });
      expect(g.status).toBe(404);
      const d = await fetch(server.url, {
        method: "DELETE",
        headers: { ...bearer(TOKENS.reader), ...h },
      });
      expect(d.status).toBe(404);
      // The session still works for its owner.
      expect((await agent.client.listTools()).tools.length).toBe(9);
    } finally {
      await agent.close();
    }
  });

  it("leaves an audit chain that verifies and logs refused authentications", T, async () => {
    await sleep(200);
    const v = await cli(cfg, "audit", "verify");
    expect(v.code, v.stdout).toBe(0);
    const tail = await cli(cfg, "audit", "tail", "-n", "500");
    expect(tail.stdout).toMatch(/reader load_model denied \(insufficient_scope\)/);
    // Refusals without a principal (401/403 before authentication) are logged, not audited.
    expect(server.stderr()).toMatch(/"status":401/);
    expect(server.stderr()).toMatch(/"status":403/);
    expect(refusals.length).toBe(14);
  });
});

function unsignedJwt(): string {
  const b64 = (o: unknown) => Buffer.from(JSON.stringify(o)).toString("base64url");
  const now = Math.floor(Date.now() / 1000);
  return `${b64({ alg: "none", typ: "JWT" })}.${b64({ iss: ISS, aud: AUD, sub: "mallory", scope: "admin", iat: now, exp: now + 300 })}.`;
}
