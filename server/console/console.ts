// The operator console at /console: static assets built by scripts/build_console.mjs and a small
// JSON + SSE API behind a cookie session. http.ts checks Host and Origin before handing requests
// here, exactly as for /mcp.
//
// Over 500 lines on purpose: every route is a few lines over the same session, CSRF and error
// handling, and reading them side by side is how a reviewer checks that none skips a check.
//
// Sign-in with a passkey (WebAuthn; the routes are passkeys.ts's, the checks policies/passkeys/'s),
// or POST /console/api/session {token} with a token holding approvals:grant or admin. The
// token is checked once and forgotten (through the server's one limiter for failed
// authentication, reserved before the body is read); the browser gets an HttpOnly,
// SameSite=Strict cookie (Secure when the public URL is https or the request came over TLS)
// holding a random session id, and a CSRF token in the JSON answer, which the page keeps in
// memory and sends as `x-csrf-token` on every state change. The token never travels in a URL and
// never reaches storage a script can read. An operator holds at most
// http.console_sessions_per_principal sessions: one more signs out the least recently used.
// Sessions live in the storage port's ConsoleSessions (server/app/console_sessions.ts: this
// process's memory by default, shared where the store is, so any replica serves a session); only
// the open event streams are this process's.
import { timingSafeEqual } from "node:crypto";
import { decodeJwt } from "jose";
import { existsSync, readFileSync } from "node:fs";
import type { IncomingMessage, ServerResponse } from "node:http";
import type { TLSSocket } from "node:tls";
import { join } from "node:path";
import type { ApprovalRecord } from "../../policies/approval_record.js";
import { shownApproval, shownSha256 } from "../../policies/approval_shown.js";
import type { AuditOutcome } from "../../policies/audit.js";
import { AuditVerifier } from "../../policies/audit_verify.js";
import { httpStatusOf, isPolicyError } from "../../policies/errors.js";
import { hasScope, type Principal } from "../../policies/scopes.js";
import { dispatchTool, ERROR_META_KEY } from "../../tools/dispatch/dispatch.js";
import { toolServices, type App } from "../app/app.js";
import type { AuthLimiter } from "../auth_limit.js";
import { csrfOf, sessionKey, type ConsoleSessionRecord } from "../app/console_sessions.js";
import { HttpError, readJsonBody, sendJson } from "../http_util.js";
import { PasskeyCeremonies } from "../../policies/passkeys/ceremony.js";
import { passkeyRoutes } from "./passkeys.js";

export const CONSOLE_COOKIE = "tpu_console";
export const CONSOLE_CSP =
  "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
  "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

const IDLE_MS = 30 * 60_000;
const MAX_AGE_MS = 12 * 3600_000;
/** A sign-in's body must arrive within this; a reserved evaluation is never held open longer. */
const SIGNIN_BODY_MS = 10_000;
const VERIFY_EVERY_MS = 60_000;
const ASSETS: Record<string, string> = {
  "app.js": "text/javascript; charset=utf-8",
  "app.css": "text/css; charset=utf-8",
};

