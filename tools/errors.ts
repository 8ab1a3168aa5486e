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

// Paths and stack frames never leave the server: strip anything that looks like one.
const PATH_RE = /(?:\/[\w.@+-]+){2,}\/?/g;
export function scrubMessage(message: string): string {
  return message.replace(PATH_RE, "<path>").split("\n")[0].slice(0, 1000);
}

/** Maps any thrown value to a ToolError; unknown ones become `internal` with no details. */
export function toToolError(e: unknown): ToolError {
  if (e instanceof ToolError) return e;
  const err = e as { code?: unknown; message?: unknown; details?: unknown } | null;
  const code = err?.code;
  if (err && typeof code === "string" && isErrorCode(code)) {
    const details =
      err.details && typeof err.details === "object"
        ? (err.details as Record<string, unknown>)
        : undefined;
    return new ToolError(code, scrubMessage(String(err.message ?? code)), details);
  }
  return new ToolError(
    "internal",
    "internal error: the server log has the details; the call may be retried",
  );
}
