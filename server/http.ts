// Streamable HTTP: stateful sessions (one MCP server per session, bound to the principal that
// opened it), bearer auth, Origin and Host checks, a body limit, and the operational endpoints
// /healthz, /readyz and /metrics that answer without touching the worker.
import { randomUUID } from "node:crypto";
import {
  createServer,
  type IncomingMessage,
  type Server as HttpServer,
  type ServerResponse,
} from "node:http";
import type { AddressInfo } from "node:net";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import type { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { isInitializeRequest } from "@modelcontextprotocol/sdk/types.js";
import { requiredScope, SCOPES, type Principal } from "../policies/scopes.js";
import type { App } from "./app.js";
import { createConsoleRoutes } from "./console.js";
import { createMcpServer } from "./mcp.js";

export interface HttpOptions {
  host: string;
  port: number;
  /** Serve without bearer tokens (only on loopback; every caller gets `anonymous`). */
  noAuth?: boolean;
}

interface Session {
  transport: StreamableHTTPServerTransport;
  server: Server;
  principalId: string;
  lastSeen: number;
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

class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly headers: Record<string, string> = {},
  ) {
    super(message);
  }
}

function sendJson(
  res: ServerResponse,
  status: number,
  body: unknown,
  headers: Record<string, string> = {},
) {
  if (res.headersSent) return;
  res.writeHead(status, { "content-type": "application/json", ...headers });
  res.end(JSON.stringify(body));
}

function jsonRpcError(
  res: ServerResponse,
  status: number,
  code: number,
  message: string,
  headers: Record<string, string> = {},
) {
  sendJson(res, status, { jsonrpc: "2.0", error: { code, message }, id: null }, headers);
}

async function readBody(req: IncomingMessage, limit: number): Promise<Buffer> {
  const declared = Number(req.headers["content-length"] ?? "0");
  if (declared > limit) throw new HttpError(413, `request body over ${limit} bytes`);
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > limit) throw new HttpError(413, `request body over ${limit} bytes`);
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks);
}

