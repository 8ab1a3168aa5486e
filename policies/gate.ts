// THE gate every tool call passes. Order (cheapest and most certain refusals first):
//   scope → rate limit → estimate → memory fit → budget → approval → budget check + reserve
//   (one synchronous step) → concurrency slot → timeout → fn → settle (measured charge) → audit.
// Every refusal is audited with its code; every executed call is audited with its duration.

import type { ApprovalRecord, ApprovalStore } from "./approvals.js";
import {
  redactArgs,
  type AuditLog,
  type AuditOutcome,
  type AuditRecord,
  type PolicyLogger,
} from "./audit.js";
import { systemClock, type Clock } from "./clock.js";
import { toolTimeoutMs, type ApprovalRule, type PolicyConfig } from "./config.js";
import { argsDigest } from "./digest.js";
import { PolicyError, isPolicyError, type PolicyErrorCode } from "./errors.js";
import { formatBytes, type CostEstimate } from "./estimate.js";
import type { BudgetLedger, ConcurrencyLimiter, RateLimiter, Release } from "./limits.js";
import { canCall, hasScope, requiredScope, type Principal, type Scope } from "./scopes.js";
import { toolPolicyMap, type ToolPolicy } from "./tool_policy.js";

/** Read-scoped tools that use the device draw on a small allowance of their own as well. */
const READ_SCOPE: Scope = "models:read";
const READ_KEY_SUFFIX = "\u0000read";

/** The deadline of one admitted call, handed down to the runtime as its request timeout. */
export interface CallDeadline {
  /** Epoch ms at which the gate cancels the call. */
  at: number;
  remainingMs(): number;
}

export type ElicitAnswer = "accept" | "decline" | "cancel";

export interface ElicitPrompt {
  tool: string;
  args_preview: unknown;
  estimate: CostEstimate | null;
  message: string;
}

export interface GateCall {
  principal: Principal;
  tool: string;
  /** Validated tool arguments, including the optional approval_id. */
  args: Record<string, unknown>;
  /** Target device ("tpu", "cuda:1", "cpu"); device-bound tools take its lane. */
  device?: string;
  estimate?: CostEstimate;
  /** Makes the estimate once the caller is admitted (scope, rate); used when `estimate` is absent. */
  estimator?: () => Promise<CostEstimate | undefined>;
  signal?: AbortSignal;
  /** Present only when the client supports MCP elicitation. */
  elicit?: (prompt: ElicitPrompt) => Promise<ElicitAnswer>;
  /** Where the call ran (the worker of a pool), read when its outcome is audited. */
  ranOn?: () => string | undefined;
  /** Stamps for the bench's decomposition (tools/support/trace.ts); absent unless tracing. */
  trace?: { mark(stage: string): void };
}

export interface GateDeps {
  config: PolicyConfig;
  /** Every tool's record (scope, run-while-recording, ...); a tool without one needs admin. */
  tools: readonly ToolPolicy[];
  approvals: ApprovalStore;
  audit: AuditLog;
  limiter: ConcurrencyLimiter;
  rateLimiter: RateLimiter;
  budget: BudgetLedger;
  clock?: Clock;
  logger: PolicyLogger;
}

/** Does `rule` apply? Thresholds: ANY met is enough; with no estimate a threshold counts as met. */
export function ruleApplies(
  rule: ApprovalRule,
  principalId: string,
  tool: string,
  estimate: CostEstimate | undefined,
): boolean {
  if (rule.tool !== "*" && rule.tool !== tool) return false;
  if (rule.principals && !rule.principals.includes(principalId)) return false;
  const w = rule.when;
  if (!w) return true;
  const checks: [number | undefined, keyof CostEstimate][] = [
    [w.min_weight_bytes, "weight_bytes"],
    [w.min_device_seconds, "device_seconds"],
    [w.min_memory_bytes, "memory_bytes"],
  ];
  const set = checks.filter(([min]) => min !== undefined);
  if (set.length === 0) return true;
  // Without an estimate we cannot show the call is cheap, so it needs approval.
  if (!estimate) return true;
  return set.some(([min, key]) => (estimate[key] as number) >= (min as number));
}

export function matchApprovalRule(
  rules: readonly ApprovalRule[],
  principalId: string,
  tool: string,
  estimate: CostEstimate | undefined,
): ApprovalRule | undefined {
  return rules.find((r) => ruleApplies(r, principalId, tool, estimate));
}

