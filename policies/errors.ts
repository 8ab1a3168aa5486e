// THE error catalogue: every stable code a tool result, a policy refusal or the worker can carry,
// with its one-line doc, whether calling again can succeed, and the HTTP status it maps to. It lives
// here, a leaf module, because both policies/ and tools/ read it and policies/ may import nothing
// from tools/. Codes are public API (clients branch on them); README's "Errors" table is checked
// against this list, and the worker's tpu_worker/errors.py against `recoverable`, by tests.

export interface ErrorDoc {
  /**
   * Whether calling again can succeed: after waiting, or after the fix the doc names (approve,
   * unload, another dtype...). Not "the cause goes away by itself": an agent reads this to decide
   * between retrying (possibly changed) and giving up, and for both kinds retrying is right.
   */
  recoverable: boolean;
  /** The status an HTTP surface answers with when it refuses with this code (httpStatusOf). */
  http: number;
  doc: string;
}

export const ERROR_CATALOGUE = {
  invalid_argument: {
    recoverable: true,
    http: 400,
    doc: "An argument failed validation; the message names the field and the bound.",
  },
  response_format_refused: {
    recoverable: true,
    http: 422,
    doc: "The response_format (structured output) was refused: the schema is too large or too deep, an enum or regex too long, a keyword unsupported, or its grammar did not compile in time; the message says what to change.",
  },
  recompile_after_load: {
    recoverable: false,
    http: 500,
    doc: "A generation ran an op at a shape the model's load did not warm (a compile after warm-up on an eager TPU backend, or a graph recompile), and its catalog entry sets `shapes.strict: true`, which refuses that; the message names the op and shapes. Set `shapes.strict: false` to serve it (counted in `recompiles_since_load`) and report the shape.",
  },
  unknown_model: {
    recoverable: true,
    http: 404,
    doc: "The model id is not in the catalog; call list_models for the ids.",
  },
  model_not_loaded: {
    recoverable: true,
    http: 409,
    doc: "The model is not loaded (or was lost in a worker restart); call load_model first.",
  },
  model_already_loaded: {
    recoverable: true,
    http: 409,
    doc: "The model is already loaded; unload_model it first to change device, dtype or mode.",
  },
  // Recoverable (the policy list said no): the refusal names a smaller dtype or the models to
  // unload, and the same call succeeds once that is done.
  insufficient_memory: {
    recoverable: true,
    http: 507,
    doc: "The estimate does not fit in free device memory; the message says which dtype would fit or what to unload.",
  },
  out_of_memory: {
    recoverable: true,
    http: 507,
    doc: "The device ran out of memory while running; use a smaller batch or dtype.",
  },
  unsafe_weights: {
    recoverable: false,
    http: 422,
    doc: "The weights are in a pickle-based format (or malformed) and the catalog entry is not marked trusted.",
  },
  path_outside_roots: {
    recoverable: false,
    http: 403,
    doc: "The catalog entry's path resolves outside the configured model roots.",
  },
  weights_missing: {
    recoverable: false,
    http: 500,
    doc: "The catalog entry's weight files are missing; run the set-up or fix the catalog.",
  },
  weights_too_large: {
    recoverable: false,
    http: 413,
    doc: "The weights exceed the loader's limits (header size, tensor count or bytes).",
  },
  unsupported_device: {
    recoverable: true,
    http: 400,
    doc: "The requested device is not available in this runtime; get_runtime_status lists devices.",
  },
  unsupported_dtype: {
    recoverable: true,
    http: 400,
    doc: "The dtype is not allowed for this model; list_models shows the allowed dtypes.",
  },
  insufficient_scope: {
    recoverable: false,
    http: 403,
    doc: "The principal lacks the scope this tool needs; ask an administrator.",
  },
  // Recoverable (the policy list said no): once an operator approves, the same call with
  // approval_id succeeds; that is the whole point of the code.
  approval_required: {
    recoverable: true,
    http: 403,
    doc: "A human must approve this exact call (also when nobody answered an in-band prompt): in the console (`details.console_url`) or with `details.approve_command`; then call again with its approval_id.",
  },
  approval_pending: {
    recoverable: true,
    http: 409,
    doc: "The approval has not been decided yet; wait for the operator and call again.",
  },
  approval_not_found: {
    recoverable: false,
    http: 404,
    doc: "No approval with that id exists for you; drop approval_id to request a new one.",
  },
  approval_denied: {
    recoverable: false,
    http: 403,
    doc: "The operator denied this approval; do not retry the same call.",
  },
  // Recoverable (the policy list said no): calling again without approval_id requests a fresh
  // approval, after which the call can run. Denied and declined stay final: a human said no.
  approval_expired: {
    recoverable: true,
    http: 410,
    doc: "The approval expired before use; call again without approval_id to request a new one.",
  },
  // Recoverable (the policy list said no), for the same reason as approval_expired.
  approval_used: {
    recoverable: true,
    http: 410,
    doc: "The approval was already used once; approvals are single-use, request a new one.",
  },
  approval_mismatch: {
    recoverable: false,
    http: 403,
    doc: "The approval was granted for a different tool, principal or arguments; request one for this call.",
  },
  invalid_request_state: {
    recoverable: true,
    http: 400,
    doc: "The requestState of an in-band approval retry was altered, expired, replayed, or issued to another principal or call; call again without it to be asked again.",
  },
  approval_declined: {
    recoverable: false,
    http: 403,
    doc: "The user declined (or dismissed) the approval prompt; the approval is recorded as denied. A prompt nobody answered is approval_required instead.",
  },
  approval_self_grant: {
    recoverable: false,
    http: 403,
    doc: "An approval cannot be granted by the identity that requested it.",
  },
  approval_already_decided: {
    recoverable: false,
    http: 409,
    doc: "The approval was already approved or denied; decisions are final.",
  },
  // For the operator, not the agent: a token (CLI, API, token console session) cannot decide an
  // approval whose rule says `"assurance": "passkey"`; the message names the console's address.
  approval_needs_passkey: {
    recoverable: false,
    http: 403,
    doc: "The rule requires a passkey-signed decision; approve or deny it in the operator console with a passkey, not with a token or the CLI.",
  },
  passkey_refused: {
    recoverable: false,
    http: 403,
    doc: "A passkey ceremony was refused (a challenge for another call or already used, no user verification, a signature counter that went back, an unknown credential, an enrolment code used or expired); the message says which.",
  },
  approval_limit: {
    // Refused, not queued: the waiting requests are kept, so one being decided or expiring
    // makes room; retry_after_ms says when the soonest expires.
    recoverable: true,
    http: 429,
    doc: "Too many of this principal's approval requests are waiting; this one was refused (the waiting ones are kept). Wait until one is decided or expires (retry_after_ms).",
  },
  rate_limited: {
    recoverable: true,
    http: 429,
    doc: "Too many calls in a short time; wait retry_after_ms and call again.",
  },
  // Recoverable (the policy list said no): the suspension ends at its time or when an operator
  // resumes the principal, and the same call then succeeds.
  principal_suspended: {
    recoverable: true,
    http: 403,
    doc: "An alert rule suspended this principal (e.g. a flood of refused calls); every call is refused and running ones were stopped. The message says why and how it ends: at details.until, or when an operator runs `tpu-mcp principals resume ID`.",
  },
  budget_exceeded: {
    recoverable: true,
    http: 429,
    doc: "The device-seconds budget (or read allowance) is spent: refused before the call, or stopped while it ran (details.stopped_after_s); wait for the window or make the call smaller.",
  },
  storage_exceeded: {
    recoverable: true,
    http: 429,
    doc: "A fine-tune's keep would take the principal's kept results over kept.max_bytes_per_principal; run without keep, wait for a kept result to expire (kept.ttl_s), or ask the operator to raise the bound.",
  },
  approval_overrun: {
    recoverable: true,
    http: 429,
    doc: "An approved call ran past its approved estimate times approvals.overrun_factor and was stopped (details.stopped_after_s, estimated_s); a benchmark answers its partial report marked stopped: approval. Ask for a new approval for a smaller call.",
  },
  busy: {
    recoverable: true,
    http: 503,
    doc: "The queue for this tool or device is full; wait retry_after_ms and call again.",
  },
  timeout: {
    recoverable: true,
    http: 504,
    doc: 'The call ran past call_timeout_s and was stopped in the worker; a benchmark answers with its partial report marked stopped: "timeout" instead.',
  },
  // Recoverable (the policy list said no): nothing is wrong with the call, its caller stopped
  // it; the worker (tpu_worker/errors.py) says the same. 499: "client closed request" (nginx).
  cancelled: { recoverable: true, http: 499, doc: "The call was cancelled by the client." },
  worker_died: {
    recoverable: true,
    http: 503,
    doc: "The worker process died during the call; it restarts by itself, loaded models must be loaded again.",
  },
  // Recoverable (the policy list said no): a crashed engine is restarted by the worker, and a
  // missing one is set up once (scripts/setup-vllm.sh); the same call then succeeds.
  engine_unavailable: {
    recoverable: true,
    http: 503,
    doc: "The model's engine (vLLM) is not serving: it is restarting after a crash (call again shortly) or is not set up (`scripts/setup-vllm.sh`, docs/vllm.md); get_runtime_status shows its health.",
  },
  runtime_setting_up: {
    recoverable: true,
    http: 503,
    doc: "An installed package is making its Python environment and model files (first start only, a few minutes); the message says what it is doing and how far it is. Call again in a minute; get_runtime_status shows the progress, `tpu-mcp setup` in a terminal shows it live.",
  },
  worker_unavailable: {
    recoverable: false,
    http: 503,
    doc: "The worker cannot be started (crash loop or set-up problem); run `tpu-mcp doctor`.",
  },
  job_not_found: { recoverable: false, http: 404, doc: "No job with that id exists for you." },
  output_not_found: {
    recoverable: false,
    http: 404,
    doc: "The stored output expired or never existed; run the inference again.",
  },
  invalid_request: {
    recoverable: false,
    http: 400,
    doc: "The MCP request contradicts itself or its protocol era (an Mcp-Method or Mcp-Name header that differs from the body, a 2026-07-28 request without its protocol version); fix the client or the proxy in between.",
  },
  protocol_error: {
    recoverable: true,
    http: 502,
    doc: "The worker and server disagreed on the wire; the call may be retried.",
  },
  internal: {
    recoverable: true,
    http: 500,
    doc: "An unexpected failure; details are in the server log, never in the answer.",
  },
} as const satisfies Record<string, ErrorDoc>;