/** A session as a request sees it: the stored record, its key as `id`, and its CSRF token. */
interface ConsoleSession extends ConsoleSessionRecord {
  /** The store's key (the cookie id's sha256), never the cookie's secret itself. */
  id: string;
  csrf: string;
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

/** A console JSON answer: never cached, with the console's security headers. */
function send(
  res: ServerResponse,
  status: number,
  body: unknown,
  headers: Record<string, string | string[]> = {},
) {
  sendJson(res, status, body, { ...SECURITY_HEADERS, "cache-control": "no-store", ...headers });
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

const readJson = (req: IncomingMessage) => readJsonBody(req, 16 * 1024);

export interface ConsoleRoutes {
  handle(req: IncomingMessage, res: ServerResponse, path: string): Promise<void>;
  setBaseUrl(url: string): void;
  sessions(): number;
  close(): void;
}

export function createConsoleRoutes(app: App, opts: { authLimiter: AuthLimiter }): ConsoleRoutes {
  const log = app.logger.child({ component: "console" });
  const assetDir = app.config.paths.install.consoleAssets;
  const store = app.storage.consoleSessions;
  /** This process's open event streams, by session key (a session may be served elsewhere too). */
  const streams = new Map<string, Set<ServerResponse>>();
  let known = 0;
  // Behind a TLS proxy the request itself is plain HTTP: the public URL says https.
  const publicHttps = app.config.http.resource_url?.startsWith("https:") ?? false;

  const gauge = () =>
    void store.count().then(
      (n) => {
        known = n;
        app.metrics.consoleSessions.set(n);
      },
      (err) => log.warn({ err: String(err) }, "console sessions: count failed"),
    );
  // The chain is verified in the background, from a MAC'd checkpoint on (audit_verify.ts).
  const verifier = new AuditVerifier(app.audit, { logger: log });
  verifier.kick();
  const verifyTimer = setInterval(() => verifier.kick(), VERIFY_EVERY_MS);
  verifyTimer.unref();
  const sweepTimer = setInterval(() => {
    store.sweep(Date.now(), IDLE_MS).then(
      (keys) => {
        for (const k of keys) endStreams(k);
        gauge();
      },
      (err) => log.warn({ err: String(err) }, "console sessions: sweep failed"),
    );
  }, 60_000);
  sweepTimer.unref();

  /** Ends this process's streams of a session that is over. */
  function endStreams(key: string) {
    for (const r of streams.get(key) ?? []) r.end();
    streams.delete(key);
  }

  async function end(s: ConsoleSession) {
    await store.end(s.id);
    endStreams(s.id);
    gauge();
  }

  async function sessionOf(req: IncomingMessage): Promise<ConsoleSession> {
    const sid = cookies(req)[CONSOLE_COOKIE];
    // Unknown, idle or past its end: the store removes it and answers nothing.
    const rec = sid ? await store.touch(sid, Date.now(), IDLE_MS) : undefined;
    if (!sid || !rec) {
      if (sid) {
        endStreams(sessionKey(sid));
        gauge();
      }
      throw new HttpError(401, "sign in with a passkey or an operator token", {
        code: "signed_out",
      });
    }
    return { ...rec, id: rec.key, csrf: csrfOf(sid) };
  }

  /** State changes: same-origin browser requests that carry the session's CSRF token. */
  function checkWrite(req: IncomingMessage, s: ConsoleSession | null) {
    const site = req.headers["sec-fetch-site"];
    if (site !== undefined && site !== "same-origin" && site !== "none")
      throw new HttpError(403, `cross-site request refused (${site})`, { code: "csrf" });
    const origin = req.headers.origin;
    const host = req.headers.host ?? "";
    if (origin !== undefined && origin !== `http://${host}` && origin !== `https://${host}`)
      throw new HttpError(403, "cross-origin request refused", { code: "csrf" });
    if (s) {
      const token = req.headers["x-csrf-token"];
      if (typeof token !== "string" || !safeEqual(token, s.csrf))
        throw new HttpError(403, "missing or wrong CSRF token; reload the console", {
          code: "csrf",
        });
    }
  }

  function cookie(req: IncomingMessage, value: string, maxAgeS: number) {
    const secure = publicHttps || (req.socket as TLSSocket).encrypted === true;
    return `${CONSOLE_COOKIE}=${value}; Path=/console; HttpOnly; SameSite=Strict; Max-Age=${maxAgeS}${secure ? "; Secure" : ""}`;
  }

  function remote(req: IncomingMessage) {
    return req.socket.remoteAddress ?? "?";
  }

  async function signIn(req: IncomingMessage, res: ServerResponse) {
    checkWrite(req, null);
    const addr = remote(req);
    const fail = (status: number, code: string, msg: string, reason: string) => {
      log.warn({ remote: addr, reason }, "console sign-in refused");
      return new HttpError(status, msg, { code });
    };
    // A body that never comes is cut off: it must not hold a connection (nor, below, a slot).
    const late = setTimeout(() => req.destroy(), SIGNIN_BODY_MS);
    let token: string;
    try {
      const body = await readJson(req);
      token = typeof body?.token === "string" ? body.token.trim() : "";
    } finally {
      clearTimeout(late);
    }
    if (!token) {
      // Counted into the limiter's window report; only the address's first is logged at once.
      if (opts.authLimiter.noCredential(req.socket.remoteAddress, "/console"))
        throw fail(400, "bad_request", "paste an operator token", "no token");
      log.debug({ remote: addr, reason: "no token" }, "console sign-in refused");
      throw new HttpError(400, "paste an operator token", { code: "bad_request", counted: true });
    }
    // A configured token is known at once and never limited: another process guessing from
    // this address (on one machine, every process) cannot keep the operator out.
    let principal: Principal;
    let known: Principal | null;
    try {
      known = app.auth.recognize(token);
    } catch (e) {
      throw fail(401, "invalid_token", "the token was refused", (e as Error).message);
    }
    if (known) principal = known;
    else {
      // Anything else is a guess until proven: the failed-auth limiter rations its evaluation.
      const slot = await opts.authLimiter.admit(req.socket.remoteAddress, "/console");
      if (!slot.ok) {
        throw new HttpError(429, `${slot.why}; retry after ${slot.retryAfterS} s`, {
          code: "rate_limited",
          headers: { "retry-after": String(slot.retryAfterS) },
          counted: true,
        });
      }
      try {
        principal = await app.auth.authenticate(token);
        // A valid token is not a guess, whatever its scopes.
        slot.ticket.settle(true);
      } catch (e) {
        // Counted by the limiter, which logs it once per address and window.
        log.debug({ remote: addr, reason: (e as Error).message }, "console sign-in refused");
        throw new HttpError(401, "the token was refused", { code: "invalid_token", counted: true });
      } finally {
        slot.ticket.settle(false);
      }
    }
    const now = Date.now();
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
    await openSession(req, res, principal, endsAt);
  }

  /**
   * A new session for a principal just proven (token or passkey): the cookie and the answer.
   * Room for it is made in the store: the principal's least recently used sessions beyond
   * http.console_sessions_per_principal are signed out.
   */
  async function openSession(
    req: IncomingMessage,
    res: ServerResponse,
    principal: Principal,
    endsAt: number,
    credential?: string,
  ) {
    const now = Date.now();
    const cap = app.config.http.console_sessions_per_principal;
    const opened = await store.open({ principal, endsAt, now, credential }, cap);
    for (const k of opened.signedOut) {
      log.info(
        { principal: principal.id, cap },
        "console session signed out: http.console_sessions_per_principal reached",
      );
      endStreams(k);
    }
    const s: ConsoleSession = { ...opened.record, id: opened.record.key, csrf: csrfOf(opened.id) };
    gauge();
    log.info(
      { principal: principal.id, remote: remote(req), via: credential ? "passkey" : "token" },
      "console sign-in",
    );
    send(res, 200, describeSession(s), {
      "set-cookie": cookie(req, opened.id, Math.max(1, Math.floor((endsAt - now) / 1000))),
    });
  }

  const passkeys = passkeyRoutes({
    app,
    ceremonies: new PasskeyCeremonies(app.passkeys, app.config.policy.passkeys),
    store: app.passkeys,
    log,
    publicHttps,
    readJson,
    send: (res, status, body) => send(res, status, body),
    authBackoff: (req, surface) => opts.authLimiter.check(req.socket.remoteAddress, surface),
    failedAuth: (req, surface) => opts.authLimiter.fail(req.socket.remoteAddress, surface),
    openSession: (req, res, principal, credential) =>
      openSession(req, res, principal, Date.now() + MAX_AGE_MS, credential),
  });

  function describeSession(s: ConsoleSession) {
    return {
      signed_in: true,
      principal: s.principal.id,
      scopes: s.principal.scopes,
      admin: s.principal.scopes.includes("admin"),
      // A passkey session signs its decisions; a token session can decide token rules only.
      passkey: s.credential !== undefined,
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
    // The page renders `shown`; a decision's audit record carries its hash.
    const shown = shownApproval(r);
    return {
      ...r,
      shown,
      shown_sha256: shownSha256(shown),
      deciders: deciders(r.principal, me.id),
      can_decide: r.status === "pending" && r.principal !== me.id,
    };
  }

  /** One page, pending first (all of them, page by page): newer requests never hide older ones. */
  async function approvals(res: ServerResponse, s: ConsoleSession, q: URLSearchParams) {
    const limit = Math.min(Math.max(Math.floor(Number(q.get("limit"))) || 100, 1), 500);
    const offset = Math.max(Math.floor(Number(q.get("offset"))) || 0, 0);
    const page = await app.approvals.page({ limit, offset });
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
    // With {nonce, response}: a passkey assertion, verified against the approval as stored.
    const evidence = await passkeys.decisionEvidence(req, s, id, decision, body);
    try {
      const rec = await app.gate.decideApproval(
        id,
        s.principal,
        decision,
        reason,
        evidence ?? undefined,
      );
      send(res, 200, approvalView(rec, s.principal));
    } catch (e) {
      if (isPolicyError(e))
        return send(res, httpStatusOf(e.code), { error: { code: e.code, message: e.message } });
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
    // A sign-out through another replica (or the sweep there) ends this stream at its next ping.
    const ping = setInterval(() => {
      store.has(s.id).then(
        (live) => (live ? res.write(": ping\n\n") : res.end()),
        () => res.write(": ping\n\n"),
      );
    }, 15_000);
    ping.unref();
    let mine = streams.get(s.id);
    if (!mine) streams.set(s.id, (mine = new Set()));
    mine.add(res);
    const stop = () => {
      off();
      clearInterval(ping);
      mine.delete(res);
      if (mine.size === 0 && streams.get(s.id) === mine) streams.delete(s.id);
    };
    req.on("close", stop);
    res.on("close", stop);
  }

  async function audit(res: ServerResponse, q: URLSearchParams) {
    const limit = Math.min(Math.max(Number(q.get("limit")) || 200, 1), 1000);
    const { records, scanned } = await app.audit.search({
      window: 5000,
      limit,
      principal: q.get("principal")?.trim() || undefined,
      tool: q.get("tool")?.trim() || undefined,
      outcome: (q.get("outcome")?.trim() as AuditOutcome | undefined) || undefined,
    });
    // Never a verification pass here: the page shows how far the background task has got, and
    // asks it to catch up with the records appended since.
    verifier.kick();
    const verify = await verifier.status();
    send(res, 200, { records, scanned, verify });
  }

  /**
   * Runs a tool for the signed-in operator exactly as an MCP call would: through dispatch and the
   * gate (scope, rate, audit). The console never calls a handler itself.
   */
  async function callTool(
    res: ServerResponse,
    s: ConsoleSession,
    name: string,
    args: Record<string, unknown>,
  ) {
    const tool = app.tools.find((t) => t.name === name);
    if (!tool) throw new HttpError(404, `no tool ${name}`, { code: "not_found" });
    const gone = new AbortController();
    res.once("close", () => gone.abort(new Error("the console page went away")));
    const outcome = await dispatchTool({
      tool,
      rawArgs: args,
      principal: s.principal,
      gate: app.gate,
      base: toolServices(app),
      // Cancelled when the page goes away, as an MCP call is by its client; the gate applies
      // the tool's own time limit.
      signal: gone.signal,
      progress: () => {},
      logger: app.logger,
    });
    // No in-band approval here (the console passes no inBand): a result or an error.
    if (outcome.kind === "input_required") throw new Error(`${name} asked for an in-band approval`);
    const err = outcome.result._meta?.[ERROR_META_KEY] as
      { code: string; message: string } | undefined;
    // Refusals of the caller are HTTP refusals; other failures are the page's own answer.
    if (err?.code === "insufficient_scope")
      throw new HttpError(httpStatusOf(err.code), `this page runs ${name}, and ${err.message}`, {
        code: err.code,
      });
    if (err?.code === "rate_limited")
      throw new HttpError(httpStatusOf(err.code), err.message, { code: err.code });
    return err
      ? { out: null, error: err.message }
      : { out: outcome.result.structuredContent, error: null };
  }

  async function runtime(res: ServerResponse, s: ConsoleSession) {
    const { out, error } = await callTool(res, s, "get_runtime_status", {});
    send(res, 200, { status: out ?? null, error, runtime_state: app.runtime.state });
  }

  async function jobs(res: ServerResponse) {
    send(res, 200, { jobs: await app.jobs.listAll(100) });
  }

  /** The alerts that fired (newest first) and the principals suspended now. */
  async function alerts(res: ServerResponse) {
    const suspended = await app.gate.suspended();
    send(res, 200, { alerts: await app.alerts.recent(200), suspended });
  }

  async function cancelJob(
    req: IncomingMessage,
    res: ServerResponse,
    s: ConsoleSession,
    id: string,
  ) {
    checkWrite(req, s);
    // Not cancel_job (which cancels only the caller's own jobs): an admin's cancel of anyone's
    // job, audited like a tool call so the trail shows who stopped whose work.
    const record = (outcome: "denied" | "executed", reason: string, code?: string) =>
      app.audit.append({
        time: new Date().toISOString(),
        principal: s.principal.id,
        tool: "cancel_job",
        args_digest: null,
        outcome,
        reason: `${reason} (console)`,
        ...(code ? { code } : {}),
      });
    if (!s.principal.scopes.includes("admin")) {
      await record("denied", `cancelling ${id} needs the admin scope`, "insufficient_scope");
      throw new HttpError(403, "cancelling jobs needs the admin scope", {
        code: "insufficient_scope",
      });
    }
    const job = await app.jobs.cancelAny(id);
    if (!job) throw new HttpError(404, `no job ${id}`, { code: "job_not_found" });
    await record("executed", `cancelled ${job.principal}'s job ${id}`);
    log.info({ principal: s.principal.id, job_id: id }, "job cancelled from the console");
    send(res, 200, { job });
  }

  async function benchmarks(res: ServerResponse) {
    send(res, 200, {
      reports: (await app.reports.list(100)).map((r) => ({
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
      if (method !== "GET") throw new HttpError(405, "GET only", { code: "bad_request" });
      return staticFile(res, "index.html");
    }
    const asset = /^\/console\/assets\/([a-z]+\.(?:js|css))$/.exec(path);
    if (asset && ASSETS[asset[1]] && method === "GET") return staticFile(res, `assets/${asset[1]}`);
    if (!path.startsWith("/console/api/"))
      throw new HttpError(404, "no such console page", { code: "not_found" });
    const api = path.slice("/console/api/".length);
    if (api === "session" && method === "POST") return signIn(req, res);
    // Enrolment by code and sign-in by passkey come before any session exists.
    if (method === "POST" && /^passkeys\/(enrol|sign-in)(\/options)?$/.test(api)) {
      checkWrite(req, null);
      if (await passkeys.route(req, res, api, method, null)) return;
    }
    if (api === "session" && method === "GET") {
      // Asked on every page load: "not signed in" is an answer, not an error.
      let s: ConsoleSession | undefined;
      try {
        s = await sessionOf(req);
      } catch {
        return send(res, 200, { signed_in: false });
      }
      return send(res, 200, describeSession(s));
    }
    const s = await sessionOf(req);
    if (api === "session" && method === "DELETE") {
      checkWrite(req, s);
      await end(s);
      return send(res, 200, { signed_out: true }, { "set-cookie": cookie(req, "", 0) });
    }
    if (method === "GET") {
      const q = new URL(req.url ?? "/", "http://x").searchParams;
      if (api === "approvals") return approvals(res, s, q);
      if (api === "events") return events(req, res, s);
      if (api === "audit") return audit(res, q);
      if (api === "jobs") return jobs(res);
      if (api === "alerts") return alerts(res);
      if (api === "runtime") return runtime(res, s);
      if (api === "benchmarks") return benchmarks(res);
      const b = /^benchmarks\/(bench_[0-9a-f]{20})$/.exec(api);
      if (b) {
        const r = await app.reports.get(b[1]);
        if (!r) throw new HttpError(404, `no report ${b[1]}`, { code: "not_found" });
        return send(res, 200, { ...r });
      }
    }
    if (api.startsWith("passkeys") || /\/options$/.test(api)) {
      if (method !== "GET") checkWrite(req, s);
      if (await passkeys.route(req, res, api, method, s)) return;
    }
    if (method === "POST") {
      const a = /^approvals\/(apr_[0-9a-f]{32})\/(approve|deny)$/.exec(api);
      if (a) return decide(req, res, s, a[1], a[2] as "approve" | "deny");
      const j = /^jobs\/(job_[0-9a-f]{24})\/cancel$/.exec(api);
      if (j) return cancelJob(req, res, s, j[1]);
    }
    throw new HttpError(404, `no console API ${method} ${api.slice(0, 80)}`, { code: "not_found" });
  }

  return {
    async handle(req, res, path) {
      try {
        await route(req, res, path);
      } catch (e) {
        if (e instanceof HttpError) {
          if (e.status === 403 && !e.counted)
            log.warn({ remote: remote(req), path, reason: e.message }, "console request refused");
          return send(res, e.status, { error: { code: e.code, message: e.message } }, e.headers);
        }
        log.error({ err: String(e), path }, "console request failed");
        send(res, 500, { error: { code: "internal_error", message: "internal error" } });
      }
    },
    setBaseUrl(url) {
      // localhost, not 127.0.0.1: the links operators follow must be a secure context (passkeys).
      app.consoleUrl = `${url.replace("//127.0.0.1:", "//localhost:")}/console/`;
    },
    /** Sessions the store held when last counted (every replica's, with a shared store). */
    sessions: () => known,
    close() {
      clearInterval(sweepTimer);
      clearInterval(verifyTimer);
      verifier.close();
      // This process's streams end; the sessions stay in the store (a shared one serves them
      // through the other replicas, the memory one is closed with the storage).
      for (const k of [...streams.keys()]) endStreams(k);
    },
  };
}
