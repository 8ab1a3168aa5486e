// Guessing credentials against a real `tpu-mcp http`, as an attacker would: 50 console sign-ins
// whose headers arrive first and bodies together, a stream of wrong bearer tokens on /mcp, and
// the operator signing in from the attacker's own address meanwhile (at once: a configured token
// is recognised before the limiter). One limiter covers every
// path (server/auth_limit.ts); what it refuses is audited once per address, not once per guess.
// Each case speaks from its own loopback address (127.0.0.x), so the cases do not share a budget.
// The default http.auth_limit applies: 10 free failures per address, back-off up to 15 s.
import { request } from "node:http";
import { connect } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { INITIALIZE, type HttpServerProc } from "../helpers/server.js";
import { auditRows, cleanupTemp, sleep, startLazyDemoServer, TOKENS } from "./helpers.js";

const FREE = 10; // http.auth_limit.free_failures' default
const MAX_BACKOFF_S = 15; // http.auth_limit.max_backoff_s' default

interface Answer {
  status: number;
  retryAfter: string | undefined;
  body: string;
}

/** One HTTP request from the loopback address `from` (not fetch: it cannot pick its source). */
function send(
  url: string,
  from: string,
  opts: { method?: string; path: string; headers?: Record<string, string>; body?: string },
): Promise<Answer> {
  const u = new URL(url);
  return new Promise((resolve, reject) => {
    const req = request(
      {
        host: u.hostname,
        port: u.port,
        localAddress: from,
        path: opts.path,
        method: opts.method ?? "POST",
        headers: { "content-type": "application/json", ...opts.headers },
        agent: false,
      },
      (res) => {
        let body = "";
        res.on("data", (d) => (body += d));
        res.on("end", () =>
          resolve({ status: res.statusCode ?? 0, retryAfter: res.headers["retry-after"], body }),
        );
      },
    );
    req.on("error", reject);
    req.end(opts.body);
  });
}

const signIn = (url: string, from: string, token: string) =>
  send(url, from, { path: "/console/api/session", body: JSON.stringify({ token }) });

const mcp = (url: string, from: string, token: string) =>
  send(url, from, {
    path: "/mcp",
    headers: { authorization: `Bearer ${token}`, accept: "application/json, text/event-stream" },
    body: JSON.stringify(INITIALIZE),
  });

/**
 * `n` sign-ins on their own connections: every request's headers first, then (once they are all
 * at the server) every body at once. Each request is evaluated only if it got a slot on arrival.
 */
async function headersFirst(url: string, from: string, n: number): Promise<Answer[]> {
  const u = new URL(url);
  const bodies = Array.from({ length: n }, (_, i) => JSON.stringify({ token: `guess-${i}` }));
  const sockets = bodies.map((body) => {
    const s = connect({ host: u.hostname, port: Number(u.port), localAddress: from });
    let raw = "";
    const answer = new Promise<Answer>((resolve) => {
      s.on("data", (d) => (raw += d));
      s.on("error", () => {}); // a refused request's socket may be closed before its body: read what came
      s.on("close", () => {
        const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(raw)?.[1] ?? 0);
        const retryAfter = /\r\nretry-after: *(\S+)/i.exec(raw)?.[1];
        resolve({ status, retryAfter, body: raw.split("\r\n\r\n")[1] ?? "" });
      });
    });
    s.write(
      `POST /console/api/session HTTP/1.1\r\nHost: ${u.host}\r\nContent-Type: application/json\r\n` +
        `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n`,
    );
    return { s, body, answer };
  });
  await Promise.all(sockets.map(({ s }) => new Promise((r) => s.once("connect", r))));
  // Sequencing only (no timing is asserted): let every request's headers reach the server.
  await sleep(1_500);
  for (const { s, body } of sockets) if (!s.destroyed) s.write(body);
  return Promise.all(sockets.map(({ answer }) => answer));
}

