// A stdio transport that answers every request, even a malformed one. The SDK's stdio transport
// drops lines it cannot validate (non-object params, batches, a byte-order mark, a structure too
// deep to validate) without a reply, so such a caller waits for its own timeout; here each gets
// a JSON-RPC error with its id, or with id null when no id can be read (JSON-RPC 2.0 §5.1).
import process from "node:process";
import type { JSONRPCMessage, Transport } from "@modelcontextprotocol/server";
import { parseJSONRPCMessage } from "@modelcontextprotocol/server";
import { corkForTurn } from "../../runtime/wire/cork.js";
import { TRACE_META_KEY, monotonicUs } from "../../tools/support/trace.js";

const PARSE_ERROR = -32700;
const INVALID_REQUEST = -32600;

/** Lines longer than this are discarded unread (the client gets a parse error). */
const DEFAULT_MAX_LINE_BYTES = 256 * 1024 * 1024;

type Id = string | number | null;

function usableId(v: unknown): Id {
  return typeof v === "string" || (typeof v === "number" && Number.isFinite(v)) ? v : null;
}

export class AnsweringStdioServerTransport implements Transport {
  onclose?: () => void;
  onerror?: (error: Error) => void;
  onmessage?: (message: JSONRPCMessage) => void;

  private chunks: Buffer[] = [];
  private buffered = 0;
  private discarding = false;
  private started = false;
  /** Ids of the client's requests not yet answered. */
  private readonly pending = new Set<string | number>();
  /** When the current chunk arrived (monotonic µs), kept only when tracing is on. */
  private chunkAtUs = 0;

  constructor(
    private readonly stdin: NodeJS.ReadableStream = process.stdin,
    private readonly stdout: NodeJS.WritableStream = process.stdout,
    private readonly maxLineBytes = DEFAULT_MAX_LINE_BYTES,
    private readonly opts: { trace?: boolean } = {},
  ) {}

  private readonly ondata = (chunk: Buffer) => {
    if (this.opts.trace) this.chunkAtUs = monotonicUs();
    let start = 0;
    for (let nl = chunk.indexOf(10); nl !== -1; nl = chunk.indexOf(10, start)) {
      this.take(chunk.subarray(start, nl));
      const line = Buffer.concat(this.chunks, this.buffered);
      const skipped = this.discarding;
      this.chunks = [];
      this.buffered = 0;
      this.discarding = false;
      if (skipped)
        this.reply(null, PARSE_ERROR, `Parse error: line over ${this.maxLineBytes} bytes`);
      else this.handleLine(line);
      start = nl + 1;
    }
    this.take(chunk.subarray(start));
  };

  private readonly onStdinError = (e: Error) => this.onerror?.(e);

  private take(part: Buffer): void {
    if (this.discarding || part.length === 0) return;
    if (this.buffered + part.length > this.maxLineBytes) {
      // Keep nothing of an oversized line; answer once its end arrives.
      this.chunks = [];
      this.buffered = 0;
      this.discarding = true;
      return;
    }
    this.chunks.push(part);
    this.buffered += part.length;
  }

