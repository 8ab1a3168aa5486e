// The console runs tools through the same door as an MCP call (dispatch and the gate): scope,
// rate and audit. Its runtime page runs get_runtime_status, which needs models:read; a console
// operator holding only approvals:grant is refused there, and both answers leave audit records.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { hashToken } from "../../policies/config.js";
import {
  DEMO_POLICY,
  DEMO_TOKENS,
  startHttpServer,
  writeConfig,
  type HttpServerProc,
} from "../helpers/server.js";

const WATCHER = "console-door-watcher-token";

describe("console through the one door", () => {
  let server: HttpServerProc;
  let base: string;

  beforeAll(async () => {
    const policy = {
      ...DEMO_POLICY,
      tokens: [
        ...DEMO_POLICY.tokens,
        {
          id: "watcher",
          token_sha256: hashToken(WATCHER),
          scopes: ["approvals:grant", "models:read"],
        },
      ],
    };
    server = await startHttpServer(
      writeConfig({ policy, runtime: { device: "cpu", start: "lazy" } }),
    );
    base = server.url.replace(/\/mcp$/, "");
  });
  afterAll(async () => {
    await server?.stop();
  });

  async function session(token: string): Promise<string> {
    const r = await fetch(`${base}/console/api/session`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ token }),
    });
    expect(r.status).toBe(200);
    return (r.headers.get("set-cookie") ?? "").split(";")[0];
  }

  async function auditOf(cookie: string, principal: string) {
    const q = new URLSearchParams({ principal, tool: "get_runtime_status" });
    const r = await fetch(`${base}/console/api/audit?${q}`, { headers: { cookie } });
    expect(r.status).toBe(200);
    return (await r.json()).records as { outcome: string; code?: string }[];
  }

  it("refuses the runtime page to an operator without models:read, and audits the refusal", async () => {
    const cookie = await session(DEMO_TOKENS.operator);
    const r = await fetch(`${base}/console/api/runtime`, { headers: { cookie } });
    expect(r.status).toBe(403);
    const body = await r.json();
    expect(body.error.code).toBe("insufficient_scope");
    expect(body.error.message).toContain("models:read");
    const recs = await auditOf(cookie, "operator");
    expect(recs.map((x) => x.outcome)).toEqual(["denied"]);
    expect(recs[0].code).toBe("insufficient_scope");
  });

  it("answers the runtime page for an operator with models:read, and audits the call", async () => {
    const cookie = await session(WATCHER);
    const r = await fetch(`${base}/console/api/runtime`, { headers: { cookie } });
    expect(r.status).toBe(200);
    const body = await r.json();
    expect(body.error).toBeNull();
    expect(body.status.worker.state).toBeTypeOf("string");
    const outcomes = (await auditOf(cookie, "watcher")).map((x) => x.outcome);
    expect(outcomes).toContain("executed");
    expect(outcomes).not.toContain("denied");
  });
});