export type ErrorCode = keyof typeof ERROR_CATALOGUE;

export function isErrorCode(code: string): code is ErrorCode {
  return Object.hasOwn(ERROR_CATALOGUE, code);
}

/** The HTTP status of a refusal with `code`: the catalogue's, the one mapping every surface uses. */
export function httpStatusOf(code: string): number {
  return isErrorCode(code) ? ERROR_CATALOGUE[code].http : 500;
}

/** The codes the policy layer raises (a subset of the catalogue, checked by the compiler). */
export const POLICY_ERROR_CODES = [
  "insufficient_scope",
  "insufficient_memory",
  "approval_required",
  "approval_declined",
  "invalid_request_state",
  "approval_not_found",
  "approval_pending",
  "approval_denied",
  "approval_expired",
  "approval_used",
  "approval_mismatch",
  "approval_self_grant",
  "approval_already_decided",
  "approval_needs_passkey",
  "passkey_refused",
  "approval_limit",
  "rate_limited",
  "principal_suspended",
  "budget_exceeded",
  "approval_overrun",
  "busy",
  "timeout",
  "cancelled",
  // Values the audit digest cannot take (non-finite number, cycle, unsupported value).
  "invalid_argument",
] as const satisfies readonly ErrorCode[];

export type PolicyErrorCode = (typeof POLICY_ERROR_CODES)[number];

