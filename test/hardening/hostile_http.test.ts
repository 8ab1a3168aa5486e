// Hostile HTTP clients: one token opening hundreds of sessions (raw and through the SDK, never
// sending DELETE), `initialize` floods from one principal and from one address, DNS rebinding on
// every endpoint (not only /mcp), /metrics behind a scope, CORS preflights from allowed and
// foreign origins, and concurrent requests reusing one JSON-RPC id in a session.
import { request } from "node:http";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  INITIALIZE,
  connectHttp,
  startHttpServer,
  type HttpServerProc,
} from "../helpers/server.js";
import { baseConfig, cleanupTemp, DEMO_POLICY, sha256, sleep, tempDir, TOKENS } from "./helpers.js";
import { scaled } from "../helpers/calibrate.js";

const T = { timeout: scaled(300_000) };
const AGENT2 = "hostile-agent2-token";
const SCRAPER = "hostile-scraper-token";
const ALLOWED_ORIGIN = "https://console.example";
const PER_PRINCIPAL = 6;
const MAX_SESSIONS = 12;

afterAll(() => cleanupTemp());

function writeCfg(
  dir: string,
  http: Record<string, unknown>,
  runtime: Record<string, unknown> = {},
) {
  const agentScopes = DEMO_POLICY.tokens.find((t: any) => t.id === "agent").scopes;
  const policy = {
    ...DEMO_POLICY,
    tokens: [
      ...DEMO_POLICY.tokens,
      { id: "agent2", token_sha256: sha256(AGENT2), scopes: agentScopes },
      { id: "scraper", token_sha256: sha256(SCRAPER), scopes: ["metrics:read"] },
    ],
    limits: { ...DEMO_POLICY.limits, rate_limit: { per_principal_per_minute: 100_000 } },
  };
  const cfg = join(dir, "config.json");
  // The worker starts on the first call that needs it: most of this suite never needs it.
  writeFileSync(
    cfg,
    JSON.stringify(baseConfig(dir, { policy, http, runtime: { start: "lazy", ...runtime } })),
  );
  return cfg;
}

const bearer = (t: string) => ({ authorization: `Bearer ${t}` });

function post(url: string, headers: Record<string, string>, body: unknown = INITIALIZE) {
  return fetch(url, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      accept: "application/json, text/event-stream",
      ...headers,
    },
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(120_000),
  });
}

/** A raw request (fetch cannot forge Host; a DNS-rebinding page effectively does). */
function raw(
  url: string,
  opts: { method?: string; headers?: Record<string, string>; body?: string },
): Promise<{
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}> {
  const u = new URL(url);
  return new Promise((resolve, reject) => {
    const req = request(
      {
        host: u.hostname,
        port: u.port,
        path: u.pathname,
        method: opts.method ?? "GET",
        headers: opts.headers ?? {},
      },
      (res) => {
        let body = "";
        res.on("data", (d) => (body += d));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
      },
    );
    req.on("error", reject);
    req.end(opts.body);
  });
}

async function openSessions(base: string): Promise<number> {
  const text = await (await fetch(`${base}/metrics`)).text();
  const m = /^tpu_mcp_http_sessions (\d+)/m.exec(text);
  return m ? Number(m[1]) : NaN;
}

