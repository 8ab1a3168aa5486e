// A real `tpu-mcp http` child process and the SDK's real Streamable HTTP client.
import { request } from "node:http";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  INITIALIZE,
  connectHttp,
  startHttpServer,
  writeConfig,
  type HttpServerProc,
} from "../helpers/server.js";
import { badInputs, coreJourney } from "./scenario.js";

describe("tpu-mcp http", () => {
  let server: HttpServerProc;
  let conn: Awaited<ReturnType<typeof connectHttp>>;
  beforeAll(async () => {
    server = await startHttpServer(writeConfig());
    conn = await connectHttp(server.url, server.token);
  });
  afterAll(async () => {
    await conn?.close();
    await server?.stop();
  });

  it("generates a token and prints how to connect", () => {
    expect(server.token).toMatch(/^tpu_/);
    expect(server.stderr()).toContain("Authorization: Bearer");
  });

  it("serves list → load → infer → benchmark → unload with the real MiniLM", async () => {
    await coreJourney(conn.client);
  });

  it("refuses every bad input with its error code and keeps serving", async () => {
    await badInputs(conn.client);
  });

  it("answers /healthz, /readyz and /metrics", async () => {
    const base = server.url.replace(/\/mcp$/, "");
    expect((await fetch(`${base}/healthz`)).status).toBe(200);
    expect((await fetch(`${base}/readyz`)).status).toBe(200);
    const metrics = await (await fetch(`${base}/metrics`)).text();
    expect(metrics).toContain("tpu_mcp_tool_calls_total");
    expect(metrics).toContain("tpu_mcp_worker_restarts_total");
  });

  it("rejects a missing token, a wrong token, a foreign Origin and a foreign Host", async () => {
    const init = INITIALIZE;
    const post = (headers: Record<string, string>) =>
      fetch(server.url, {
        method: "POST",
        headers: {
          "content-type": "application/json",
          accept: "application/json, text/event-stream",
          ...headers,
        },
        body: JSON.stringify(init),
      });
    const none = await post({});
    expect(none.status).toBe(401);
    expect(none.headers.get("www-authenticate")).toMatch(/resource_metadata=/);
    expect((await post({ authorization: "Bearer nope" })).status).toBe(401);
    expect(
      (await post({ authorization: `Bearer ${server.token}`, origin: "https://evil.example" }))
        .status,
    ).toBe(403);
    // fetch cannot forge Host; a raw request can (as a DNS-rebinding page effectively does).
    const u = new URL(server.url);
    const hostStatus = await new Promise<number>((resolve, reject) => {
      const req = request(
        {
          host: u.hostname,
          port: u.port,
          path: u.pathname,
          method: "POST",
          headers: {
            host: "evil.example",
            authorization: `Bearer ${server.token}`,
            "content-type": "application/json",
            accept: "application/json, text/event-stream",
          },
        },
        (res) => {
          res.resume();
          resolve(res.statusCode ?? 0);
        },
      );
      req.on("error", reject);
      req.end(JSON.stringify(init));
    });
    expect(hostStatus).toBe(403);
    const meta = await fetch(server.url.replace(/\/mcp$/, "/.well-known/oauth-protected-resource"));
    expect((await meta.json()).scopes_supported).toContain("models:read");
  });

  it("refuses a body over the limit", async () => {
    const big = "x".repeat(33 * 1024 * 1024);
    const r = await fetch(server.url, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${server.token}` },
      body: big,
    });
    expect(r.status).toBe(413);
  });
});
