// Task-aware clients: the official Tasks client (@modelcontextprotocol/ext-tasks) over the SDK v2
// client. In the 2025 era it drives the SDK client itself; in 2026-07-28 the SDK client cannot
// carry task wire shapes, so the Tasks client is given a raw JSON-RPC dispatcher, as its docs
// ask: here one over HTTP (fetch, with the routing headers) and one over stdio (the server's own
// process, one JSON message a line).
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { createTaskSessionFromClient } from "@modelcontextprotocol/ext-tasks/client";
import type { Client } from "@modelcontextprotocol/client";
import { scaled } from "./calibrate.js";
import { MODERN } from "./modern.js";
import { CLI, ROOT } from "./server.js";

type Json = any;
export type RawResponse = { kind: "result"; result: Json } | { kind: "error"; error: Json };
export type RawDispatch = (
  request: Json,
  options?: { signal?: AbortSignal; context?: { headers?: Record<string, string> } },
) => Promise<RawResponse>;

const CLIENT_INFO = { name: "tpu-mcp-tasks-test", version: "0.0.0" };

// String ids: never one an SDK client on the same connection uses.
let nextId = 1;
const rawId = () => `raw-${nextId++}`;
function toResponse(msg: Json): RawResponse {
  return msg.error ? { kind: "error", error: msg.error } : { kind: "result", result: msg.result };
}

/** The routing headers a 2026-07-28 request over HTTP carries (SEP-2243 / SEP-2663). */
function routing(body: Json): Record<string, string> {
  const p = body.params ?? {};
  const name = body.method === "tools/call" ? p.name : p.taskId;
  return {
    "mcp-method": body.method,
    ...(typeof name === "string" ? { "mcp-name": name } : {}),
  };
}

/** Raw 2026-07-28 requests over HTTP; `headers` override (a test may lie in them). */
export function httpDispatch(url: string, token: string | undefined): RawDispatch {
  return async (request, options = {}) => {
    const id = rawId();
    const body = { jsonrpc: "2.0", id, ...request };
    const res = await fetch(url, {
      method: "POST",
      signal: options.signal,
      headers: {
        "content-type": "application/json",
        accept: "application/json, text/event-stream",
        "mcp-protocol-version": MODERN,
        ...(token ? { authorization: `Bearer ${token}` } : {}),
        ...routing(body),
        ...Object.fromEntries(
          Object.entries(options.context?.headers ?? {}).map(([k, v]) => [k.toLowerCase(), v]),
        ),
      },
      body: JSON.stringify(body),
    });
    const text = await res.text();
    const messages = (res.headers.get("content-type") ?? "").includes("text/event-stream")
      ? text
          .split("\n")
          .filter((l) => l.startsWith("data:"))
          .map((l) => JSON.parse(l.slice(5)))
      : [JSON.parse(text)];
    const answer = messages.find((m) => m.id === id || (m.id === null && m.error));
    if (!answer) throw new Error(`no answer to ${request.method} (HTTP ${res.status}): ${text}`);
    return toResponse(answer);
  };
}

/** A server over stdio spoken to in raw 2026-07-28 requests. */
export function stdioDispatch(configFile: string) {
  const proc = spawn(process.execPath, [CLI, "stdio", "--config", configFile], {
    cwd: ROOT,
    stdio: ["pipe", "pipe", "pipe"],
  });
  let stderr = "";
  proc.stderr.on("data", (d) => (stderr += d));
  const waiting = new Map<string, (m: Json) => void>();
  // The SDK client's own messages share the connection (its transport below).
  const transport: any = {
    start: async () => {},
    send: async (m: Json) => void proc.stdin.write(JSON.stringify(m) + "\n"),
    close: async () => close(),
  };
  createInterface({ input: proc.stdout }).on("line", (line) => {
    let msg: Json;
    try {
      msg = JSON.parse(line);
    } catch {
      return;
    }
    if (typeof msg.id === "string" && waiting.has(msg.id)) {
      waiting.get(msg.id)!(msg);
      waiting.delete(msg.id);
    } else transport.onmessage?.(msg);
  });
  const dispatch: RawDispatch = (request) =>
    new Promise((resolve, reject) => {
      const id = rawId();
      const timer = setTimeout(
        () => reject(new Error(`no answer to ${request.method}; server stderr:\n${stderr}`)),
        scaled(120_000),
      );
      waiting.set(id, (m) => {
        clearTimeout(timer);
        resolve(toResponse(m));
      });
      proc.stdin.write(JSON.stringify({ jsonrpc: "2.0", id, ...request }) + "\n");
    });
  function close() {
    return new Promise<void>((r) => {
      // Ended by a signal, a process has a signalCode and no exitCode.
      if (proc.exitCode !== null || proc.signalCode !== null) return r();
      proc.once("exit", () => r());
      proc.stdin.end();
      proc.kill("SIGTERM");
    });
  }
  return { dispatch, transport, close, stderr: () => stderr };
}

/** The Tasks client over an SDK v2 client in the 2025 era. */
export function legacyTasks(client: Client) {
  return createTaskSessionFromClient(client, { endpointId: "tpu-mcp-legacy" });
}

/**
 * The Tasks client in the 2026-07-28 era over `dispatch`; `client` (connected, pinned to
 * 2026-07-28) tells it the era and the server's capabilities. `capabilities`: what each request
 * declares besides the extension (a client with a person at it declares form elicitation).
 */
export function modernTasks(
  client: Client,
  dispatch: RawDispatch,
  capabilities: Record<string, any> = {},
) {
  return createTaskSessionFromClient(client, {
    endpointId: "tpu-mcp-modern",
    rawDispatch: dispatch as any,
    v2RequestFraming: {
      protocolVersion: MODERN,
      clientInfo: CLIENT_INFO,
      clientCapabilities: capabilities,
    },
  });
}

/**
 * A raw 2026-07-28 request's envelope (_meta), with or without the Tasks extension; `forms`: the
 * client also declares form elicitation.
 */
export function modernMeta(tasks: boolean, forms = false): Record<string, unknown> {
  return {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientInfo": CLIENT_INFO,
    "io.modelcontextprotocol/clientCapabilities": {
      ...(tasks ? { extensions: { "io.modelcontextprotocol/tasks": {} } } : {}),
      ...(forms ? { elicitation: { form: {} } } : {}),
    },
  };
}
