// The operator console at /console: static assets built by scripts/build_console.mjs and a small
// JSON + SSE API behind a cookie session. http.ts checks Host and Origin before handing requests
// here, exactly as for /mcp.
//
// Sign-in: POST /console/api/session {token} with a token holding approvals:grant or admin. The
// token is checked once and forgotten; the browser gets an HttpOnly, SameSite=Strict cookie
// holding a random session id, and a CSRF token in the JSON answer, which the page keeps in
// memory and sends as `x-csrf-token` on every state change. The token never travels in a URL and
// never reaches storage a script can read.
import { randomBytes, timingSafeEqual } from "node:crypto";
import { decodeJwt } from "jose";
import { existsSync, readFileSync } from "node:fs";
import type { IncomingMessage, ServerResponse } from "node:http";
import { join } from "node:path";
import type { ApprovalRecord } from "../../policies/approvals.js";
import type { AuditOutcome, StoredAuditRecord } from "../../policies/audit.js";
import { isPolicyError } from "../../policies/errors.js";
import { hasScope, type Principal } from "../../policies/scopes.js";
import { toolServices, type App } from "../app/app.js";

export const CONSOLE_COOKIE = "tpu_console";
export const CONSOLE_CSP =
  "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
  "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

const IDLE_MS = 30 * 60_000;
const MAX_AGE_MS = 12 * 3600_000;
const SIGNIN_WINDOW_MS = 60_000;
const SIGNIN_MAX_FAILURES = 10;
const ASSETS: Record<string, string> = {
  "app.js": "text/javascript; charset=utf-8",
  "app.css": "text/css; charset=utf-8",
};

interface ConsoleSession {
  id: string;
  principal: Principal;
  csrf: string;
  created: number;
  lastSeen: number;
  /** No later than this: a JWT's own expiry, or MAX_AGE_MS after sign-in. */
  endsAt: number;
  streams: Set<ServerResponse>;
}

class ConsoleError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

const SECURITY_HEADERS = {
  "content-security-policy": CONSOLE_CSP,
  "x-content-type-options": "nosniff",
  "x-frame-options": "DENY",
  "referrer-policy": "no-referrer",
  "cross-origin-opener-policy": "same-origin",
  "cross-origin-resource-policy": "same-origin",
  "permissions-policy": "camera=(), microphone=(), geolocation=()",
};

function send(
  res: ServerResponse,
  status: number,
  body: unknown,
  headers: Record<string, string | string[]> = {},
) {
  if (res.headersSent) return;
  res.writeHead(status, {
    ...SECURITY_HEADERS,
    "content-type": "application/json",
    "cache-control": "no-store",
    ...headers,
  });
  res.end(JSON.stringify(body));
}

function cookies(req: IncomingMessage): Record<string, string> {
  const out: Record<string, string> = {};
  for (const part of (req.headers.cookie ?? "").split(";")) {
    const i = part.indexOf("=");
    if (i > 0) out[part.slice(0, i).trim()] = part.slice(i + 1).trim();
  }
  return out;
}

const safeEqual = (a: string, b: string) => {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
};

async function readJson(req: IncomingMessage, limit = 16 * 1024): Promise<any> {
  if (!/^application\/json\b/i.test(req.headers["content-type"] ?? ""))
    throw new ConsoleError(415, "bad_request", "send JSON (content-type: application/json)");
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const c of req) {
    size += (c as Buffer).length;
    if (size > limit) throw new ConsoleError(413, "bad_request", `body over ${limit} bytes`);
    chunks.push(c as Buffer);
  }
  try {
    return JSON.parse(Buffer.concat(chunks).toString("utf8") || "{}");
  } catch {
    throw new ConsoleError(400, "bad_request", "the body is not valid JSON");
  }
}

export interface ConsoleRoutes {
  handle(req: IncomingMessage, res: ServerResponse, path: string): Promise<void>;
  setBaseUrl(url: string): void;
  sessions(): number;
  close(): void;
}