function describeRule(rule: ApprovalRule): string {
  const w = rule.when ?? {};
  const parts = [
    w.min_weight_bytes !== undefined ? `weights ≥ ${formatBytes(w.min_weight_bytes)}` : null,
    w.min_device_seconds !== undefined ? `device time ≥ ${w.min_device_seconds} s` : null,
    w.min_memory_bytes !== undefined ? `memory ≥ ${formatBytes(w.min_memory_bytes)}` : null,
  ].filter(Boolean);
  return parts.length ? `${rule.tool} when ${parts.join(" or ")}` : `every ${rule.tool} call`;
}

function describeEstimate(e: CostEstimate | undefined | null): string {
  if (!e) return "no estimate";
  return `~${e.device_seconds} device-seconds, ${formatBytes(e.memory_bytes)} memory${e.compile_s ? `, ${e.compile_s} s compile` : ""}`;
}

const OUTCOME_FOR_CODE: Partial<Record<PolicyErrorCode, AuditOutcome>> = {
  approval_required: "approval_requested",
  approval_expired: "approval_expired",
  approval_declined: "approval_denied",
};

export interface DecideApprovalDeps {
  approvals: ApprovalStore;
  audit: AuditLog;
  clock?: Clock;
}

/**
 * An operator's decision (the CLI calls this, directly or through Gate). The approver needs
 * approvals:grant and must not be the requester; both refusals are audited.
 */
export function decideApproval(
  deps: DecideApprovalDeps,
  id: string,
  approver: Principal,
  decision: "approve" | "deny",
  reason?: string,
): ApprovalRecord {
  const now = (deps.clock ?? systemClock)();
  const existing = deps.approvals.get(id);
  const base = {
    time: new Date(now).toISOString(),
    principal: approver.id,
    tool: existing?.tool ?? "approvals",
    args_digest: existing?.args_digest ?? null,
    approval_id: id,
    approver: approver.id,
  };
  try {
    if (!hasScope(approver, "approvals:grant")) {
      throw new PolicyError(
        "insufficient_scope",
        `${approver.id} lacks the approvals:grant scope needed to decide approvals.`,
        { required_scope: "approvals:grant" },
      );
    }
    const rec =
      decision === "approve"
        ? deps.approvals.approve(id, approver.id)
        : deps.approvals.deny(id, approver.id, reason);
    deps.audit.append({
      ...base,
      estimate: rec.estimate,
      outcome: decision === "approve" ? "approval_granted" : "approval_denied",
      reason:
        reason ??
        (decision === "approve" ? `approved for ${rec.principal}` : `denied for ${rec.principal}`),
    });
    return rec;
  } catch (e) {
    if (isPolicyError(e)) {
      deps.audit.append({ ...base, outcome: "denied", code: e.code, reason: e.message });
    }
    throw e;
  }
}

export class Gate {
  private readonly config: PolicyConfig;
  private readonly deps: GateDeps;
  private readonly clock: Clock;
  private readonly tools: ReadonlyMap<string, ToolPolicy>;
  /**
   * Estimated device-seconds admitted but not yet settled, per budget line. Reserved at
   * admission (before waiting for a slot), released when the call settles with its measured
   * cost, or at once when it is refused or cancelled.
   */
  private readonly reserved = new Map<string, number>();

  constructor(deps: GateDeps) {
    this.deps = deps;
    this.config = deps.config;
    this.clock = deps.clock ?? systemClock;
    this.tools = toolPolicyMap(deps.tools);
  }

  decideApproval(
    id: string,
    approver: Principal,
    decision: "approve" | "deny",
    reason?: string,
  ): ApprovalRecord {
    return decideApproval(this.deps, id, approver, decision, reason);
  }

  /** The rule that makes this call need approval, if any (for tool descriptions and dry runs). */
  approvalRule(
    principal: Principal,
    tool: string,
    estimate?: CostEstimate,
  ): ApprovalRule | undefined {
    return matchApprovalRule(this.config.approvals.rules, principal.id, tool, estimate);
  }