export async function startHttp(app: App, opts: HttpOptions): Promise<RunningHttp> {
  const cfg = app.config.http;
  const log = app.logger.child({ component: "http" });
  if (opts.noAuth && !isLoopbackHost(opts.host)) {
    throw new Error(
      `--no-auth is only allowed on a loopback address (127.0.0.1, ::1, localhost), not ${opts.host}`,
    );
  }
  const sessions = new Map<string, Session>();
  const consoleRoutes = createConsoleRoutes(app);
  let baseUrl = "";
  const anonymous: Principal = {
    id: "anonymous",
    scopes: app.config.policy.stdio_principal.scopes as any,
    via: "token",
  };

  const metadataUrl = () => `${baseUrl}/.well-known/oauth-protected-resource`;
  const resourceUrl = () => cfg.resource_url ?? `${baseUrl}/mcp`;
  const challenge = (extra: string) =>
    `Bearer resource_metadata="${metadataUrl()}"${extra ? `, ${extra}` : ""}`;

  // Only names this server is meant to be reached by; anything else smells of DNS rebinding.
  const allowedHosts = new Set(
    [
      opts.host,
      ...(isLoopbackHost(opts.host) ? ["localhost", "127.0.0.1", "[::1]"] : []),
      ...cfg.allowed_hosts,
    ].map((h) => h.toLowerCase()),
  );
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

  function checkOrigin(req: IncomingMessage) {
    const origin = req.headers.origin;
    if (origin === undefined) return; // not a browser
    if (cfg.allowed_origins.includes(origin)) return;
    // This server's own origin on loopback (Host was checked first, so it names this server):
    // a rebinding page would carry its own, foreign origin.
    const host = (req.headers.host ?? "").toLowerCase();
    if (isLoopbackHost(opts.host) && host && origin.toLowerCase() === `http://${host}`) return;
    throw new HttpError(403, "Origin not allowed; add it to http.allowed_origins");
  }

  async function authenticate(req: IncomingMessage): Promise<Principal> {
    if (opts.noAuth) return anonymous;
    const h = req.headers.authorization ?? "";
    const m = /^Bearer\s+(\S+)\s*$/i.exec(h);
    if (!m) {
      throw new HttpError(401, "a bearer token is required", { "www-authenticate": challenge("") });
    }
    try {
      return await app.auth.authenticate(m[1]);
    } catch (e) {
      const err = e as { code?: string; description?: string; message?: string };
      const code = err.code ?? "invalid_token";
      const desc = (err.description ?? err.message ?? "invalid token").replace(/"/g, "'");
      throw new HttpError(401, desc, {
        "www-authenticate": challenge(`error="${code}", error_description="${desc}"`),
      });
    }
  }

  /** Over HTTP a tool the principal may not call is an HTTP 403 challenge naming the scope. */
  function checkScopes(principal: Principal, body: unknown) {
    const msgs = Array.isArray(body) ? body : [body];
    for (const msg of msgs) {
      if (msg && typeof msg === "object" && (msg as any).method === "tools/call") {
        const name = String((msg as any).params?.name ?? "");
        if (!app.tools.some((t) => t.name === name)) continue;
        try {
          // The gate's one scope enforcer, which audits the refusal.
          app.gate.enforceScope(principal, name, "HTTP 403");
        } catch {
          const scope = requiredScope(name);
          throw new HttpError(403, `insufficient_scope: ${name} needs the scope ${scope}`, {
            "www-authenticate": challenge(`error="insufficient_scope", scope="${scope}"`),
          });
        }
      }
    }
  }

  async function handleMcp(req: IncomingMessage, res: ServerResponse) {
    checkHost(req);
    checkOrigin(req);
    const principal = await authenticate(req);
    let body: unknown;
    if (req.method === "POST") {
      const raw = await readBody(req, cfg.max_body_bytes);
      try {
        body = JSON.parse(raw.toString("utf8"));
      } catch {
        return jsonRpcError(res, 400, -32700, "Parse error: the body is not valid JSON");
      }
      checkScopes(principal, body);
    }
    const sid = req.headers["mcp-session-id"];
    if (typeof sid === "string") {
      const s = sessions.get(sid);
      // A session belongs to the principal that opened it; another token cannot ride on it.
      if (!s || s.principalId !== principal.id)
        return jsonRpcError(res, 404, -32001, "Session not found");
      s.lastSeen = Date.now();
      return s.transport.handleRequest(req, res, body);
    }
    if (req.method !== "POST" || !isInitializeRequest(body)) {
      return jsonRpcError(
        res,
        400,
        -32000,
        "Bad Request: no valid session id; start with an initialize request",
      );
    }
    if (sessions.size >= cfg.max_sessions) {
      return jsonRpcError(res, 503, -32000, "too many open sessions; retry later", {
        "retry-after": "5",
      });
    }
    const server = createMcpServer(app, principal);
    const transport: StreamableHTTPServerTransport = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      onsessioninitialized: (id) => {
        sessions.set(id, { transport, server, principalId: principal.id, lastSeen: Date.now() });
        app.metrics.sessions.set(sessions.size);
      },
    });
    transport.onclose = () => {
      if (transport.sessionId) sessions.delete(transport.sessionId);
      app.metrics.sessions.set(sessions.size);
    };
    await server.connect(transport);
    await transport.handleRequest(req, res, body);
  }

  const http = createServer(async (req, res) => {
    const path = (req.url ?? "/").split("?")[0];
    try {
      if (path === "/healthz") return sendJson(res, 200, { status: "ok" });
      if (path === "/readyz") {
        const ready = app.runtime.state === "ready";
        return sendJson(res, ready ? 200 : 503, { status: ready ? "ready" : app.runtime.state });
      }
      if (path === "/metrics") {
        app.metrics.inFlight.set(app.runtime.inFlight());
        if (app.runtime.state === "ready") {
          // Queue depths come from the worker; a busy or hung worker must not stall /metrics.
          const st = await app.runtime
            .call<any>("status", {}, { timeoutMs: 500 })
            .then((r) => r.result)
            .catch(() => null);
          for (const m of st?.loaded ?? [])
            app.metrics.queueDepth.set({ model: m.model }, m.queue_depth ?? 0);
        }
        const dev = app.runtime.hello?.device;
        if (dev?.memory_free_bytes != null)
          app.metrics.deviceMemoryFree.set({ device: dev.kind }, dev.memory_free_bytes);
        res.writeHead(200, { "content-type": app.metrics.registry.contentType });
        return res.end(await app.metrics.registry.metrics());
      }
      if (
        path === "/.well-known/oauth-protected-resource" ||
        path === "/.well-known/oauth-protected-resource/mcp"
      ) {
        const jwt = app.config.policy.jwt;
        return sendJson(res, 200, {
          resource: resourceUrl(),
          authorization_servers: jwt ? [jwt.issuer] : [],
          scopes_supported: SCOPES,
          bearer_methods_supported: ["header"],
          resource_name: "tpu-mcp",
        });
      }
      if (path === "/mcp") return await handleMcp(req, res);
      if (path === "/console" || path.startsWith("/console/")) {
        checkHost(req);
        checkOrigin(req);
        return await consoleRoutes.handle(req, res, path);
      }
      return sendJson(res, 404, { error: "not found: the MCP endpoint is /mcp" });
    } catch (e) {
      if (e instanceof HttpError) {
        // Refusals before a principal is known cannot be audited (anyone could flood the trail);
        // they are logged so that probing and token guessing leave a trace.
        if (e.status === 401 || e.status === 403) {
          log.warn(
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
        return jsonRpcError(res, e.status, -32000, e.message, e.headers);
      }
      log.error({ err: e }, "HTTP request failed");
      return jsonRpcError(res, 500, -32603, "internal error");
    }
  });
  http.requestTimeout = 0; // SSE streams and long tool calls stay open; sessions expire instead.
  http.headersTimeout = 30_000;

  const sweep = setInterval(() => {
    const cutoff = Date.now() - cfg.session_idle_s * 1000;
    for (const [id, s] of sessions) {
      if (s.lastSeen < cutoff) {
        sessions.delete(id);
        s.transport.close().catch(() => {});
      }
    }
  }, 30_000);
  sweep.unref();

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
      clearInterval(sweep);
      consoleRoutes.close();
      await Promise.all([...sessions.values()].map((s) => s.transport.close().catch(() => {})));
      sessions.clear();
      await new Promise<void>((r) => {
        http.close(() => r());
        http.closeAllConnections();
      });
    },
  };
}
