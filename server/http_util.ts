// The HTTP plumbing /mcp (http.ts) and /console (console.ts) share: one error type carrying its
// HTTP status, one JSON reply, one bounded body reader and one sweep of idle sessions. Each
// surface renders an HttpError in its own wire shape (JSON-RPC for /mcp, {error} for /console).
import type { IncomingMessage, ServerResponse } from "node:http";

export class HttpError extends Error {
  readonly code: string;
  readonly headers: Record<string, string>;
  /** The JSON-RPC id the refusal answers (/mcp only). */
  readonly id: string | number | null;
  /**
   * A failed authentication (or a request without a credential) the failed-auth limiter counts
   * and logs once per address and window (server/auth_limit.ts): not logged per request, or a
   * flood would write a line each.
   */
  readonly counted: boolean;

  constructor(
    readonly status: number,
    message: string,
    opts: {
      code?: string;
      headers?: Record<string, string>;
      id?: string | number | null;
      counted?: boolean;
    } = {},
  ) {
    super(message);
    this.code = opts.code ?? "bad_request";
    this.headers = opts.headers ?? {};
    this.id = opts.id ?? null;
    this.counted = opts.counted ?? false;
  }
}

/** A JSON answer; nothing when the headers are already out (a stream that failed midway). */
export function sendJson(
  res: ServerResponse,
  status: number,
  body: unknown,
  headers: Record<string, string | string[]> = {},
): void {
  if (res.headersSent) return;
  res.writeHead(status, { "content-type": "application/json", ...headers });
  res.end(JSON.stringify(body));
}

/** The whole body, refused with 413 once it passes `limit` bytes (declared or sent). */
export async function readBody(req: IncomingMessage, limit: number): Promise<Buffer> {
  const tooBig = () => new HttpError(413, `request body over ${limit} bytes`);
  if (Number(req.headers["content-length"] ?? "0") > limit) throw tooBig();
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > limit) throw tooBig();
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks);
}

/** A JSON body (content-type application/json, at most `limit` bytes; empty reads as {}). */
export async function readJsonBody(req: IncomingMessage, limit: number): Promise<any> {
  if (!/^application\/json\b/i.test(req.headers["content-type"] ?? ""))
    throw new HttpError(415, "send JSON (content-type: application/json)");
  const raw = await readBody(req, limit);
  try {
    return JSON.parse(raw.toString("utf8") || "{}");
  } catch {
    throw new HttpError(400, "the body is not valid JSON");
  }
}

/**
 * Every `everyMs`, drops the sessions `expired` says are done (idle, or past their end) through
 * `drop`, and runs `also` (other periodic tidying). Returns the stop function. Unref'd: a sweep
 * never keeps the process alive.
 */
export function sweepSessions<S>(
  sessions: Map<string, S>,
  opts: {
    everyMs: number;
    expired: (s: S, now: number) => boolean;
    drop: (id: string, s: S) => void;
    also?: (now: number) => void;
  },
): () => void {
  const timer = setInterval(() => {
    const now = Date.now();
    for (const [id, s] of [...sessions]) if (opts.expired(s, now)) opts.drop(id, s);
    opts.also?.(now);
  }, opts.everyMs);
  timer.unref();
  return () => clearInterval(timer);
}
