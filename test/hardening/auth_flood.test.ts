// One token-less client must not lock fresh JWTs out of the server (issue 43, row 1). The attack:
// one address sent bogus passkey sign-ins as fast as it could; each refusal was charged to the
// server-wide failed-auth budget even while that address was in back-off, so the budget ran dry
// and every new JWT, from any address, got 429; and each refusal wrote a warn line. Here a real
// `tpu-mcp http` with a JWT issuer takes a bounded flood from 127.0.0.51 on every path the
// failed-auth limiter guards (the passkey routes before a session, token sign-in, /mcp,
// /metrics) while real MCP clients, each with a JWT it never sent before, connect from
// 127.0.0.1. The server-wide budget is small (60 a minute), so a flood charged to it would
// empty it many times over. Then a flood with no credential at all (/mcp without a bearer
// token, a console sign-in with an empty token): each refusal used to write a warn line; now the
// limiter counts them into its window line, and only an address's first is logged at once.
import { request } from "node:http";
import { randomUUID } from "node:crypto";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { SignJWT, exportJWK, generateKeyPair } from "jose";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { scaled } from "../helpers/calibrate.js";
import {
  connectHttp,
  INITIALIZE,
  startHttpServer,
  type HttpServerProc,
} from "../helpers/server.js";
import { baseConfig, cleanupTemp, DEMO_POLICY, sleep, tempDir } from "./helpers.js";

const AUD = "https://tpu-mcp.flood.test/mcp";
const ISS = "https://issuer.flood.test";
const FREE = 10; // http.auth_limit.free_failures' default
const PER_MINUTE = 60;
const ATTACKER = "127.0.0.51";
/** Requests the flood may send at most, and how many it sends at once. */
const MAX_FLOOD = 3_000;
const PARALLEL = 8;
const JWT_CLIENTS = 5;
/** The token-less flood's address, its most requests, and its longest run. */
const TOKENLESS = "127.0.0.54";
const MAX_TOKENLESS = 600;
const TOKENLESS_MS = scaled(20_000);
/** The limiter's reporting window (http.ts leaves it at AuthLimiter's default). */
const WINDOW_MS = 60_000;

interface Answer {
  status: number;
  retryAfter: string | undefined;
  json: any;
}

/** One POST from the loopback address `from` (fetch cannot pick its source address). */
function post(
  url: string,
  from: string,
  path: string,
  body: unknown,
  headers: Record<string, string> = {},
): Promise<Answer> {
  const u = new URL(url);
  return new Promise((resolve, reject) => {
    const req = request(
      {
        host: u.hostname,
        port: u.port,
        localAddress: from,
        path,
        method: path === "/metrics" ? "GET" : "POST",
        headers: {
          "content-type": "application/json",
          accept: "application/json, text/event-stream",
          ...headers,
        },
        agent: false,
      },
      (res) => {
        let raw = "";
        res.on("data", (d) => (raw += d));
        res.on("end", () => {
          let json: any = raw;
          try {
            json = JSON.parse(raw);
          } catch {
            /* not JSON (an SSE answer, /metrics' text) */
          }
          resolve({ status: res.statusCode ?? 0, retryAfter: res.headers["retry-after"], json });
        });
      },
    );
    req.on("error", reject);
    req.end(path === "/metrics" ? undefined : JSON.stringify(body));
  });
}

/** A response shaped like a WebAuthn assertion (no enrolled key made it). */
const junkAssertion = {
  id: "bm90LWVucm9sbGVk",
  rawId: "bm90LWVucm9sbGVk",
  type: "public-key",
  clientExtensionResults: {},
  response: { authenticatorData: "AA", clientDataJSON: "AA", signature: "AA" },
};

/** The flood: every guarded path in turn, each request a wrong credential. */
const GUESSES: Array<
  (i: number) => [path: string, body: unknown, headers?: Record<string, string>]
> = [
  (i) => ["/console/api/passkeys/sign-in", { nonce: `n${i}`, response: junkAssertion }],
  (i) => ["/console/api/passkeys/enrol/options", { code: `wrong-code-${i}` }],
  (i) => [
    "/console/api/passkeys/enrol",
    { code: `wrong-code-${i}`, nonce: `n${i}`, response: junkAssertion },
  ],
  (i) => ["/console/api/session", { token: `wrong-token-${i}` }],
  (i) => ["/mcp", INITIALIZE, { authorization: `Bearer wrong-${i}` }],
  (i) => ["/metrics", null, { authorization: `Bearer wrong-${i}` }],
];