export class PolicyError extends Error {
  readonly code: PolicyErrorCode;
  readonly details: Record<string, unknown>;
  /**
   * Parts of the message the server composed to be used as written (the command an operator
   * runs, the console link): the path scrub of a tool's answer (tools/errors.ts) leaves them.
   */
  readonly verbatim: readonly string[];
  constructor(
    code: PolicyErrorCode,
    message: string,
    details: Record<string, unknown> = {},
    verbatim: readonly string[] = [],
  ) {
    super(message);
    this.name = "PolicyError";
    this.code = code;
    this.details = details;
    this.verbatim = verbatim;
  }

  toJSON(): { code: PolicyErrorCode; message: string; details: Record<string, unknown> } {
    return { code: this.code, message: this.message, details: this.details };
  }
}

export function isPolicyError(e: unknown): e is PolicyError {
  return e instanceof PolicyError;
}

/** Authentication failures (HTTP 401 + WWW-Authenticate), apart from policy refusals. */
export const AUTH_ERROR_CODES = {
  invalid_token: "The bearer token is missing, unknown, malformed or not meant for this server.",
  token_expired: "The bearer token has expired; obtain a new one.",
} as const;

export type AuthErrorCode = keyof typeof AUTH_ERROR_CODES;

export class AuthError extends Error {
  readonly status = 401 as const;
  readonly code: AuthErrorCode;
  readonly description: string;
  constructor(code: AuthErrorCode, description: string) {
    super(description);
    this.name = "AuthError";
    this.code = code;
    this.description = description;
  }

  /** RFC 6750 challenge value; quotes in the description are stripped to keep the header valid. */
  wwwAuthenticate(realm = "tpu-mcp"): string {
    const desc = this.description.replace(/["\\]/g, "'");
    return `Bearer realm="${realm}", error="${this.code}", error_description="${desc}"`;
  }
}