  private audit(rec: Omit<AuditRecord, "time">): void {
    try {
      this.deps.audit.append({ time: new Date(this.clock()).toISOString(), ...rec });
    } catch (e) {
      // The decision already stands; losing its record must be loud, not fatal to the caller.
      this.deps.logger.error({ err: String(e), audit: rec }, "audit append failed");
    }
  }

  /**
   * The one scope enforcer: tools/list (via canCall), the HTTP 403 pre-check and every call go
   * through it. A refusal is audited here and thrown as insufficient_scope.
   */
  enforceScope(principal: Principal, tool: string, via?: string): void {
    try {
      this.checkScope(principal, tool);
    } catch (e) {
      if (isPolicyError(e)) {
        this.audit({
          principal: principal.id,
          tool,
          args_digest: null,
          outcome: "denied",
          code: e.code,
          reason: via ? `${e.message} (${via})` : e.message,
        });
      }
      throw e;
    }
  }

  /**
   * A call refused before the gate could run it (invalid arguments, unknown model, a per-model
   * bound): audited with the digest of what was sent (never the arguments) and counted against
   * the caller's rate limit, so malformed calls cannot be sent for free. Throws rate_limited
   * instead when the caller is over its rate.
   */
  refuse(
    principal: Principal,
    tool: string,
    rawArgs: unknown,
    code: string,
    message: string,
  ): void {
    let digest: string | null = null;
    try {
      digest = argsDigest(tool, rawArgs as Record<string, unknown>);
    } catch {
      digest = null; // unhashable input (non-finite numbers, cycles): recorded without a digest
    }
    const base = { principal: principal.id, tool, args_digest: digest };
    try {
      this.checkRate(principal);
    } catch (e) {
      if (isPolicyError(e))
        this.audit({ ...base, outcome: "denied", code: e.code, reason: e.message });
      throw e;
    }
    this.audit({ ...base, outcome: "denied", code, reason: message.slice(0, 500) });
  }

