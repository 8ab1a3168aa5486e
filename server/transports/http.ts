// Streamable HTTP in both protocol eras on one endpoint: 2025-era requests (initialize, then a
// session) on stateful sessions (one MCP server per session, bound to the principal that opened
// it), 2026-07-28 requests on the SDK's stateless handler (a fresh server per request, bound to
// the principal of that request's token). In front of both: bearer auth, Origin and Host checks
// and CORS for every path, a body limit, session caps per principal and a rate limit on
// `initialize`, and the operational endpoints: /healthz and /readyz answer without asking the
// worker; /metrics asks it for its queue depths and waits at most 500 ms for them. Every
// credential checked here or in the console goes through one limiter for failed authentication
// (auth_limit.ts).
// Over 500 lines on purpose: one request's checks run in order (Host, Origin, CORS, then for
// /mcp: auth, body (size, JSON), scope, header contradictions, era, session), and keeping that
// order in `handle` and `handleMcp` is what makes it reviewable.
import { randomUUID } from "node:crypto";
import {
  createServer,
  type IncomingMessage,
  type Server as HttpServer,
  type ServerResponse,
} from "node:http";
import type { AddressInfo } from "node:net";
import {
  NodeStreamableHTTPServerTransport,
  toNodeHandler,
  toWebRequest,
} from "@modelcontextprotocol/node";
import {
  createMcpHandler,
  isInitializeRequest,
  isLegacyRequest,
  localhostAllowedHostnames,
  PROTOCOL_VERSION_META_KEY,
  type AuthInfo,
  type Server,
} from "@modelcontextprotocol/server";
import { canCall, hasScope, requiredScope, SCOPES, type Principal } from "../../policies/scopes.js";
import type { App } from "../app/app.js";
import { AuthLimiter, type AuthLimitReport } from "../auth_limit.js";
import { createConsoleRoutes } from "../console/console.js";
import { HttpError, readBody, sendJson, sweepSessions } from "../http_util.js";
import { createMcpServer } from "../mcp/server.js";

export interface HttpOptions {
  host: string;
  port: number;
  /** Serve without bearer tokens (only on loopback; every caller gets `anonymous`). */
  noAuth?: boolean;
}

interface Session {
  transport: NodeStreamableHTTPServerTransport;
  server: Server;
  principalId: string;
  lastSeen: number;
  /** POSTs of this session still being answered; a session with none is idle (evictable). */
  busy: number;
  /** JSON-RPC ids of requests in progress: a second request with one of them is refused. */
  pendingIds: Set<string | number>;
}

export interface RunningHttp {
  url: string;
  port: number;
  server: HttpServer;
  sessions: () => number;
  close(): Promise<void>;
}

export function isLoopbackHost(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, "");
  return h === "localhost" || h === "::1" || /^127(\.\d{1,3}){3}$/.test(h);
}

/** Headers a browser may send (preflight) and read (responses) across origins. */
const CORS_ALLOW_HEADERS =
  "Authorization, Content-Type, Accept, Mcp-Session-Id, Mcp-Protocol-Version, Last-Event-ID, Mcp-Method, Mcp-Name";
const CORS_EXPOSE_HEADERS = "Mcp-Session-Id, Mcp-Protocol-Version, WWW-Authenticate, Retry-After";
const CORS_ALLOW_METHODS = "GET, POST, DELETE, OPTIONS";

function jsonRpcError(
  res: ServerResponse,
  status: number,
  code: number,
  message: string,
  headers: Record<string, string> = {},
  id: string | number | null = null,
) {
  sendJson(res, status, { jsonrpc: "2.0", error: { code, message }, id }, headers);
}

/** The ids of the JSON-RPC requests (not notifications or responses) in a body. */
function requestIds(body: unknown): (string | number)[] {
  const msgs = Array.isArray(body) ? body : [body];
  const ids: (string | number)[] = [];
  for (const m of msgs) {
    if (!m || typeof m !== "object" || typeof (m as any).method !== "string") continue;
    const id = (m as any).id;
    if (typeof id === "string" || (typeof id === "number" && Number.isFinite(id))) ids.push(id);
  }
  return ids;
}