describe("one limiter for failed authentication, on every path", () => {
  let server: HttpServerProc;
  let dataDir: string;

  beforeAll(async () => {
    ({ server, dataDir } = await startLazyDemoServer());
  });
  afterAll(async () => {
    await server?.stop();
    cleanupTemp();
  });

  it("evaluates at most the free failures of 50 sign-ins sent headers first, bodies together", async () => {
    const answers = await headersFirst(server.url, "127.0.0.11", 50);
    const evaluated = answers.filter((a) => a.status === 401);
    const refused = answers.filter((a) => a.status === 429);
    expect(evaluated.length + refused.length, JSON.stringify(answers.map((a) => a.status))).toBe(
      50,
    );
    expect(evaluated.length).toBeLessThanOrEqual(FREE);
    expect(refused.every((a) => Number(a.retryAfter) >= 1)).toBe(true);
    expect(refused[0].body).toMatch(/"code":"rate_limited"/); // the body may be chunked
  });

  it("slows wrong bearer tokens on /mcp after a bound, and the same address's console guesses too", async () => {
    const statuses: number[] = [];
    const retry: (string | undefined)[] = [];
    for (let round = 0; round < 10; round++) {
      const batch = await Promise.all(
        Array.from({ length: 10 }, (_, i) => mcp(server.url, "127.0.0.12", `wrong-${round}-${i}`)),
      );
      for (const a of batch) {
        statuses.push(a.status);
        if (a.status === 429) retry.push(a.retryAfter);
      }
    }
    const unauthorized = statuses.filter((s) => s === 401).length;
    expect(unauthorized + retry.length).toBe(100);
    // The free failures, then at most one per back-off step while the loop ran.
    expect(unauthorized).toBeLessThanOrEqual(FREE + 5);
    expect(retry.length).toBeGreaterThanOrEqual(80);
    expect(retry.every((r) => Number(r) >= 1 && Number(r) <= MAX_BACKOFF_S)).toBe(true);
    // One limiter: the console's sign-in from that address is throttled by the /mcp guesses.
    expect((await signIn(server.url, "127.0.0.12", "another-guess")).status).toBe(429);
  });

  it("lets the operator's correct token in at once, whatever an attacker of the same address did", async () => {
    const from = "127.0.0.13";
    for (let i = 0; i < FREE + 2; i++) {
      const a = await signIn(server.url, from, `wrong-${i}`);
      expect([401, 429]).toContain(a.status);
    }
    expect((await mcp(server.url, from, "wrong-mcp")).status).toBe(429);
    // A configured token is recognised before the limiter: no wait (issue 33).
    const r = await signIn(server.url, from, TOKENS.operator);
    expect(r.status, r.body).toBe(200);
    expect(JSON.parse(r.body).principal).toBe("operator");
    // The same over /mcp: the operator's bearer token opens a session.
    const m = await mcp(server.url, from, TOKENS.operator);
    expect(m.status, m.body).toBe(200);
    // The guesses from that address are still refused.
    expect((await mcp(server.url, from, "wrong-again")).status).toBe(429);
    // Another address was never affected by any of it.
    expect((await signIn(server.url, "127.0.0.14", TOKENS.operator)).status).toBe(200);
  });

  it("audits failed authentications once per address and window, not once per guess", async () => {
    await server.stop(); // the window's report is written at close at the latest
    const rows = auditRows(dataDir).filter((r) => r.tool === "authenticate");
    const guesses = 50 + 100 + 1 + FREE + 3 + 1;
    expect(rows.length).toBeGreaterThanOrEqual(3);
    expect(rows.length).toBeLessThan(10);
    expect(rows.length).toBeLessThan(guesses / 10);
    const addresses = rows.map((r) => r.args?.address);
    expect(addresses).toEqual(expect.arrayContaining(["127.0.0.11", "127.0.0.12", "127.0.0.13"]));
    const of12 = rows.filter((r) => r.args?.address === "127.0.0.12");
    expect(of12.some((r) => r.code === "rate_limited" && /refused/.test(r.reason))).toBe(true);
    expect(of12.flatMap((r) => r.args.surfaces)).toEqual(
      expect.arrayContaining(["/mcp", "/console"]),
    );
  });
});