/** The pino records of the server's log at warn or above (level 40+). */
const warnRecords = (stderr: string): Record<string, any>[] =>
  stderr.split("\n").flatMap((l) => {
    try {
      const r = JSON.parse(l) as Record<string, any>;
      return r.level >= 40 ? [r] : [];
    } catch {
      return [];
    }
  });
const warnLines = (stderr: string) => warnRecords(stderr).map((r) => JSON.stringify(r));
/** The warn records about `address`: per-request lines name it `remote`, the limiter's `address`. */
const warnsOf = (stderr: string, address: string) =>
  warnRecords(stderr).filter((r) => r.remote === address || r.address === address);

describe("failed authentications from one address, on every guarded path", () => {
  let server: HttpServerProc;
  let keys: Awaited<ReturnType<typeof generateKeyPair>>;

  /** A valid JWT this server has never seen (a new jti each). */
  const freshJwt = () =>
    new SignJWT({ scope: "models:read" })
      .setProtectedHeader({ alg: "ES256", kid: "k1" })
      .setIssuer(ISS)
      .setAudience(AUD)
      .setSubject("alice")
      .setJti(randomUUID())
      .setIssuedAt()
      .setExpirationTime("5m")
      .sign(keys.privateKey);

  beforeAll(async () => {
    const dir = tempDir();
    keys = await generateKeyPair("ES256");
    const jwk = { ...(await exportJWK(keys.publicKey)), kid: "k1", alg: "ES256" };
    const cfg = join(dir, "config.json");
    writeFileSync(
      cfg,
      JSON.stringify(
        baseConfig(dir, {
          policy: { ...DEMO_POLICY, jwt: { issuer: ISS, audience: AUD, jwks: { keys: [jwk] } } },
          runtime: { start: "lazy" },
          http: {
            resource_url: AUD,
            metrics_auth: "token",
            auth_limit: { failures_per_minute: PER_MINUTE },
          },
        }),
      ),
    );
    server = await startHttpServer(cfg);
  });
  afterAll(async () => {
    await server?.stop();
    cleanupTemp();
  });

  it("one client must not lock out fresh JWTs, and its flood logs a bounded number of lines", async () => {
    const logBefore = warnLines(server.stderr()).length;
    const statuses = new Map<number, number>();
    let sent = 0;
    let done = false;
    const flood = Array.from({ length: PARALLEL }, async () => {
      while (!done && sent < MAX_FLOOD) {
        const i = sent++;
        const [path, body, headers] = GUESSES[i % GUESSES.length](i);
        const a = await post(server.url, ATTACKER, path, body, headers);
        statuses.set(a.status, (statuses.get(a.status) ?? 0) + 1);
      }
    });
    // Meanwhile (sequenced by the flood's count, not by time): real MCP clients, each with a
    // JWT never seen before, from another address (fetch's own, 127.0.0.1).
    const admitted: string[] = [];
    try {
      for (let c = 0; c < JWT_CLIENTS; c++) {
        while (sent < (c + 1) * 100 && sent < MAX_FLOOD) await sleep(5);
        const agent = await connectHttp(server.url, await freshJwt());
        try {
          const tools = await agent.client.listTools();
          expect(tools.tools.length).toBeGreaterThan(0);
          admitted.push(`client ${c} at flood request ${sent}`);
        } finally {
          await agent.close();
        }
      }
    } finally {
      done = true;
      await Promise.all(flood);
    }
    expect(admitted).toHaveLength(JWT_CLIENTS);
    // The flood outran the server-wide budget many times over: had its refusals been charged,
    // the clients above would have been refused.
    expect(sent).toBeGreaterThanOrEqual(JWT_CLIENTS * 100);
    // The attacker is still throttled: a bounded number of its guesses was evaluated.
    const evaluated = (statuses.get(401) ?? 0) + (statuses.get(403) ?? 0);
    const refused = statuses.get(429) ?? 0;
    expect(evaluated + refused, JSON.stringify([...statuses])).toBe(sent);
    expect(evaluated).toBeLessThan(PER_MINUTE);
    expect(refused).toBeGreaterThan(sent - PER_MINUTE);
    // No line per refused request: the limiter reports the address once per window (at close).
    const logged = warnLines(server.stderr()).slice(logBefore);
    expect(logged.length, logged.slice(0, 5).join("\n")).toBeLessThanOrEqual(3);
  });

  it("refuses a passkey check from an address in back-off before it is evaluated", async () => {
    const from = "127.0.0.53";
    // A live sign-in challenge of that address, asked before its back-off.
    const options = await post(server.url, from, "/console/api/passkeys/sign-in/options", {});
    expect(options.status).toBe(200);
    const nonce = options.json.nonce as string;
    let last: Answer | undefined;
    for (let i = 0; i < FREE; i++)
      last = await post(server.url, from, "/console/api/passkeys/enrol/options", {
        code: `wrong-${i}`,
      });
    expect(last!.status).toBe(429); // the last free failure started the back-off
    // In back-off: refused with the limiter's answer alone, so the challenge was not checked...
    const early = await post(server.url, from, "/console/api/passkeys/sign-in", {
      nonce,
      response: junkAssertion,
    });
    expect(early.status).toBe(429);
    expect(early.json.error.message).toMatch(/^too many failed authentications from this address/);
    // ...nor used up: once the back-off is over it is checked (and refused: no enrolled key made
    // the assertion), not "unknown or already used".
    await sleep(Number(early.retryAfter) * 1000 + 200);
    const later = await post(server.url, from, "/console/api/passkeys/sign-in", {
      nonce,
      response: junkAssertion,
    });
    expect(later.json.error.message, JSON.stringify(later.json)).toMatch(
      /^this passkey is not enrolled here/,
    );
  });

  let tokenless = 0;
  let tokenlessWindows = 0;

  it("a flood without any credential, on /mcp and the console sign-in, logs a bounded number of lines", async () => {
    const before = warnsOf(server.stderr(), TOKENLESS).length;
    const statuses = new Map<string, number>();
    const started = Date.now();
    const flood = Array.from({ length: PARALLEL }, async () => {
      while (tokenless < MAX_TOKENLESS && Date.now() - started < TOKENLESS_MS) {
        const i = tokenless++;
        const a =
          i % 2
            ? await post(server.url, TOKENLESS, "/mcp", INITIALIZE)
            : await post(server.url, TOKENLESS, "/console/api/session", { token: "" });
        const key = `${i % 2 ? "/mcp" : "/console"} ${a.status}`;
        statuses.set(key, (statuses.get(key) ?? 0) + 1);
      }
    });
    await Promise.all(flood);
    // Reporting windows the flood may have touched (one more for the window it began in).
    tokenlessWindows = Math.floor((Date.now() - started) / WINDOW_MS) + 2;
    expect(tokenless).toBeGreaterThanOrEqual(100);
    // Every one refused as before: /mcp with its OAuth challenge, the console asking for a token.
    expect(Object.fromEntries(statuses)).toEqual({
      "/mcp 401": Math.floor(tokenless / 2),
      "/console 400": Math.ceil(tokenless / 2),
    });
    const challenge = await post(server.url, TOKENLESS, "/mcp", INITIALIZE);
    expect(challenge.status).toBe(401);
    tokenless++;
    // Nothing guessed, so no back-off: a token-less request is never answered 429.
    expect(challenge.json.error.message).toMatch(/bearer token is required/);
    // At most the first of each window at once, and the limiter's line per window.
    const logged = warnsOf(server.stderr(), TOKENLESS).slice(before);
    expect(logged.length, JSON.stringify(logged.slice(0, 5))).toBeGreaterThanOrEqual(1);
    expect(logged.length, JSON.stringify(logged.slice(0, 5))).toBeLessThanOrEqual(
      2 * tokenlessWindows,
    );
  });

  it("counts that flood in the limiter's window lines, written at close at the latest", async () => {
    expect(tokenless).toBeGreaterThan(0);
    await server.stop();
    const lines = warnsOf(server.stderr(), TOKENLESS).filter((r) => r.address === TOKENLESS);
    expect(lines.length).toBeGreaterThanOrEqual(1);
    expect(lines.every((r) => r.failed === 0 && r.refused === 0)).toBe(true);
    expect(lines.flatMap((r) => r.surfaces)).toEqual(expect.arrayContaining(["/console", "/mcp"]));
    // Every request is in a window line, but for a window's lone one that was logged at once.
    const counted = lines.reduce((n, r) => n + (r.withoutCredential as number), 0);
    expect(counted).toBeLessThanOrEqual(tokenless);
    expect(counted).toBeGreaterThan(tokenless - tokenlessWindows);
  });
});