/** The request ids a body's `notifications/cancelled` messages name (a batch may hold several). */
function cancelledIds(body: unknown): (string | number)[] {
  const msgs = Array.isArray(body) ? body : [body];
  const ids: (string | number)[] = [];
  for (const m of msgs) {
    if ((m as { method?: unknown } | null)?.method !== "notifications/cancelled") continue;
    const id = (m as { params?: { requestId?: unknown } }).params?.requestId;
    if (typeof id === "string" || (typeof id === "number" && Number.isFinite(id))) ids.push(id);
  }
  return ids;
}

/** The reserved `_meta` keys of the 2026-07-28 envelope share this prefix. */
const ENVELOPE_PREFIX = "io.modelcontextprotocol/";

/**
 * A request that contradicts itself, refused before either era's handler sees it: the routing
 * headers of 2026-07-28 must name what the body says (a proxy routes on them, the server acts on
 * the body), and a request that speaks that era (its envelope or header) must say which version.
 */
export function contradiction(
  headers: IncomingMessage["headers"],
  body: unknown,
): { code: number; message: string } | undefined {
  if (!body || typeof body !== "object" || Array.isArray(body)) return undefined;
  const msg = body as { method?: unknown; id?: unknown; params?: any };
  if (typeof msg.method !== "string") return undefined;
  const method = headers["mcp-method"];
  if (typeof method === "string" && method !== msg.method)
    return {
      code: -32020,
      message: `Mcp-Method header "${method.slice(0, 64)}" does not match the body's method "${msg.method.slice(0, 64)}"`,
    };
  const name = headers["mcp-name"];
  const named = msg.method === "resources/read" ? msg.params?.uri : msg.params?.name;
  if (typeof name === "string" && named !== undefined && name !== String(named))
    return {
      code: -32020,
      message: `Mcp-Name header "${name.slice(0, 64)}" does not match the body's "${String(named).slice(0, 64)}"`,
    };
  const meta = msg.params?._meta;
  const speaksModern =
    (typeof headers["mcp-protocol-version"] === "string" &&
      headers["mcp-protocol-version"] >= "2026") ||
    (meta &&
      typeof meta === "object" &&
      Object.keys(meta).some((k) => k.startsWith(ENVELOPE_PREFIX)));
  if (
    msg.id !== undefined &&
    msg.method !== "initialize" &&
    headers["mcp-session-id"] === undefined &&
    speaksModern &&
    (!meta || typeof meta[PROTOCOL_VERSION_META_KEY] !== "string")
  )
    return {
      // The revision's conformance suite: a missing envelope is invalid params, not a version mismatch.
      code: -32602,
      message: `a 2026-07-28 request must carry its protocol version in _meta["${PROTOCOL_VERSION_META_KEY}"]`,
    };
  return undefined;
}

