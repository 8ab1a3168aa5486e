// Policy errors: one catalogue of stable codes, each with a one-line doc. The server's error
// catalogue includes POLICY_ERROR_CODES; a test keeps codes and docs in sync.

export const POLICY_ERROR_CODES = {
  insufficient_scope:
    "The principal lacks the scope this tool needs (details.required_scope); ask for a token with it.",
  insufficient_memory:
    "The estimated memory does not fit the device; details.suggestion says what would (smaller dtype, unloading models).",
  approval_required:
    "A human must approve this exact call: ask an operator to approve it in the console or with `node bin/tpu-mcp.js approvals approve <approval_id> --config <the server's config>`, then call again with approval_id.",
  approval_declined:
    "The user declined (or cancelled) the approval prompt; do not retry unchanged.",
  approval_not_found: "No approval has this id; request a new one by calling without approval_id.",
  approval_pending: "The approval has not been decided yet; wait for the operator, then retry.",
  approval_denied: "An operator denied this approval; do not retry unchanged.",
  approval_expired:
    "The approval expired before it was used; call without approval_id to request a new one.",
  approval_used: "The approval was already used (approvals are single-use); request a new one.",
  approval_mismatch:
    "The approval was granted for another principal, tool or arguments; it only covers the exact call it was requested for.",
  approval_self_grant:
    "An approval must be decided by a different identity than the one that requested it.",
  approval_already_decided: "The approval was already approved or denied; decisions are final.",
  approval_limit:
    "The principal already has approvals.max_pending_per_principal requests waiting; new ones are refused (the waiting ones are kept) until one is decided or expires.",
  rate_limited: "Too many calls from this principal; retry after details.retry_after_ms.",
  budget_exceeded:
    "The principal's device-seconds budget for the window is spent; details give remaining seconds and when budget frees up.",
  busy: "Too many calls are waiting for this tool or device; retry after details.retry_after_ms.",
  timeout:
    "The call ran past its time limit and was cancelled; use smaller inputs or fewer iterations.",
  cancelled: "The caller cancelled the call before it finished.",
  invalid_arguments:
    "The arguments cannot be digested (non-finite number, cycle or unsupported value).",
} as const;

export type PolicyErrorCode = keyof typeof POLICY_ERROR_CODES;

/** Codes whose cause goes away with time: the caller may retry the same call later. */
export const RECOVERABLE_POLICY_CODES: ReadonlySet<PolicyErrorCode> = new Set<PolicyErrorCode>([
  "approval_pending",
  "approval_limit",
  "rate_limited",
  "budget_exceeded",
  "busy",
  "timeout",
]);

export class PolicyError extends Error {
  readonly code: PolicyErrorCode;
  readonly details: Record<string, unknown>;
  readonly recoverable: boolean;
  constructor(code: PolicyErrorCode, message: string, details: Record<string, unknown> = {}) {
    super(message);
    this.name = "PolicyError";
    this.code = code;
    this.details = details;
    this.recoverable = RECOVERABLE_POLICY_CODES.has(code);
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