describe("session caps and initialize limits", () => {
  let server: HttpServerProc;
  let base: string;
  beforeAll(async () => {
    const dir = tempDir();
    server = await startHttpServer(
      writeCfg(dir, {
        max_sessions: MAX_SESSIONS,
        max_sessions_per_principal: PER_PRINCIPAL,
        initialize_rate: { per_principal_per_minute: 40, per_address_per_minute: 10_000 },
      }),
    );
    base = server.url.replace(/\/mcp$/, "");
  });
  afterAll(async () => {
    await server?.stop();
  });

  it(
    "a reader opening hundreds of sessions without DELETE evicts only its own and never locks the agent out",
    T,
    async () => {
      // An SDK client of the reader's, opened first: it becomes the oldest idle session.
      const early = await connectHttp(server.url, TOKENS.reader);
      expect((await early.client.listTools()).tools.length).toBeGreaterThan(0);
      // 300 raw initializes at once, as a per-call CLI (the Inspector's) would leave them.
      const t0 = performance.now();
      const statuses = await Promise.all(
        Array.from({ length: 300 }, () =>
          post(server.url, bearer(TOKENS.reader)).then(async (r) => {
            const retry = r.headers.get("retry-after");
            return { status: r.status, retry, text: await r.text() };
          }),
        ),
      );
      // What the bucket can have let through: the burst (40) plus its refill while the flood ran.
      const allowance = 40 + Math.ceil(((performance.now() - t0) / 60_000) * 40);
      const ok = statuses.filter((s) => s.status === 200).length;
      const limited = statuses.filter((s) => s.status === 429);
      expect(ok + limited.length).toBe(300);
      // The rest are refused with a Retry-After, nearly all by the rate limit (a few may meet
      // the cap while all six of the reader's sessions are still initialising).
      expect(ok).toBeGreaterThanOrEqual(PER_PRINCIPAL);
      expect(ok).toBeLessThanOrEqual(allowance);
      expect(limited.every((s) => Number(s.retry) >= 1)).toBe(true);
      expect(limited.filter((s) => /initialize_rate/.test(s.text)).length).toBeGreaterThanOrEqual(
        300 - allowance,
      );
      // The reader never holds more than its cap; its first session was evicted (it was idle).
      expect(await openSessions(base)).toBeLessThanOrEqual(PER_PRINCIPAL);
      await expect(early.client.listTools()).rejects.toThrow(/404|not found/i);
      await early.close().catch(() => {});

      // Real SDK clients of the reader's that connect and go away without DELETE, one per call.
      let connected = 0;
      for (let i = 0; i < 8; i++) {
        await sleep(1600); // the reader's allowance refills at 40 a minute
        const c = await connectHttp(server.url, TOKENS.reader).catch((e) => e as Error);
        if (c instanceof Error) {
          expect(String(c)).toMatch(/initialize_rate/); // rate-limited, never a 503
          continue;
        }
        await c.client.listTools();
        connected++;
        // No DELETE: the transport is dropped, the session stays open on the server.
      }
      expect(connected).toBeGreaterThanOrEqual(4);
      expect(await openSessions(base)).toBeLessThanOrEqual(PER_PRINCIPAL);

      // The agent and agent2 still get in, and so does a flood from agent2 up to the server cap:
      // the server evicts the largest holder's oldest idle session instead of answering 503.
      const agent = await connectHttp(server.url, TOKENS.agent);
      expect((await agent.client.listTools()).tools.length).toBe(9);
      const agent2: Awaited<ReturnType<typeof connectHttp>>[] = [];
      for (let i = 0; i < PER_PRINCIPAL; i++) agent2.push(await connectHttp(server.url, AGENT2));
      const more = await connectHttp(server.url, TOKENS.agent);
      expect((await more.client.listTools()).tools.length).toBe(9);
      expect((await agent.client.listTools()).tools.length).toBe(9);
      expect(await openSessions(base)).toBeLessThanOrEqual(MAX_SESSIONS);
      await Promise.all([agent, more, ...agent2].map((c) => c.close().catch(() => {})));
    },
  );
});

describe("initialize per client address, /metrics behind a scope", () => {
  let server: HttpServerProc;
  let base: string;
  beforeAll(async () => {
    const dir = tempDir();
    server = await startHttpServer(
      writeCfg(dir, {
        initialize_rate: { per_principal_per_minute: 1000, per_address_per_minute: 5 },
        metrics_auth: "token",
      }),
    );
    base = server.url.replace(/\/mcp$/, "");
  });
  afterAll(async () => {
    await server?.stop();
  });

  it("answers /metrics only to a token with metrics:read when so configured", T, async () => {
    const none = await fetch(`${base}/metrics`);
    expect(none.status).toBe(401);
    expect(none.headers.get("www-authenticate")).toMatch(/^Bearer resource_metadata=/);
    const reader = await fetch(`${base}/metrics`, { headers: bearer(TOKENS.reader) });
    expect(reader.status).toBe(403);
    expect(reader.headers.get("www-authenticate")).toMatch(/scope="metrics:read"/);
    const ok = await fetch(`${base}/metrics`, { headers: bearer(SCRAPER) });
    expect(ok.status).toBe(200);
    expect(await ok.text()).toContain("tpu_mcp_http_sessions");
  });

  it("limits new sessions from one address whatever the token", T, async () => {
    const tokens = [TOKENS.reader, TOKENS.agent, AGENT2, TOKENS.reader, TOKENS.agent, AGENT2];
    const statuses: number[] = [];
    for (const t of tokens) {
      const r = await post(server.url, bearer(t));
      statuses.push(r.status);
      const text = await r.text();
      if (r.status === 429) expect(text).toMatch(/client address/);
    }
    expect(statuses).toEqual([200, 200, 200, 200, 200, 429]);
  });
});