  async run<T>(
    call: GateCall,
    fn: (signal: AbortSignal, deadline: CallDeadline) => Promise<T>,
  ): Promise<T> {
    const { principal, tool, trace } = call;
    let estimate = call.estimate;
    trace?.mark("g.start");
    const redacted = redactArgs(call.args, this.config.audit.redact_args);
    const base = () => ({
      principal: principal.id,
      tool,
      args: redacted,
      estimate: estimate ?? null,
    });
    let digest: string | null = null;
    let approvalId: string | undefined;
    let release: Release | undefined;
    let reservation: (() => void) | undefined;

    try {
      digest = argsDigest(tool, call.args);
      trace?.mark("g.digest");
      this.checkScope(principal, tool);
      // Every call counts against the rate, refused or not, before anything costs work.
      this.checkRate(principal);
      trace?.mark("g.rate");
      // Only an admitted caller makes the estimate (which may ask the worker for free memory).
      if (!estimate && call.estimator) estimate = await call.estimator();
      trace?.mark("g.estimate");
      this.checkFits(estimate);
      // A call the budget cannot take now never becomes an approval request.
      this.checkBudget(principal, tool, estimate);
      approvalId = await this.checkApproval({ ...call, estimate }, digest, redacted);
      trace?.mark("g.approval");
      // Check and reserve in one synchronous step: calls queued behind each other cannot all
      // pass a check made before any of them was charged.
      this.checkBudget(principal, tool, estimate);
      reservation = this.reserve(principal.id, tool, estimate);
      trace?.mark("g.budget");
      release = await this.deps.limiter.acquire(tool, call.device, call.signal);
      trace?.mark("g.slot");
      if (approvalId) this.deps.approvals.consume(approvalId, principal.id, tool, digest);
    } catch (e) {
      release?.();
      reservation?.();
      if (isPolicyError(e)) {
        this.audit({
          ...base(),
          args_digest: digest,
          outcome: OUTCOME_FOR_CODE[e.code] ?? "denied",
          code: e.code,
          reason: e.message,
          approval_id: (e.details.approval_id as string | undefined) ?? approvalId,
        });
      }
      throw e;
    }

    let started = this.clock();
    let settled = false;
    const settle = () => {
      if (settled) return;
      settled = true;
      // The slot and the charge follow the real work, which may outlive a timed-out caller.
      release!();
      reservation!();
      if (estimate) this.chargeMeasured(principal.id, tool, (this.clock() - started) / 1000);
    };

    const allowedRecord: AuditRecord = {
      time: new Date(this.clock()).toISOString(),
      ...base(),
      args_digest: digest,
      outcome: "allowed",
      approval_id: approvalId,
    };
    const logAuditFailure = (e: unknown) => {
      this.deps.logger.error(
        { err: String(e), tool, principal: principal.id },
        "audit append failed; call refused",
      );
    };
    // Committed before the work starts, or (the tool's runWhileRecording: its work may start
    // while its "allowed" record commits; the answer still waits for it) alongside it.
    let allowedCommitted: Promise<void> | undefined;
    if (this.tools.get(tool)?.runWhileRecording) {
      allowedCommitted = this.auditDurable(allowedRecord);
      allowedCommitted.catch(() => {}); // observed below, by the abort and before the answer
    } else {
      try {
        await this.auditDurable(allowedRecord);
      } catch (e) {
        // Fail closed: a call that cannot be recorded does not run.
        settle();
        logAuditFailure(e);
        throw e;
      }
    }
    trace?.mark("g.audit_allowed");

    const timeoutMs = toolTimeoutMs(this.config.limits, tool);
    const ctrl = new AbortController();
    const timer = setTimeout(
      () =>
        ctrl.abort(
          new PolicyError(
            "timeout",
            `${tool} ran past its ${timeoutMs / 1000} s limit and was cancelled; use smaller inputs or fewer iterations.`,
            {
              timeout_ms: timeoutMs,
            },
          ),
        ),
      timeoutMs,
    );
    const onCallerAbort = () =>
      ctrl.abort(new PolicyError("cancelled", `${tool} was cancelled by the caller.`));
    if (call.signal?.aborted) onCallerAbort();
    else call.signal?.addEventListener("abort", onCallerAbort, { once: true });

    const aborted = new Promise<never>((_, reject) => {
      if (ctrl.signal.aborted) reject(ctrl.signal.reason);
      else ctrl.signal.addEventListener("abort", () => reject(ctrl.signal.reason), { once: true });
    });
    aborted.catch(() => {});
    // A call whose "allowed" record cannot be committed is cancelled and refused.
    allowedCommitted?.catch((e) => {
      logAuditFailure(e);
      ctrl.abort(e);
    });

    started = this.clock();
    // One deadline per call: what the gate enforces is what the runtime is told to wait for.
    const deadline: CallDeadline = {
      at: started + timeoutMs,
      remainingMs: () => Math.max(1, started + timeoutMs - this.clock()),
    };
    const work = ctrl.signal.aborted
      ? Promise.reject(ctrl.signal.reason)
      : Promise.resolve().then(() => fn(ctrl.signal, deadline));
    work.then(settle, settle);

    try {
      const result = await Promise.race([work, aborted]);
      trace?.mark("g.work_done");
      await allowedCommitted;
      // Committed before the caller gets its answer: no answered call lacks its record.
      await this.auditDurable({
        time: new Date(this.clock()).toISOString(),
        ...base(),
        args_digest: digest,
        worker: call.ranOn?.(),
        outcome: "executed",
        duration_ms: this.clock() - started,
        approval_id: approvalId,
      }).catch((e) =>
        this.deps.logger.error(
          { err: String(e), tool, principal: principal.id },
          "audit append failed",
        ),
      );
      trace?.mark("g.audit_executed");
      return result;
    } catch (e) {
      const code = isPolicyError(e)
        ? e.code
        : ((e as { code?: unknown })?.code as string | undefined);
      this.audit({
        ...base(),
        args_digest: digest,
        worker: call.ranOn?.(),
        outcome: "failed",
        code: typeof code === "string" ? code : "internal_error",
        reason: e instanceof Error ? e.message : String(e),
        duration_ms: this.clock() - started,
        approval_id: approvalId,
      });
      throw e;
    } finally {
      clearTimeout(timer);
      call.signal?.removeEventListener("abort", onCallerAbort);
    }
  }

  /** The budget lines a call is charged to: the principal's, and for read-scoped tools its read allowance. */
  private budgetKeys(principal: string, tool: string): { key: string; limit?: number }[] {
    const keys: { key: string; limit?: number }[] = [{ key: principal }];
    if (requiredScope(this.tools.get(tool)) === READ_SCOPE) {
      keys.push({
        key: `${principal}${READ_KEY_SUFFIX}`,
        limit: this.config.limits.budget.read_device_seconds_per_window,
      });
    }
    return keys;
  }