export function createConsoleRoutes(app: App): ConsoleRoutes {
  const log = app.logger.child({ component: "console" });
  const assetDir = join(app.config.paths.root, "dist", "console");
  const sessions = new Map<string, ConsoleSession>();
  const failures = new Map<string, number[]>();
  let secureCookies = false;

  const gauge = () => app.metrics.consoleSessions.set(sessions.size);
  const sweep = setInterval(() => {
    const now = Date.now();
    for (const s of sessions.values()) if (now - s.lastSeen > IDLE_MS || now >= s.endsAt) end(s);
    for (const [k, v] of failures)
      if (v.every((t) => now - t > SIGNIN_WINDOW_MS)) failures.delete(k);
  }, 60_000);
  sweep.unref();

  function end(s: ConsoleSession) {
    sessions.delete(s.id);
    for (const r of s.streams) r.end();
    gauge();
  }

  function sessionOf(req: IncomingMessage): ConsoleSession {
    const sid = cookies(req)[CONSOLE_COOKIE];
    const s = sid ? sessions.get(sid) : undefined;
    const now = Date.now();
    if (!s || now - s.lastSeen > IDLE_MS || now >= s.endsAt) {
      if (s) end(s);
      throw new ConsoleError(401, "signed_out", "sign in with an operator token");
    }
    s.lastSeen = now;
    return s;
  }

  /** State changes: same-origin browser requests that carry the session's CSRF token. */
  function checkWrite(req: IncomingMessage, s: ConsoleSession | null) {
    const site = req.headers["sec-fetch-site"];
    if (site !== undefined && site !== "same-origin" && site !== "none")
      throw new ConsoleError(403, "csrf", `cross-site request refused (${site})`);
    const origin = req.headers.origin;
    const host = req.headers.host ?? "";
    if (origin !== undefined && origin !== `http://${host}` && origin !== `https://${host}`)
      throw new ConsoleError(403, "csrf", "cross-origin request refused");
    if (s) {
      const token = req.headers["x-csrf-token"];
      if (typeof token !== "string" || !safeEqual(token, s.csrf))
        throw new ConsoleError(403, "csrf", "missing or wrong CSRF token; reload the console");
    }
  }

  function cookie(value: string, maxAgeS: number) {
    return `${CONSOLE_COOKIE}=${value}; Path=/console; HttpOnly; SameSite=Strict; Max-Age=${maxAgeS}${secureCookies ? "; Secure" : ""}`;
  }

  function remote(req: IncomingMessage) {
    return req.socket.remoteAddress ?? "?";
  }

  async function signIn(req: IncomingMessage, res: ServerResponse) {
    checkWrite(req, null);
    const now = Date.now();
    const addr = remote(req);
    const recent = (failures.get(addr) ?? []).filter((t) => now - t < SIGNIN_WINDOW_MS);
    if (recent.length >= SIGNIN_MAX_FAILURES)
      throw new ConsoleError(429, "rate_limited", "too many failed sign-ins; wait a minute");
    const body = await readJson(req);
    const token = typeof body?.token === "string" ? body.token.trim() : "";
    const fail = (status: number, code: string, msg: string, reason: string) => {
      recent.push(now);
      failures.set(addr, recent);
      log.warn({ remote: addr, reason }, "console sign-in refused");
      return new ConsoleError(status, code, msg);
    };
    if (!token) throw fail(400, "bad_request", "paste an operator token", "no token");
    let principal: Principal;
    try {
      principal = await app.auth.authenticate(token);
    } catch (e) {
      throw fail(401, "invalid_token", "the token was refused", (e as Error).message);
    }
    if (!hasScope(principal, "approvals:grant")) {
      throw fail(
        403,
        "insufficient_scope",
        `${principal.id} holds neither approvals:grant nor admin; the console is for operators`,
        `${principal.id} lacks approvals:grant`,
      );
    }
    // A session never outlives the JWT it was opened with (the JWT was verified just now).
    let endsAt = now + MAX_AGE_MS;
    if (principal.via === "jwt") {
      const exp = decodeJwt(token).exp;
      if (typeof exp === "number") endsAt = Math.min(endsAt, exp * 1000);
    }
    const s: ConsoleSession = {
      id: randomBytes(32).toString("base64url"),
      principal,
      csrf: randomBytes(32).toString("base64url"),
      created: now,
      lastSeen: now,
      endsAt,
      streams: new Set(),
    };
    sessions.set(s.id, s);
    gauge();
    log.info({ principal: principal.id, remote: addr }, "console sign-in");
    send(res, 200, describeSession(s), {
      "set-cookie": cookie(s.id, Math.max(1, Math.floor((endsAt - now) / 1000))),
    });
  }

  function describeSession(s: ConsoleSession) {
    return {
      signed_in: true,
      principal: s.principal.id,
      scopes: s.principal.scopes,
      admin: s.principal.scopes.includes("admin"),
      csrf: s.csrf,
      expires_at: new Date(s.endsAt).toISOString(),
    };
  }

  /** Identities other than the requester and the viewer that could decide (static tokens; JWTs by scope). */
  function deciders(requester: string, viewer: string): string[] {
    const ids = app.config.policy.tokens
      .filter((t) => t.scopes.includes("approvals:grant") || t.scopes.includes("admin"))
      .filter((t) => !t.expires_at || Date.parse(t.expires_at) > Date.now())
      .map((t) => t.id)
      .filter((id) => id !== requester && id !== viewer);
    if (app.config.policy.jwt) ids.push("any JWT subject with approvals:grant");
    return [...new Set(ids)];
  }

  function approvalView(r: ApprovalRecord, me: Principal) {
    return {
      ...r,
      deciders: deciders(r.principal, me.id),
      can_decide: r.status === "pending" && r.principal !== me.id,
    };
  }

  /** One page, pending first (all of them, page by page): newer requests never hide older ones. */
  async function approvals(res: ServerResponse, s: ConsoleSession, q: URLSearchParams) {
    const limit = Math.min(Math.max(Math.floor(Number(q.get("limit"))) || 100, 1), 500);
    const offset = Math.max(Math.floor(Number(q.get("offset"))) || 0, 0);
    const page = app.approvals.page({ limit, offset });
    send(res, 200, {
      now: new Date().toISOString(),
      pending: page.items
        .filter((r) => r.status === "pending")
        .map((r) => approvalView(r, s.principal)),
      history: page.items
        .filter((r) => r.status !== "pending")
        .map((r) => approvalView(r, s.principal)),
      pending_total: page.pending_total,
      history_total: page.history_total,
      offset,
      limit,
    });
  }

  async function decide(
    req: IncomingMessage,
    res: ServerResponse,
    s: ConsoleSession,
    id: string,
    decision: "approve" | "deny",
  ) {
    checkWrite(req, s);
    const body = await readJson(req);
    const reason =
      typeof body?.reason === "string" && body.reason.trim()
        ? body.reason.trim().slice(0, 500)
        : undefined;
    try {
      const rec = app.gate.decideApproval(id, s.principal, decision, reason);
      send(res, 200, approvalView(rec, s.principal));
    } catch (e) {
      if (isPolicyError(e)) {
        const status =
          e.code === "approval_not_found"
            ? 404
            : e.code === "insufficient_scope" || e.code === "approval_self_grant"
              ? 403
              : 409;
        return send(res, status, { error: { code: e.code, message: e.message } });
      }
      throw e;
    }
  }

  function events(req: IncomingMessage, res: ServerResponse, s: ConsoleSession) {
    res.writeHead(200, {
      ...SECURITY_HEADERS,
      "content-type": "text/event-stream",
      "cache-control": "no-store",
      connection: "keep-alive",
    });
    res.write(
      `retry: 2000\nevent: hello\ndata: ${JSON.stringify({ principal: s.principal.id })}\n\n`,
    );
    const off = app.approvalFeed.on((e) => {
      res.write(
        `event: approval\ndata: ${JSON.stringify({ type: e.type, record: approvalView(e.record, s.principal) })}\n\n`,
      );
    });
    const ping = setInterval(() => {
      if (!sessions.has(s.id)) return res.end();
      res.write(": ping\n\n");
    }, 15_000);
    ping.unref();
    s.streams.add(res);
    const stop = () => {
      off();
      clearInterval(ping);
      s.streams.delete(res);
    };
    req.on("close", stop);
    res.on("close", stop);
  }

  function audit(res: ServerResponse, q: URLSearchParams) {
    const limit = Math.min(Math.max(Number(q.get("limit")) || 200, 1), 1000);
    const principal = q.get("principal")?.trim();
    const tool = q.get("tool")?.trim();
    const outcome = q.get("outcome")?.trim() as AuditOutcome | undefined;
    const scanned = app.audit.tail(5000);
    const records: StoredAuditRecord[] = [];
    for (const r of scanned) {
      if (principal && r.principal !== principal) continue;
      if (tool && r.tool !== tool) continue;
      if (outcome && r.outcome !== outcome) continue;
      records.push(r);
      if (records.length >= limit) break;
    }
    send(res, 200, { records, scanned: scanned.length, verify: app.audit.verify() });
  }

  async function runtime(res: ServerResponse, s: ConsoleSession) {
    const tool = app.tools.find((t) => t.name === "get_runtime_status");
    let status: unknown = null;
    let error: string | null = null;
    if (tool) {
      try {
        status = await tool.handler(
          {},
          {
            ...toolServices(app),
            principal: s.principal,
            signal: AbortSignal.timeout(5000),
            progress: () => {},
          },
        );
      } catch (e) {
        error = (e as Error).message;
      }
    }
    send(res, 200, { status, error, runtime_state: app.runtime.state });
  }

  function jobs(res: ServerResponse) {
    send(res, 200, { jobs: app.jobs.listAll(100) });
  }

  async function cancelJob(
    req: IncomingMessage,
    res: ServerResponse,
    s: ConsoleSession,
    id: string,
  ) {
    checkWrite(req, s);
    if (!s.principal.scopes.includes("admin"))
      throw new ConsoleError(403, "insufficient_scope", "cancelling jobs needs the admin scope");
    const job = app.jobs.cancelAny(id);
    if (!job) throw new ConsoleError(404, "job_not_found", `no job ${id}`);
    log.info({ principal: s.principal.id, job_id: id }, "job cancelled from the console");
    send(res, 200, { job });
  }

  function benchmarks(res: ServerResponse) {
    send(res, 200, {
      reports: app.reports.list(100).map((r) => ({
        id: r.id,
        principal: r.principal,
        model: r.model,
        device: r.device,
        created_at: r.created_at,
        scenario: (r.report as any).scenario ?? null,
        configs: Array.isArray((r.report as any).configs) ? (r.report as any).configs.length : 0,
      })),
    });
  }

  function staticFile(res: ServerResponse, name: string) {
    const file = join(assetDir, name);
    if (!existsSync(file)) {
      return send(res, 503, {
        error: {
          code: "console_not_built",
          message: "the console's assets are not built; run `npm run setup`",
        },
      });
    }
    const type = name === "index.html" ? "text/html; charset=utf-8" : ASSETS[name.slice(7)];
    res.writeHead(200, {
      ...SECURITY_HEADERS,
      "content-type": type,
      "cache-control": "no-cache",
    });
    res.end(readFileSync(file));
  }

  async function route(req: IncomingMessage, res: ServerResponse, path: string) {
    const method = req.method ?? "GET";
    if (path === "/console" || path === "/console/") {
      if (method !== "GET") throw new ConsoleError(405, "bad_request", "GET only");
      return staticFile(res, "index.html");
    }
    const asset = /^\/console\/assets\/([a-z]+\.(?:js|css))$/.exec(path);
    if (asset && ASSETS[asset[1]] && method === "GET") return staticFile(res, `assets/${asset[1]}`);
    if (!path.startsWith("/console/api/"))
      throw new ConsoleError(404, "not_found", "no such console page");
    const api = path.slice("/console/api/".length);
    if (api === "session" && method === "POST") return signIn(req, res);
    if (api === "session" && method === "GET") {
      // Asked on every page load: "not signed in" is an answer, not an error.
      let s: ConsoleSession | undefined;
      try {
        s = sessionOf(req);
      } catch {
        return send(res, 200, { signed_in: false });
      }
      return send(res, 200, describeSession(s));
    }
    const s = sessionOf(req);
    if (api === "session" && method === "DELETE") {
      checkWrite(req, s);
      end(s);
      return send(res, 200, { signed_out: true }, { "set-cookie": cookie("", 0) });
    }
    if (method === "GET") {
      const q = new URL(req.url ?? "/", "http://x").searchParams;
      if (api === "approvals") return approvals(res, s, q);
      if (api === "events") return events(req, res, s);
      if (api === "audit") return audit(res, q);
      if (api === "jobs") return jobs(res);
      if (api === "runtime") return runtime(res, s);
      if (api === "benchmarks") return benchmarks(res);
      const b = /^benchmarks\/(bench_[0-9a-f]{20})$/.exec(api);
      if (b) {
        const r = app.reports.get(b[1]);
        if (!r) throw new ConsoleError(404, "not_found", `no report ${b[1]}`);
        return send(res, 200, { ...r });
      }
    }
    if (method === "POST") {
      const a = /^approvals\/(apr_[0-9a-f]{32})\/(approve|deny)$/.exec(api);
      if (a) return decide(req, res, s, a[1], a[2] as "approve" | "deny");
      const j = /^jobs\/(job_[0-9a-f]{24})\/cancel$/.exec(api);
      if (j) return cancelJob(req, res, s, j[1]);
    }
    throw new ConsoleError(404, "not_found", `no console API ${method} ${api.slice(0, 80)}`);
  }

  return {
    async handle(req, res, path) {
      try {
        await route(req, res, path);
      } catch (e) {
        if (e instanceof ConsoleError) {
          if (e.status === 403)
            log.warn({ remote: remote(req), path, reason: e.message }, "console request refused");
          return send(res, e.status, { error: { code: e.code, message: e.message } });
        }
        log.error({ err: String(e), path }, "console request failed");
        send(res, 500, { error: { code: "internal_error", message: "internal error" } });
      }
    },
    setBaseUrl(url) {
      secureCookies = url.startsWith("https:");
      app.consoleUrl = `${url}/console/`;
    },
    sessions: () => sessions.size,
    close() {
      clearInterval(sweep);
      for (const s of [...sessions.values()]) end(s);
    },
  };
}
