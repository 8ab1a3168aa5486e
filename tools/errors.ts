// The one catalogue of error codes a tool result can carry. Codes are part of the public API:
// clients branch on them. docs/errors.md's table is checked against this list by a test.

export interface ErrorDoc {
  /** Whether calling again (after waiting, or after the fix the message names) can succeed. */
  recoverable: boolean;
  doc: string;
}

export const ERROR_CATALOGUE = {
  invalid_argument: {
    recoverable: true,
    doc: "An argument failed validation; the message names the field and the bound.",
  },
  unknown_model: {
    recoverable: true,
    doc: "The model id is not in the catalog; call list_models for the ids.",
  },
  model_not_loaded: {
    recoverable: true,
    doc: "The model is not loaded (or was lost in a worker restart); call load_model first.",
  },
  model_already_loaded: {
    recoverable: true,
    doc: "The model is already loaded; unload_model it first to change device, dtype or mode.",
  },
  insufficient_memory: {
    recoverable: true,
    doc: "The estimate does not fit in free device memory; the message says which dtype would fit or what to unload.",
  },
  out_of_memory: {
    recoverable: true,
    doc: "The device ran out of memory while running; use a smaller batch or dtype.",
  },
  unsafe_weights: {
    recoverable: false,
    doc: "The weights are in a pickle-based format (or malformed) and the catalog entry is not marked trusted.",
  },
  path_outside_roots: {
    recoverable: false,
    doc: "The catalog entry's path resolves outside the configured model roots.",
  },
  weights_missing: {
    recoverable: false,
    doc: "The catalog entry's weight files are missing; run the set-up or fix the catalog.",
  },
  weights_too_large: {
    recoverable: false,
    doc: "The weights exceed the loader's limits (header size, tensor count or bytes).",
  },
  unsupported_device: {
    recoverable: true,
    doc: "The requested device is not available in this runtime; get_runtime_status lists devices.",
  },
  unsupported_dtype: {
    recoverable: true,
    doc: "The dtype is not allowed for this model; list_models shows the allowed dtypes.",
  },
  insufficient_scope: {
    recoverable: false,
    doc: "The principal lacks the scope this tool needs; ask an administrator.",
  },
  approval_required: {
    recoverable: true,
    doc: "A human must approve this exact call; an operator approves it in the console or with `node bin/tpu-mcp.js approvals approve <id> --config <the server's config>`, then call again with approval_id.",
  },
  approval_pending: {
    recoverable: true,
    doc: "The approval has not been decided yet; wait for the operator and call again.",
  },
  approval_not_found: {
    recoverable: false,
    doc: "No approval with that id exists for you; drop approval_id to request a new one.",
  },
  approval_denied: {
    recoverable: false,
    doc: "The operator denied this approval; do not retry the same call.",
  },
  approval_expired: {
    recoverable: true,
    doc: "The approval expired before use; call again without approval_id to request a new one.",
  },
  approval_used: {
    recoverable: true,
    doc: "The approval was already used once; approvals are single-use, request a new one.",
  },
  approval_mismatch: {
    recoverable: false,
    doc: "The approval was granted for a different tool, principal or arguments; request one for this call.",
  },
  approval_declined: {
    recoverable: false,
    doc: "The user declined (or cancelled) the approval prompt.",
  },
  approval_self_grant: {
    recoverable: false,
    doc: "An approval cannot be granted by the identity that requested it.",
  },
  approval_already_decided: {
    recoverable: false,
    doc: "The approval was already approved or denied; decisions are final.",
  },
  approval_limit: {
    recoverable: true,
    doc: "Too many of this principal's approval requests are waiting; this one was refused (the waiting ones are kept). Wait until one is decided or expires (retry_after_ms).",
  },
  rate_limited: {
    recoverable: true,
    doc: "Too many calls in a short time; wait retry_after_ms and call again.",
  },
  budget_exceeded: {
    recoverable: true,
    doc: "The device-seconds budget for the window is spent; wait for the window to reset.",
  },
  busy: {
    recoverable: true,
    doc: "The queue for this tool or device is full; wait retry_after_ms and call again.",
  },
  timeout: {
    recoverable: true,
    doc: "The call ran past its time limit and was cancelled in the worker.",
  },
  cancelled: { recoverable: true, doc: "The call was cancelled by the client." },
  worker_died: {
    recoverable: true,
    doc: "The worker process died during the call; it restarts by itself, loaded models must be loaded again.",
  },
  worker_unavailable: {
    recoverable: false,
    doc: "The worker cannot be started (crash loop or set-up problem); run `tpu-mcp doctor`.",
  },
  job_not_found: { recoverable: false, doc: "No job with that id exists for you." },
  output_not_found: {
    recoverable: false,
    doc: "The stored output expired or never existed; run the inference again.",
  },
  protocol_error: {
    recoverable: true,
    doc: "The worker and server disagreed on the wire; the call may be retried.",
  },
  internal: {
    recoverable: true,
    doc: "An unexpected failure; details are in the server log, never in the answer.",
  },
} as const satisfies Record<string, ErrorDoc>;

export type ErrorCode = keyof typeof ERROR_CATALOGUE;

export function isErrorCode(code: string): code is ErrorCode {
  return Object.hasOwn(ERROR_CATALOGUE, code);
}

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
  // The policy layer says invalid_arguments for values it cannot digest; one code for clients.
  const code = err && err.code === "invalid_arguments" ? "invalid_argument" : err?.code;
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