export async function startHttp(app: App, opts: HttpOptions): Promise<RunningHttp> {
  // Not before what a killed server left running is settled (reconcile.ts).
  await app.ready;
  const cfg = app.config.http;
  const log = app.logger.child({ component: "http" });
  if (opts.noAuth && !isLoopbackHost(opts.host)) {
    throw new Error(
      `--no-auth is only allowed on a loopback address (127.0.0.1, ::1, localhost), not ${opts.host}`,
    );
  }
  const sessions = new Map<string, Session>();
  const authLimiter = new AuthLimiter({
    free: cfg.auth_limit.free_failures,
    maxDelayMs: cfg.auth_limit.max_backoff_s * 1000,
    perMinute: cfg.auth_limit.failures_per_minute,
    budget: app.storage.httpRates.authFailures,
    report: (lines) => lines.forEach(auditAuthFailures),
  });
  const consoleRoutes = createConsoleRoutes(app, { authLimiter });
  // 2026-07-28 requests: stateless, one server per request for the principal this layer
  // authenticated (handed over as the request's AuthInfo; the SDK never reads tokens itself).
  // 2025-era requests never reach it (`reject`): they keep their sessions below.
  const modern = toNodeHandler(
    createMcpHandler(
      (ctx) =>
        createMcpServer(app, (ctx.authInfo?.extra as { principal: Principal }).principal, "modern"),
      { legacy: "reject", maxRequestBodySize: cfg.max_body_bytes },
    ),
    { maxRequestBodySize: cfg.max_body_bytes },
  );
  let baseUrl = "";
  const anonymous: Principal = {
    id: "anonymous",
    scopes: app.config.policy.stdio_principal.scopes as any,
    via: "token",
  };
  const { initPerPrincipal, initPerAddress } = app.storage.httpRates;
  // --no-auth (loopback only) means no tokens anywhere, /metrics included.
  const metricsNeedToken =
    !opts.noAuth &&
    (cfg.metrics_auth === "token" || (cfg.metrics_auth === "auto" && !isLoopbackHost(opts.host)));

  const metadataUrl = () => `${baseUrl}/.well-known/oauth-protected-resource`;
  const resourceUrl = () => cfg.resource_url ?? `${baseUrl}/mcp`;
  const challenge = (extra: string) =>
    `Bearer resource_metadata="${metadataUrl()}"${extra ? `, ${extra}` : ""}`;

  // Only names this server is meant to be reached by; anything else smells of DNS rebinding.
  const allowedHosts = new Set(
    [
      opts.host,
      ...(isLoopbackHost(opts.host) ? localhostAllowedHostnames() : []),
      ...cfg.allowed_hosts,
    ].map((h) => h.toLowerCase()),
  );
  // Not the SDK's validateHostHeader: it takes the hostname a URL parser reads from the header,
  // port-agnostic, so it passes "localhost/x" or "x@localhost", and it has no "name:port" entry;
  // here the header must be exactly an allowed name, or an allowed name:port.
  function checkHost(req: IncomingMessage) {
    const host = (req.headers.host ?? "").toLowerCase();
    const name = host.startsWith("[")
      ? host.slice(0, host.indexOf("]") + 1)
      : host.replace(/:\d+$/, "");
    if (!allowedHosts.has(name) && !allowedHosts.has(host)) {
      throw new HttpError(
        403,
        "Host header not allowed (DNS rebinding protection); add it to http.allowed_hosts",
      );
    }
  }

  /**
   * The request's Origin when it is allowed; undefined when there is none (not a browser). Not
   * the SDK's validateOriginHeader, which compares hostnames only (any scheme, any port: another
   * local app's page on localhost:6666 would pass): here an origin is allowed whole.
   */
  function checkOrigin(req: IncomingMessage): string | undefined {
    const origin = req.headers.origin;
    if (origin === undefined) return undefined; // not a browser
    if (cfg.allowed_origins.includes(origin)) return origin;
    // This server's own origin on loopback (Host was checked first, so it names this server):
    // a rebinding page would carry its own, foreign origin.
    const host = (req.headers.host ?? "").toLowerCase();
    if (isLoopbackHost(opts.host) && host && origin.toLowerCase() === `http://${host}`)
      return origin;
    throw new HttpError(403, "Origin not allowed; add it to http.allowed_origins");
  }

  /**
   * One audit record per address and window (at most a few per minute in all), never one per
   * guess: failed authentications have no principal, and anyone could otherwise fill the trail.
   */
  function auditAuthFailures(r: AuthLimitReport) {
    const from = r.address ?? `${r.addresses} other addresses`;
    const guessed = r.failed + r.refused > 0;
    log.warn(
      { ...r },
      guessed ? "failed authentications" : "requests without a credential refused",
    );
    // Asking without a credential is how an OAuth client starts its discovery: not audited.
    if (!guessed) return;
    // From a timer: a store that refuses the write must not take the server down.
    try {
      appendAuthRecord(r, from);
    } catch (e) {
      log.error({ err: String(e) }, "could not audit failed authentications");
    }
  }

  function appendAuthRecord(r: AuthLimitReport, from: string) {
    void app.audit
      .append({
        time: new Date().toISOString(),
        principal: "unauthenticated",
        tool: "authenticate",
        args_digest: null,
        args: { address: r.address, addresses: r.addresses, surfaces: r.surfaces },
        outcome: "denied",
        code: r.refused > 0 ? "rate_limited" : "invalid_token",
        reason: `${r.failed} failed authentication(s) and ${r.refused} refused (throttled) from ${from} on ${r.surfaces.join(", ")}`,
      })
      .catch((e) => log.error({ err: String(e) }, "could not audit failed authentications"));
  }

  async function authenticate(req: IncomingMessage, surface: string): Promise<Principal> {
    if (opts.noAuth) return anonymous;
    const h = req.headers.authorization ?? "";
    const m = /^Bearer\s+(\S+)\s*$/i.exec(h);
    if (!m) {
      // No credential, nothing guessed: the client is asking how to authenticate. Counted into
      // the limiter's window report; only an address's first of the window is logged at once.
      const logNow = authLimiter.noCredential(req.socket.remoteAddress, surface);
      throw new HttpError(401, "a bearer token is required", {
        headers: { "www-authenticate": challenge("") },
        counted: !logNow,
      });
    }
    // A configured token (or a JWT verified lately) is known at once: never limited, so another
    // process's wrong guesses from the same address cannot hold a valid client back.
    let known: Principal | null;
    try {
      known = app.auth.recognize(m[1]);
    } catch (e) {
      throw unauthorized(e);
    }
    if (known) return known;
    // Anything else is reserved before it is checked (and before the body is read).
    const slot = await authLimiter.admit(req.socket.remoteAddress, surface);
    if (!slot.ok) {
      throw new HttpError(429, `${slot.why}; retry after ${slot.retryAfterS} s (http.auth_limit)`, {
        code: "rate_limited",
        headers: { "retry-after": String(slot.retryAfterS) },
        counted: true,
      });
    }
    try {
      const principal = await app.auth.authenticate(m[1]);
      slot.ticket.settle(true);
      return principal;
    } catch (e) {
      slot.ticket.settle(false);
      throw unauthorized(e, true);
    }
  }

  /** `counted`: a failure the limiter has counted (and reports), not logged per request. */
  function unauthorized(e: unknown, counted = false): HttpError {
    const err = e as { code?: string; description?: string; message?: string };
    const code = err.code ?? "invalid_token";
    const desc = (err.description ?? err.message ?? "invalid token").replace(/"/g, "'");
    return new HttpError(401, desc, {
      headers: {
        "www-authenticate": challenge(`error="${code}", error_description="${desc}"`),
      },
      counted,
    });
  }

  /** Over HTTP a tool the principal may not call is an HTTP 403 challenge naming the scope. */
  async function checkScopes(principal: Principal, body: unknown) {
    const msgs = Array.isArray(body) ? body : [body];
    for (const msg of msgs) {
      if (msg && typeof msg === "object" && (msg as any).method === "tools/call") {
        const name = String((msg as any).params?.name ?? "");
        const tool = app.tools.find((t) => t.name === name);
        if (!tool || canCall(principal, tool.policy)) continue;
        try {
          // Refused before dispatch: the gate's scope step records the one refusal.
          await app.gate.enforceScope(principal, name, "HTTP 403");
        } catch {
          const scope = requiredScope(tool.policy);
          throw new HttpError(403, `insufficient_scope: ${name} needs the scope ${scope}`, {
            headers: {
              "www-authenticate": challenge(`error="insufficient_scope", scope="${scope}"`),
            },
          });
        }
      }
    }
  }

  function dropSession(id: string, why: string) {
    const s = sessions.get(id);
    if (!s) return;
    sessions.delete(id);
    app.metrics.sessions.set(sessions.size);
    log.info({ principal: s.principalId, session: id.slice(0, 8), why }, "HTTP session closed");
    s.transport.close().catch(() => {});
  }

  /** The idle session (no request in flight) least recently used, among those given. */
  function oldestIdle(candidates: Iterable<[string, Session]>): string | undefined {
    let best: [string, Session] | undefined;
    for (const e of candidates)
      if (e[1].busy === 0 && (!best || e[1].lastSeen < best[1].lastSeen)) best = e;
    return best?.[0];
  }

  /**
   * Makes room for one more session of this principal, or refuses. A principal over its own cap
   * loses its oldest idle session (clients that never send DELETE only ever evict themselves);
   * when the server is full, the principal holding the most sessions loses its oldest idle one.
   */
  function admitSession(principal: Principal) {
    const own = [...sessions].filter(([, s]) => s.principalId === principal.id);
    if (own.length >= cfg.max_sessions_per_principal) {
      const victim = oldestIdle(own);
      if (!victim) {
        throw new HttpError(
          429,
          `this principal already has ${own.length} open sessions, all busy (http.max_sessions_per_principal); end one with DELETE or retry later`,
          { headers: { "retry-after": "5" } },
        );
      }
      dropSession(victim, "per-principal session cap: oldest idle session evicted");
    }
    if (sessions.size >= cfg.max_sessions) {
      const counts = new Map<string, number>();
      for (const s of sessions.values())
        if (s.busy === 0) counts.set(s.principalId, (counts.get(s.principalId) ?? 0) + 1);
      const heaviest = [...counts].sort((a, b) => b[1] - a[1])[0]?.[0];
      const victim =
        heaviest && oldestIdle([...sessions].filter(([, s]) => s.principalId === heaviest));
      if (!victim) {
        throw new HttpError(503, "too many open sessions, all busy; retry later", {
          headers: { "retry-after": "5" },
        });
      }
      dropSession(victim, "server session cap: oldest idle session of the largest holder evicted");
    }
  }

  /** `initialize` is rate-limited per principal and per client address. */
  async function limitInitialize(principal: Principal, req: IncomingMessage) {
    const byPrincipal = await initPerPrincipal.take(principal.id);
    const byAddress = byPrincipal.ok
      ? await initPerAddress.take(req.socket.remoteAddress ?? "unknown")
      : byPrincipal;
    if (!byAddress.ok) {
      const after = Math.max(1, Math.ceil(byAddress.retry_after_ms / 1000));
      const who = byPrincipal.ok ? "this client address" : "this principal";
      log.warn(
        { principal: principal.id, remote: req.socket.remoteAddress, who },
        "initialize rate-limited",
      );
      throw new HttpError(
        429,
        `too many new sessions from ${who} (http.initialize_rate); reuse the session (Mcp-Session-Id) or retry after ${after} s`,
        { headers: { "retry-after": String(after) } },
      );
    }
  }

  /**
   * Whether the SDK's own classifier routes this POST to the 2026-07-28 handler. A body it cannot
   * classify (nesting too deep for its validator, say) goes to the 2025 transport, which answers
   * malformed JSON-RPC with a 4xx as it always has.
   */
  async function isModernRequest(req: IncomingMessage, body: unknown): Promise<boolean> {
    // 2026-07-28 has requests only (no batches, and no notifications from the client: it
    // cancels by closing the stream); anything else is a 2025 session's, or malformed.
    if (!body || typeof body !== "object" || Array.isArray(body) || !("id" in body)) return false;
    // A 2025 session's requests name their session (2026-07-28 has none): no classifying needed
    // on the hot path of every call in a session.
    if (req.headers["mcp-session-id"] !== undefined) return false;
    const limit = { maxRequestBodySize: cfg.max_body_bytes };
    try {
      // The body is already parsed (and bounded by http.max_body_bytes): handed over as is.
      return !(await isLegacyRequest(await toWebRequest(req, body, limit), body, limit));
    } catch (e) {
      log.debug({ err: String(e).slice(0, 200) }, "request not classifiable; served as 2025-era");
      return false;
    }
  }

  async function handleMcp(req: IncomingMessage, res: ServerResponse) {
    const principal = await authenticate(req, "/mcp");
    let body: unknown;
    if (req.method === "POST") {
      const raw = await readBody(req, cfg.max_body_bytes);
      try {
        body = JSON.parse(raw.toString("utf8"));
      } catch {
        return jsonRpcError(res, 400, -32700, "Parse error: the body is not valid JSON");
      }
      await checkScopes(principal, body);
    }
    const bad = req.method === "POST" ? contradiction(req.headers, body) : undefined;
    if (bad) {
      app.gate.refuseRequest(principal, String((body as any).method), bad.message);
      return jsonRpcError(res, 400, bad.code, bad.message, {}, (body as any).id ?? null);
    }
    if (req.method === "POST" && (await isModernRequest(req, body))) {
      const auth: AuthInfo = {
        token: "",
        clientId: principal.id,
        scopes: [...principal.scopes],
        extra: { principal },
      };
      return modern(Object.assign(req, { auth }), res, body);
    }
    const sid = req.headers["mcp-session-id"];
    if (typeof sid === "string") {
      const s = sessions.get(sid);
      // A session belongs to the principal that opened it; another token cannot ride on it.
      if (!s || s.principalId !== principal.id)
        return jsonRpcError(res, 404, -32001, "Session not found");
      s.lastSeen = Date.now();
      if (req.method !== "POST") return s.transport.handleRequest(req, res, body);
      // The transport routes answers by id: a second request with an id still in progress would
      // take the first one's answer and leave one caller waiting forever.
      const ids = requestIds(body);
      const seen = new Set<string | number>();
      for (const id of ids) {
        if (s.pendingIds.has(id) || seen.has(id)) {
          throw new HttpError(
            409,
            `Invalid Request: id ${JSON.stringify(id).slice(0, 80)} is already used by a request in progress in this session; use a new id`,
            { id },
          );
        }
        seen.add(id);
      }
      for (const id of ids) s.pendingIds.add(id);
      s.busy++;
      res.once("close", () => {
        s.busy--;
        s.lastSeen = Date.now();
        for (const id of ids) s.pendingIds.delete(id);
      });
      await s.transport.handleRequest(req, res, body);
      // A cancelled request gets no answer (the protocol says so), so its stream would stay
      // open and its session busy: closed once the cancellation has reached the handler.
      for (const id of cancelledIds(body)) if (s.pendingIds.has(id)) s.transport.closeSSEStream(id);
      return;
    }
    if (req.method !== "POST" || !isInitializeRequest(body)) {
      return jsonRpcError(
        res,
        400,
        -32000,
        "Bad Request: no valid session id; start with an initialize request",
      );
    }
    await limitInitialize(principal, req);
    admitSession(principal);
    // The session is registered before the first await, so concurrent initializes see each other.
    const id = randomUUID();
    const server = createMcpServer(app, principal);
    const transport: NodeStreamableHTTPServerTransport = new NodeStreamableHTTPServerTransport({
      sessionIdGenerator: () => id,
    });
    const session: Session = {
      transport,
      server,
      principalId: principal.id,
      lastSeen: Date.now(),
      busy: 1,
      pendingIds: new Set(),
    };
    sessions.set(id, session);
    app.metrics.sessions.set(sessions.size);
    transport.onclose = () => {
      if (sessions.get(id) === session) sessions.delete(id);
      app.metrics.sessions.set(sessions.size);
    };
    try {
      await server.connect(transport);
      await transport.handleRequest(req, res, body);
    } finally {
      session.busy--;
      // The transport refused the initialize (bad headers, protocol version): no session.
      if (transport.sessionId === undefined && sessions.get(id) === session) {
        sessions.delete(id);
        app.metrics.sessions.set(sessions.size);
        transport.close().catch(() => {});
      }
    }
  }

  async function handleMetrics(req: IncomingMessage, res: ServerResponse) {
    if (metricsNeedToken) {
      const p = await authenticate(req, "/metrics");
      if (!hasScope(p, "metrics:read")) {
        throw new HttpError(403, "insufficient_scope: /metrics needs the scope metrics:read", {
          headers: {
            "www-authenticate": challenge(`error="insufficient_scope", scope="metrics:read"`),
          },
        });
      }
    }
    app.metrics.inFlight.set(app.runtime.inFlight());
    if (app.runtime.state === "ready") {
      // Queue depths come from the worker; a busy or hung worker must not stall /metrics.
      const st = await app.runtime
        .call("status", {}, { timeoutMs: 500 })
        .then((r) => r.result)
        .catch(() => null);
      for (const m of st?.loaded ?? [])
        app.metrics.queueDepth.set({ model: m.model }, m.queue_depth ?? 0);
    }
    const dev = app.runtime.hello?.device;
    if (dev?.memory_free_bytes != null)
      app.metrics.deviceMemoryFree.set({ device: dev.kind }, dev.memory_free_bytes);
    res.writeHead(200, { "content-type": app.metrics.registry.contentType });
    res.end(await app.metrics.registry.metrics());
  }

  // Not the SDK's buildOAuthProtectedResourceMetadata: it needs an authorization server (static
  // tokens have none) and refuses an http issuer outside localhost, which the config allows.
  function handleResourceMetadata(_req: IncomingMessage, res: ServerResponse) {
    const jwt = app.config.policy.jwt;
    sendJson(res, 200, {
      resource: resourceUrl(),
      authorization_servers: jwt ? [jwt.issuer] : [],
      scopes_supported: SCOPES,
      bearer_methods_supported: ["header"],
      resource_name: "tpu-mcp",
    });
  }

  type Route = (req: IncomingMessage, res: ServerResponse) => unknown;
  // Every path this server answers, in one table; the Host, Origin and CORS rules in `handle`
  // apply to all of them alike.
  const routes: Record<string, Route> = {
    "/mcp": handleMcp,
    "/healthz": (_req, res) => sendJson(res, 200, { status: "ok" }),
    "/readyz": (_req, res) => {
      const ready = app.runtime.state === "ready";
      sendJson(res, ready ? 200 : 503, { status: ready ? "ready" : app.runtime.state });
    },
    "/metrics": handleMetrics,
    "/.well-known/oauth-protected-resource": handleResourceMetadata,
    "/.well-known/oauth-protected-resource/mcp": handleResourceMetadata,
  };

  async function handle(req: IncomingMessage, res: ServerResponse, path: string) {
    checkHost(req);
    const origin = checkOrigin(req);
    // The console is same-origin only: its own routes, sessions and CSRF rules, no CORS.
    if (path === "/console" || path.startsWith("/console/"))
      return await consoleRoutes.handle(req, res, path);
    if (origin !== undefined) {
      // Allowed browser origins may read answers, errors included (401's WWW-Authenticate).
      res.setHeader("access-control-allow-origin", origin);
      res.setHeader("access-control-expose-headers", CORS_EXPOSE_HEADERS);
      res.setHeader("vary", "Origin");
    }
    const route = Object.prototype.hasOwnProperty.call(routes, path) ? routes[path] : undefined;
    if (req.method === "OPTIONS") {
      // A CORS preflight carries no credentials: it is answered without authentication.
      res.writeHead(route ? 204 : 404, {
        allow: CORS_ALLOW_METHODS,
        ...(origin !== undefined
          ? {
              "access-control-allow-methods": CORS_ALLOW_METHODS,
              "access-control-allow-headers": CORS_ALLOW_HEADERS,
              "access-control-max-age": "600",
            }
          : {}),
      });
      return res.end();
    }
    if (!route) return sendJson(res, 404, { error: "not found: the MCP endpoint is /mcp" });
    await route(req, res);
  }

  // eslint-disable-next-line @typescript-eslint/no-misused-promises -- it catches every error itself
  const http = createServer(async (req, res) => {
    const path = (req.url ?? "/").split("?")[0];
    try {
      await handle(req, res, path);
    } catch (e) {
      if (e instanceof HttpError) {
        // Refusals before a principal is known cannot be audited (anyone could flood the trail);
        // they are logged so that probing leaves a trace. Token guesses and token-less requests the
        // limiter counted are logged by it, once per address and window (each one at debug only).
        if (e.status === 401 || e.status === 403 || e.counted) {
          const at = e.counted ? "debug" : "warn";
          log[at](
            {
              status: e.status,
              method: req.method,
              path,
              remote: req.socket.remoteAddress,
              reason: e.message,
            },
            "HTTP request refused",
          );
        }
        const code = e.status === 409 ? -32600 : -32000;
        return jsonRpcError(res, e.status, code, e.message, e.headers, e.id);
      }
      log.error({ err: e }, "HTTP request failed");
      return jsonRpcError(res, 500, -32603, "internal error");
    }
  });
  http.requestTimeout = 0; // SSE streams and long tool calls stay open; sessions expire instead.
  http.headersTimeout = 30_000;

  const stopSweep = sweepSessions(sessions, {
    everyMs: 30_000,
    expired: (s, now) => s.busy === 0 && s.lastSeen < now - cfg.session_idle_s * 1000,
    drop: (id) => dropSession(id, "idle"),
  });

  await new Promise<void>((resolve, reject) => {
    http.once("error", reject);
    http.listen(opts.port, opts.host, () => resolve());
  });
  const port = (http.address() as AddressInfo).port;
  const hostForUrl = opts.host.includes(":") ? `[${opts.host}]` : opts.host;
  baseUrl = `http://${hostForUrl}:${port}`;
  consoleRoutes.setBaseUrl(baseUrl);
  return {
    url: `${baseUrl}/mcp`,
    port,
    server: http,
    sessions: () => sessions.size,
    async close() {
      stopSweep();
      consoleRoutes.close();
      authLimiter.close();
      await Promise.all([...sessions.values()].map((s) => s.transport.close().catch(() => {})));
      sessions.clear();
      await new Promise<void>((r) => {
        http.close(() => r());
        http.closeAllConnections();
      });
    },
  };
}
