// Issue 23, item 4: principals are namespaced by how they were authenticated. A JWT whose subject
// equals a static token's id (`agent`) used to be that principal: its jobs, approvals, sessions
// and budget. JWT principals are now `jwt:<sub>`; subjects with control characters or of an
// unreasonable length are refused; config rules name JWT principals as `jwt:<sub>`. A real JWKS,
// a real HTTP server, real MCP clients.
import { SignJWT, exportJWK, generateKeyPair } from "jose";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  connectHttp,
  DEMO_POLICY,
  DEMO_TOKENS,
  errorOf,
  INITIALIZE,
  startHttpServer,
  writeConfig,
  type HttpServerProc,
} from "../helpers/server.js";
import { scaled } from "../helpers/calibrate.js";

const ISS = "https://issuer.namespace.test";
const AUD = "https://tpu-mcp.namespace.test/mcp";
const call = (client: any, name: string, args: Record<string, unknown> = {}) =>
  client.callTool({ name, arguments: args }, undefined, {
    timeout: scaled(120_000),
  }) as Promise<any>;

describe("JWT principals live in their own namespace", () => {
  let server: HttpServerProc;
  let sign: (sub: string, scope?: string) => Promise<string>;

  beforeAll(async () => {
    const keys = await generateKeyPair("ES256");
    const jwk = { ...(await exportJWK(keys.publicKey)), kid: "k1", alg: "ES256" };
    sign = (sub, scope = "models:read models:load jobs:read") =>
      new SignJWT({ scope })
        .setProtectedHeader({ alg: "ES256", kid: "k1" })
        .setIssuer(ISS)
        .setAudience(AUD)
        .setSubject(sub)
        .setIssuedAt()
        .setExpirationTime("5m")
        .sign(keys.privateKey);
    const config = writeConfig({
      runtime: { device: "cpu", start: "lazy" },
      policy: {
        ...DEMO_POLICY,
        jwt: { issuer: ISS, audience: AUD, jwks: { keys: [jwk] } },
        limits: { ...DEMO_POLICY.limits, rate_limit: { per_principal_per_minute: 6000 } },
        approvals: {
          ...DEMO_POLICY.approvals,
          elicitation: false,
          // Rules name JWT principals by their namespaced id.
          rules: [
            ...DEMO_POLICY.approvals.rules,
            { tool: "list_models", principals: ["jwt:agent"] },
          ],
        },
      },
    });
    server = await startHttpServer(config);
  }, scaled(120_000));

  afterAll(async () => {
    await server?.stop();
  });

  it(
    "a JWT with sub `agent` cannot see the static principal agent's job or use its approval",
    async () => {
      const agent = await connectHttp(server.url, DEMO_TOKENS.agent);
      const started = await call(agent.client, "load_model", { model: "mnist-cnn", wait: false });
      expect(errorOf(started), JSON.stringify(started)).toBeUndefined();
      const jobId = started.structuredContent.job_id as string;
      expect(jobId).toMatch(/^job_/);
      const own = await call(agent.client, "get_job", { job_id: jobId });
      expect(errorOf(own)).toBeUndefined();
      // The static agent's approval request (the demo policy asks one for a 87 MiB model).
      const asked = await call(agent.client, "load_model", { model: "all-minilm-l6-v2" });
      expect(errorOf(asked)?.code).toBe("approval_required");
      const approvalId = errorOf(asked)!.details.approval_id;

      const impostor = await connectHttp(server.url, await sign("agent"));
      const seen = await call(impostor.client, "get_job", { job_id: jobId });
      expect(errorOf(seen)?.code).toBe("job_not_found");
      const cancel = await call(impostor.client, "cancel_job", { job_id: jobId });
      expect(errorOf(cancel)?.code).toBe("job_not_found");
      const reuse = await call(impostor.client, "load_model", {
        model: "all-minilm-l6-v2",
        approval_id: approvalId,
      });
      expect(errorOf(reuse)?.code).toBe("approval_not_found");

      // A config rule names the JWT principal: it applies to jwt:agent, not to the token agent.
      const jwtList = await call(impostor.client, "list_models");
      expect(errorOf(jwtList)?.code).toBe("approval_required");
      expect(errorOf(jwtList)!.message).toMatch(/list_models/);
      const tokenList = await call(agent.client, "list_models");
      expect(errorOf(tokenList)).toBeUndefined();
      await impostor.close();
      await agent.close();
    },
    scaled(180_000),
  );

  it(
    "refuses a subject holding a control character or of unreasonable length with 401",
    async () => {
      for (const sub of ["agent\u0000", "a\u001b[2Kb", "x\u202e", "s".repeat(257)]) {
        const r = await fetch(server.url, {
          method: "POST",
          headers: {
            authorization: `Bearer ${await sign(sub)}`,
            "content-type": "application/json",
            accept: "application/json, text/event-stream",
          },
          body: JSON.stringify(INITIALIZE),
        });
        expect(r.status, JSON.stringify(sub)).toBe(401);
        expect(r.headers.get("www-authenticate")).toMatch(/invalid_token/);
      }
      // A plain subject of the longest accepted length still connects.
      const ok = await connectHttp(server.url, await sign("s".repeat(256)));
      await ok.close();
    },
    scaled(60_000),
  );
});