  private handleLine(line: Buffer): void {
    let text = line.toString("utf8");
    if (text.charCodeAt(0) === 0xfeff) text = text.slice(1); // a byte-order mark is not JSON
    if (text.endsWith("\r")) text = text.slice(0, -1);
    if (!text.trim()) return;
    let raw: unknown;
    try {
      raw = JSON.parse(text);
    } catch {
      return this.reply(null, PARSE_ERROR, "Parse error: the line is not valid JSON");
    }
    if (Array.isArray(raw)) {
      // JSON-RPC batches are not part of MCP 2025-11-25: refuse each request in it.
      const ids = raw.map((m) => usableId((m as any)?.id)).filter((id) => id !== null);
      if (ids.length === 0)
        return this.reply(null, INVALID_REQUEST, "Invalid Request: batches are not supported");
      for (const id of ids)
        this.reply(id, INVALID_REQUEST, "Invalid Request: batches are not supported");
      return;
    }
    let parsed: { success: true; data: JSONRPCMessage } | undefined;
    try {
      parsed = { success: true, data: parseJSONRPCMessage(raw) };
    } catch {
      parsed = undefined; // not JSON-RPC, or nesting too deep for the validator's recursion
    }
    if (parsed?.success) {
      const msg = parsed.data as { method?: unknown; id?: unknown };
      if (
        typeof msg.method === "string" &&
        (typeof msg.id === "string" || typeof msg.id === "number")
      ) {
        // Answers are matched to requests by id: a second request with an id still in progress
        // would leave the caller unable to tell the two answers apart.
        if (this.pending.has(msg.id)) {
          return this.reply(
            msg.id,
            INVALID_REQUEST,
            `Invalid Request: id ${JSON.stringify(msg.id).slice(0, 80)} is already used by a request in progress; use a new id`,
          );
        }
        this.pending.add(msg.id);
      } else if (msg.method === "notifications/cancelled") {
        // A cancelled request gets no answer: its id is free again.
        const id = (parsed.data as { params?: { requestId?: unknown } }).params?.requestId;
        if (typeof id === "string" || typeof id === "number") this.pending.delete(id);
      }
      if (this.opts.trace) this.stamp(parsed.data);
      this.onmessage?.(parsed.data);
      return;
    }
    const obj = raw && typeof raw === "object" ? (raw as Record<string, unknown>) : {};
    const isNotification = obj.id === undefined && typeof obj.method === "string";
    const error = new Error(`invalid JSON-RPC message dropped: ${text.slice(0, 200)}`);
    this.onerror?.(error);
    // Notifications and responses are never answered, even when malformed.
    if (isNotification || "result" in obj || "error" in obj) return;
    this.reply(
      usableId(obj.id),
      INVALID_REQUEST,
      "Invalid Request: not a valid JSON-RPC 2.0 / MCP message (check jsonrpc, id, method and that params is an object)",
    );
  }

  /** A request that asked for a trace gets the transport's stamps in its meta (tools/support/trace.ts). */
  private stamp(message: JSONRPCMessage): void {
    const meta = (message as { params?: { _meta?: Record<string, unknown> } }).params?._meta;
    const asked = meta?.[TRACE_META_KEY];
    if (!asked || typeof asked !== "object") return;
    Object.assign(asked, { recv_us: this.chunkAtUs, parsed_us: monotonicUs() });
  }

  private reply(id: Id, code: number, message: string): void {
    this.stdout.write(JSON.stringify({ jsonrpc: "2.0", id, error: { code, message } }) + "\n");
  }

  async start(): Promise<void> {
    if (this.started) throw new Error("AnsweringStdioServerTransport already started");
    this.started = true;
    this.stdin.on("data", this.ondata);
    this.stdin.on("error", this.onStdinError);
  }

  async close(): Promise<void> {
    this.stdin.off("data", this.ondata);
    this.stdin.off("error", this.onStdinError);
    if (this.stdin.listenerCount("data") === 0) this.stdin.pause();
    this.chunks = [];
    this.onclose?.();
  }

  send(message: JSONRPCMessage): Promise<void> {
    const m = message as { id?: unknown; method?: unknown };
    if (m.method === undefined && (typeof m.id === "string" || typeof m.id === "number"))
      this.pending.delete(m.id); // an answer (result or error) to one of the client's requests
    // Answers of calls that finish together (one audit commit) leave in one write.
    corkForTurn(this.stdout);
    if (this.stdout.write(JSON.stringify(message) + "\n")) return Promise.resolve();
    // One wait shared by every sender while the pipe is full (a listener each would pile up).
    this.drained ??= new Promise<void>((resolve) =>
      this.stdout.once("drain", () => {
        this.drained = undefined;
        resolve();
      }),
    );
    return this.drained;
  }

  private drained?: Promise<void>;
}