  /** Holds the estimate against every budget line of the call; the returned function releases it once. */
  private reserve(principal: string, tool: string, estimate: CostEstimate | undefined): () => void {
    const seconds = estimate?.device_seconds ?? 0;
    const keys = this.budgetKeys(principal, tool).map((k) => k.key);
    for (const k of keys) this.adjustReserved(k, seconds);
    let done = false;
    return () => {
      if (done) return;
      done = true;
      for (const k of keys) this.adjustReserved(k, -seconds);
    };
  }

  private chargeMeasured(principal: string, tool: string, seconds: number): void {
    for (const { key } of this.budgetKeys(principal, tool))
      this.deps.budget.charge(key, seconds, tool);
  }

  /** Estimated device-seconds admitted but not yet settled, for a budget line (tests, metrics). */
  reservedSeconds(principal: string): number {
    return this.reserved.get(principal) ?? 0;
  }

  private adjustReserved(key: string, seconds: number): void {
    const v = (this.reserved.get(key) ?? 0) + seconds;
    if (v <= 1e-9) this.reserved.delete(key);
    else this.reserved.set(key, v);
  }

  /** Appends and waits for the commit (group commit when the store offers it). */
  private async auditDurable(rec: AuditRecord): Promise<void> {
    const a = this.deps.audit;
    if (a.appendDurable) await a.appendDurable(rec);
    else a.append(rec);
  }

  private checkScope(principal: Principal, tool: string): void {
    if (!canCall(principal, this.tools.get(tool))) {
      const scope = requiredScope(this.tools.get(tool));
      throw new PolicyError(
        "insufficient_scope",
        `${tool} needs the ${scope} scope, which ${principal.id} does not have; ask for a token that grants it.`,
        { required_scope: scope, tool },
      );
    }
  }

  private checkFits(estimate: CostEstimate | undefined): void {
    if (estimate && estimate.fits === false) {
      throw new PolicyError(
        "insufficient_memory",
        `Not enough device memory: ${estimate.reason ?? "the estimate does not fit"}${estimate.suggestion ? `. Try: ${estimate.suggestion}` : ""}.`,
        { estimate, suggestion: estimate.suggestion ?? null, reason: estimate.reason ?? null },
      );
    }
  }

  /** Returns the approval id to consume once a slot is held, or undefined when none is needed. */
  private async checkApproval(
    call: GateCall,
    digest: string,
    redacted: unknown,
  ): Promise<string | undefined> {
    const { principal, tool, estimate } = call;
    const rule = matchApprovalRule(this.config.approvals.rules, principal.id, tool, estimate);
    if (!rule) return undefined;

    // Only a consumable approval counts. `confirm: true` or any other argument never does.
    const presented = call.args.approval_id;
    if (typeof presented === "string" && presented.length > 0) {
      this.deps.approvals.check(presented, principal.id, tool, digest);
      return presented;
    }

    const cfg = this.config.approvals;
    if (call.elicit && cfg.elicitation) {
      const answer = await this.elicit(call, rule, redacted);
      if (answer !== null) {
        if (answer === "accept") {
          this.audit({
            principal: principal.id,
            tool,
            args_digest: digest,
            args: redacted,
            estimate: estimate ?? null,
            outcome: "approval_granted",
            approver: `elicitation:${principal.id}`,
            reason: `accepted in the client (${describeRule(rule)})`,
          });
          return undefined;
        }
        throw new PolicyError(
          "approval_declined",
          answer === "timeout"
            ? `No answer to the approval prompt within ${cfg.elicitation_timeout_s} s; the call was not run.`
            : `The user ${answer === "decline" ? "declined" : "cancelled"} the approval prompt; the call was not run.`,
          { answer },
        );
      }
    }

    // Out of band: reuse an open request for this exact call rather than piling up new ones.
    const open = this.deps.approvals.findOpen(principal.id, tool, digest);
    const rec =
      open ??
      this.deps.approvals.create({
        principal: principal.id,
        tool,
        args_digest: digest,
        args_preview: redacted,
        estimate: estimate ?? null,
        ttl_s: cfg.ttl_s,
      });
    const message =
      rec.status === "approved"
        ? `This call was already approved (approval ${rec.id}). Call ${tool} again with the same arguments and approval_id "${rec.id}" before ${rec.expires_at}.`
        : `This call needs human approval (rule: ${describeRule(rule)}; estimate: ${describeEstimate(estimate)}). Ask an operator to run \`tpu-mcp approvals approve ${rec.id}\`, then call ${tool} again with the same arguments and approval_id "${rec.id}". The request expires at ${rec.expires_at}.`;
    throw new PolicyError("approval_required", message, {
      approval_id: rec.id,
      tool,
      args: redacted,
      status: rec.status,
      expires_at: rec.expires_at,
      estimate: estimate ?? null,
      message,
    });
  }

