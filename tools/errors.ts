// How a tool reports failure: ToolError, and the mapping of anything thrown to one. The codes and
// their docs are the one catalogue in policies/errors.ts (policies/ raises them too).
import { ERROR_CATALOGUE, isErrorCode, type ErrorCode } from "../policies/errors.js";

export { ERROR_CATALOGUE, isErrorCode, type ErrorCode } from "../policies/errors.js";

/** A failure a tool reports as an `isError` result (never a protocol fault). */
export class ToolError extends Error {
  readonly code: ErrorCode;
  readonly details?: Record<string, unknown>;
  constructor(code: ErrorCode, message: string, details?: Record<string, unknown>) {
    super(message);
    this.name = "ToolError";
    this.code = code;
    this.details = details;
  }
  get recoverable(): boolean {
    return ERROR_CATALOGUE[this.code].recoverable;
  }
}

// Paths and stack frames never leave the server: strip anything that looks like one, except the
// parts the server composed to be used as written (`verbatim`: an approval's command and link).
const PATH_RE = /(?:\/[\w.@+-]+){2,}\/?/g;
export function scrubMessage(message: string, verbatim: readonly string[] = []): string {
  const line = message.split("\n")[0];
  const keep = verbatim.filter((v) => v.length > 0 && !v.includes("\n") && line.includes(v));
  let out = "";
  let rest = line;
  while (rest.length > 0) {
    // The earliest verbatim part (the longest of those starting there) passes as it is.
    let at = -1;
    let part = "";
    for (const v of keep) {
      const i = rest.indexOf(v);
      if (i >= 0 && (at < 0 || i < at || (i === at && v.length > part.length))) {
        at = i;
        part = v;
      }
    }
    if (at < 0) {
      out += rest.replace(PATH_RE, "<path>");
      break;
    }
    out += rest.slice(0, at).replace(PATH_RE, "<path>") + part;
    rest = rest.slice(at + part.length);
  }
  return out.slice(0, 1000);
}

/** Maps any thrown value to a ToolError; unknown ones become `internal` with no details. */
export function toToolError(e: unknown): ToolError {
  if (e instanceof ToolError) return e;
  const err = e as {
    code?: unknown;
    message?: unknown;
    details?: unknown;
    verbatim?: unknown;
  } | null;
  const code = err?.code;
  if (err && typeof code === "string" && isErrorCode(code)) {
    const details =
      err.details && typeof err.details === "object"
        ? (err.details as Record<string, unknown>)
        : undefined;
    const verbatim = Array.isArray(err.verbatim)
      ? err.verbatim.filter((v): v is string => typeof v === "string")
      : [];
    return new ToolError(code, scrubMessage(String(err.message ?? code), verbatim), details);
  }
  return new ToolError(
    "internal",
    "internal error: the server log has the details; the call may be retried",
  );
}
