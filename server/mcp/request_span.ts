// The attributes of a request's SERVER span by the OpenTelemetry MCP conventions
// (docs/observability.md), how a tools/call outcome ends it, and the span of the other requests.
import { createHash } from "node:crypto";
import type { Server, ServerContext } from "@modelcontextprotocol/server";
import type { DispatchOutcome } from "../../tools/dispatch/dispatch.js";
import { tracerFor, type CallTracer } from "../../tools/support/trace.js";
import type { Era } from "./server.js";

const PROTOCOL_VERSION_KEY = "io.modelcontextprotocol/protocolVersion";

/** The request's protocol version: its envelope's (2026-07-28), or the session's. */
export function protocolVersion(server: Server, extra: ServerContext): string | undefined {
  const envelope = extra.mcpReq.envelope as Record<string, unknown> | undefined;
  const v = envelope?.[PROTOCOL_VERSION_KEY];
  return (
    (typeof v === "string" ? v.slice(0, 32) : undefined) ?? server.getNegotiatedProtocolVersion()
  );
}

const VERSIONS = new Set(["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25", "2026-07-28"]);
/** A metric label takes only the revisions there are: any other text is "other". */
export function knownVersion(v: string | undefined): string {
  return v === undefined ? "" : VERSIONS.has(v) ? v : "other";
}

export function requestAttributes(
  server: Server,
  extra: ServerContext,
  era: Era,
): Record<string, string> {
  const version = protocolVersion(server, extra);
  return {
    "mcp.method.name": extra.mcpReq.method,
    "jsonrpc.request.id": String(extra.mcpReq.id),
    // stdio has no session id; the HTTP transport's does (2025 era only).
    "network.transport": extra.sessionId !== undefined || era === "modern" ? "tcp" : "pipe",
    ...(version ? { "mcp.protocol.version": version } : {}),
    // The session id is a bearer of the session on the HTTP transport: only a digest leaves.
    ...(extra.sessionId
      ? {
          "mcp.session.id": createHash("sha256").update(extra.sessionId).digest("hex").slice(0, 32),
        }
      : {}),
  };
}

/**
 * A tool result with isError is a successful JSON-RPC answer: by the conventions its span is
 * failed with error.type `tool_error`; the stable code (docs/errors.md) says which.
 */
export function endCallSpan(trace: CallTracer, outcome: DispatchOutcome): void {
  if (outcome.kind === "error") {
    trace.set({ "tpu_mcp.error.code": outcome.code });
    trace.end("tool_error");
  } else {
    if (outcome.kind === "input_required") trace.set({ "tpu_mcp.outcome": "input_required" });
    trace.end();
  }
}

/**
 * The SERVER span of a request other than tools/call (which traces its own steps): named by its
 * method, failed with the JSON-RPC error code when the handler throws one. Nothing when no
 * traces are exported.
 */
export async function tracedRequest<T>(
  server: Server,
  extra: ServerContext,
  era: Era,
  meta: unknown,
  handle: () => Promise<T>,
): Promise<T> {
  const trace = tracerFor(false, {
    method: extra.mcpReq.method,
    meta,
    attributes: requestAttributes(server, extra, era),
  });
  if (!trace) return handle();
  try {
    const answer = await handle();
    trace.end();
    return answer;
  } catch (e) {
    const code = (e as { code?: unknown } | null)?.code;
    if (typeof code === "number") trace.set({ "rpc.response.status_code": String(code) });
    trace.end(typeof code === "number" ? String(code) : "_OTHER");
    throw e;
  }
}