describe("Host and Origin on every endpoint, CORS, duplicate JSON-RPC ids", () => {
  let server: HttpServerProc;
  let base: string;
  beforeAll(async () => {
    const dir = tempDir();
    server = await startHttpServer(writeCfg(dir, { allowed_origins: [ALLOWED_ORIGIN] }));
    base = server.url.replace(/\/mcp$/, "");
  });
  afterAll(async () => {
    await server?.stop();
  });

  const PATHS = [
    "/metrics",
    "/healthz",
    "/readyz",
    "/.well-known/oauth-protected-resource",
    "/.well-known/oauth-protected-resource/mcp",
    "/mcp",
    "/no-such-path",
  ];

  it("refuses a foreign Host or Origin on every path, before anything is read", T, async () => {
    for (const path of PATHS) {
      const evilHost = await raw(base + path, { headers: { host: "evil.example:7801" } });
      expect(evilHost.status, `${path} with Host evil.example`).toBe(403);
      expect(evilHost.body, path).not.toMatch(/tpu_mcp_|"status":"ok"|scopes_supported/);
      const evilOrigin = await raw(base + path, {
        headers: { host: new URL(base).host, origin: "https://evil.example" },
      });
      expect(evilOrigin.status, `${path} with a foreign Origin`).toBe(403);
      expect(evilOrigin.headers["access-control-allow-origin"], path).toBeUndefined();
    }
    // The same paths answer with this server's Host and no Origin (not a browser).
    for (const path of ["/metrics", "/healthz", "/.well-known/oauth-protected-resource"])
      expect((await fetch(base + path)).status, path).toBe(200);
  });

  it(
    "answers CORS preflights from an allowed origin without auth, and only from it",
    T,
    async () => {
      const preflight = (origin: string) =>
        raw(server.url, {
          method: "OPTIONS",
          headers: {
            host: new URL(base).host,
            origin,
            "access-control-request-method": "POST",
            "access-control-request-headers":
              "authorization, content-type, mcp-session-id, mcp-protocol-version",
          },
        });
      const good = await preflight(ALLOWED_ORIGIN);
      expect(good.status).toBe(204);
      expect(good.headers["access-control-allow-origin"]).toBe(ALLOWED_ORIGIN);
      const allowHeaders = String(good.headers["access-control-allow-headers"]).toLowerCase();
      for (const h of ["authorization", "content-type", "mcp-session-id", "mcp-protocol-version"])
        expect(allowHeaders).toContain(h);
      expect(String(good.headers["access-control-allow-methods"])).toMatch(/POST/);
      expect(String(good.headers["vary"])).toMatch(/Origin/);
      const bad = await preflight("https://evil.example");
      expect(bad.status).toBe(403);
      expect(bad.headers["access-control-allow-origin"]).toBeUndefined();

      // The real request from the allowed origin: its answers are readable, errors included.
      const noToken = await post(server.url, { origin: ALLOWED_ORIGIN });
      expect(noToken.status).toBe(401);
      expect(noToken.headers.get("access-control-allow-origin")).toBe(ALLOWED_ORIGIN);
      expect(noToken.headers.get("access-control-expose-headers")).toMatch(/WWW-Authenticate/i);
      const init = await post(server.url, { origin: ALLOWED_ORIGIN, ...bearer(TOKENS.agent) });
      expect(init.status).toBe(200);
      expect(init.headers.get("access-control-allow-origin")).toBe(ALLOWED_ORIGIN);
      expect(init.headers.get("access-control-expose-headers")).toMatch(/Mcp-Session-Id/i);
      expect(init.headers.get("mcp-session-id")).toBeTruthy();
      await init.text();
      // A request without an Origin (not a browser) gets no CORS headers at all.
      const plain = await post(server.url, bearer(TOKENS.agent));
      expect(plain.headers.get("access-control-allow-origin")).toBeNull();
      await plain.text();
    },
  );

  it("answers every one of five concurrent requests that reuse one JSON-RPC id", T, async () => {
    const init = await post(server.url, bearer(TOKENS.agent));
    const sid = init.headers.get("mcp-session-id")!;
    await init.text();
    const h = {
      ...bearer(TOKENS.agent),
      "mcp-session-id": sid,
      "mcp-protocol-version": "2025-11-25",
    };
    await (
      await post(server.url, h, { jsonrpc: "2.0", method: "notifications/initialized" })
    ).text();
    // load_model starts the (lazy) worker first: the first call is in progress for seconds.
    const call = {
      jsonrpc: "2.0",
      id: 42,
      method: "tools/call",
      params: { name: "load_model", arguments: { model: "mnist-cnn" } },
    };
    const answers = await Promise.all(
      Array.from({ length: 5 }, () =>
        post(server.url, h, call).then(async (r) => ({ status: r.status, text: await r.text() })),
      ),
    );
    const dup = answers.filter((a) => a.status === 409);
    const done = answers.filter((a) => a.status === 200);
    expect(done.length).toBe(1);
    expect(done[0].text).toContain('"id":42');
    expect(dup.length).toBe(4);
    for (const d of dup) {
      const body = JSON.parse(d.text);
      expect(body).toMatchObject({ jsonrpc: "2.0", id: 42, error: { code: -32600 } });
      expect(body.error.message).toMatch(/already used by a request in progress/);
    }
    // Once answered, the id may be used again.
    const again = await post(server.url, h, {
      ...call,
      params: { name: "get_runtime_status", arguments: {} },
    });
    expect(again.status).toBe(200);
    expect(await again.text()).toContain('"id":42');
  });
});