  /** The client's answer, "timeout", or null when the prompt could not be shown (fall back to out of band). */
  private async elicit(
    call: GateCall,
    rule: ApprovalRule,
    redacted: unknown,
  ): Promise<ElicitAnswer | "timeout" | null> {
    const timeoutMs = this.config.approvals.elicitation_timeout_s * 1000;
    const message = `${call.principal.id} wants to call ${call.tool} (${describeEstimate(call.estimate)}). Approval is required for ${describeRule(rule)}. Allow this call once?`;
    let timer: ReturnType<typeof setTimeout> | undefined;
    let onAbort: (() => void) | undefined;
    try {
      return await Promise.race([
        call.elicit!({
          tool: call.tool,
          args_preview: redacted,
          estimate: call.estimate ?? null,
          message,
        }),
        new Promise<"timeout">((resolve) => {
          timer = setTimeout(() => resolve("timeout"), timeoutMs);
        }),
        new Promise<never>((_, reject) => {
          onAbort = () =>
            reject(
              new PolicyError(
                "cancelled",
                `${call.tool} was cancelled while waiting for approval.`,
              ),
            );
          if (call.signal?.aborted) onAbort();
          else call.signal?.addEventListener("abort", onAbort, { once: true });
        }),
      ]);
    } catch (e) {
      if (isPolicyError(e)) throw e;
      this.deps.logger.warn(
        { err: String(e), tool: call.tool },
        "elicitation failed; falling back to out-of-band approval",
      );
      return null;
    } finally {
      clearTimeout(timer);
      if (onAbort) call.signal?.removeEventListener("abort", onAbort);
    }
  }

  private checkRate(principal: Principal): void {
    const d = this.deps.rateLimiter.take(principal.id);
    if (!d.ok) {
      throw new PolicyError(
        "rate_limited",
        `${principal.id} is over ${this.config.limits.rate_limit.per_principal_per_minute} calls per minute; retry in ${Math.ceil(d.retry_after_ms / 1000)} s.`,
        { retry_after_ms: d.retry_after_ms },
      );
    }
  }

  private checkBudget(
    principal: Principal,
    tool: string,
    estimate: CostEstimate | undefined,
  ): void {
    if (!estimate) return;
    const need = estimate.device_seconds;
    for (const { key, limit } of this.budgetKeys(principal.id, tool)) {
      const b = this.deps.budget.check(key, need, this.reserved.get(key) ?? 0, limit);
      if (b.ok) continue;
      const what =
        key === principal.id ? "Device-time budget" : "Device-time allowance for read-scoped tools";
      const when =
        b.retry_after_ms !== undefined
          ? `enough frees up in ${Math.ceil(b.retry_after_ms / 1000)} s`
          : b.reserved_s > 0 && need <= b.limit_s
            ? `calls of yours already admitted hold ${b.reserved_s} s of it; retry when they finish`
            : `it can never fit (the whole budget is ${b.limit_s} s); make the call smaller`;
      throw new PolicyError(
        "budget_exceeded",
        `${what} exceeded: this call needs ~${need} s, ${b.remaining_s} s of ${b.limit_s} s per ${b.window_s} s window remain; ${when}.`,
        {
          needed_s: need,
          remaining_s: b.remaining_s,
          used_s: b.used_s,
          reserved_s: b.reserved_s,
          limit_s: b.limit_s,
          window_s: b.window_s,
          retry_after_ms: b.retry_after_ms ?? null,
          resets_at:
            b.retry_after_ms !== undefined
              ? new Date(this.clock() + b.retry_after_ms).toISOString()
              : null,
        },
      );
    }
  }
}
