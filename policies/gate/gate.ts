// THE gate every tool call passes: the admission steps (steps.ts, in their documented, fail-closed
// order) and then the supervisor (supervise.ts: deadline, cancellation, settle and charge). Every
// refusal is audited with its code (repeats counted, see audit_refusals.ts); every executed call
// is audited with its duration.

import type { ApprovalRecord } from "../approval_record.js";
import { redactArgs } from "../audit_record.js";
import type { PolicyConfig } from "../config.js";
import { argsDigest } from "../digest.js";
import { policyVersion } from "../policy_version.js";
import { isPolicyError } from "../errors.js";
import type { DecisionEvidence } from "../passkeys/evidence.js";
import type { Principal } from "../scopes.js";
import { decideApproval } from "./approval_flow.js";
import { gateContext, type GateContext } from "./context.js";
import { admit, checkSuspended, scopeRefusal, takeRate } from "./steps.js";
import { stopError } from "./supervise.js";
import { resumeCommand, type Suspension } from "../suspensions.js";
import { supervise } from "./supervise.js";
import { reconcileInterrupted, type LeftBehind } from "./reconcile.js";
import type { AuditRecord } from "../audit.js";
import {
  InputRequired,
  traceIds,
  type CallDeadline,
  type GateCall,
  type GateDeps,
} from "./types.js";

// The gate's public types, so a caller imports the gate from one module.
export type {
  ApprovalForm,
  CallDeadline,
  Elicit,
  ElicitAnswer,
  ElicitPrompt,
  GateCall,
  GateDeps,
  GateObserver,
} from "./types.js";
export { InputRequired } from "./types.js";
export { formAnswer } from "./answers.js";

export class Gate {
  private readonly ctx: GateContext;

  constructor(deps: GateDeps) {
    this.ctx = gateContext(deps);
  }

  /** The approval policy's version in effect (policy_version.ts). */
  get policyVersion(): string {
    return this.ctx.policyVersion;
  }

  /**
   * A config reload's new approvals section, in effect from the next call on. An approval
   * requested under the old one no longer counts if this changed its version: its call asks again.
   */
  applyApprovals(approvals: PolicyConfig["approvals"]): void {
    this.ctx.config = { ...this.ctx.config, approvals };
    this.ctx.policyVersion = policyVersion(approvals);
  }

  decideApproval(
    id: string,
    approver: Principal,
    decision: "approve" | "deny",
    reason?: string,
    evidence?: DecisionEvidence,
  ): Promise<ApprovalRecord> {
    return decideApproval(this.ctx.deps, id, approver, decision, reason, evidence);
  }

  /**
   * The scope step on its own, for a caller refused before its call reaches the gate (the HTTP
   * layer answers 403 when scopes.canCall says no): the refusal is audited here and thrown as
   * insufficient_scope. tools/list asks scopes.visibleTools, the same predicate, and audits
   * nothing (a listing refuses nobody).
   */
  async enforceScope(principal: Principal, tool: string, via?: string): Promise<void> {
    let refusal = scopeRefusal(this.ctx, principal, tool);
    if (!refusal) return;
    // A suspended principal learns that it is suspended, as its every call does.
    try {
      await checkSuspended(this.ctx, principal);
    } catch (e) {
      if (isPolicyError(e)) refusal = e;
    }
    this.ctx.auditRefusal({
      principal: principal.id,
      tool,
      args_digest: null,
      outcome: "denied",
      code: refusal.code,
      reason: via ? `${refusal.message} (${via})` : refusal.message,
    });
    throw refusal;
  }

  /**
   * A call refused before the gate could run it (invalid arguments, unknown model, a per-model
   * bound): audited with the digest of what was sent (never the arguments). The scope step runs
   * first, so a caller without the scope learns only that; then the call counts against the
   * caller's rate limit, so malformed calls cannot be sent for free. Throws insufficient_scope or
   * rate_limited instead of recording `code` when one of those applies.
   */
  async refuse(
    principal: Principal,
    tool: string,
    rawArgs: unknown,
    code: string,
    message: string,
    trace?: GateCall["trace"],
  ): Promise<void> {
    let digest: string | null = null;
    try {
      digest = argsDigest(tool, rawArgs as Record<string, unknown>);
    } catch {
      digest = null; // unhashable input (non-finite numbers, cycles): recorded without a digest
    }
    const base = { principal: principal.id, tool, args_digest: digest, ...traceIds({ trace }) };
    try {
      await checkSuspended(this.ctx, principal);
      const refusal = scopeRefusal(this.ctx, principal, tool);
      if (refusal) throw refusal;
      await takeRate(this.ctx, principal);
    } catch (e) {
      if (isPolicyError(e))
        this.ctx.auditRefusal({ ...base, outcome: "denied", code: e.code, reason: e.message });
      throw e;
    }
    this.ctx.auditRefusal({ ...base, outcome: "denied", code, reason: message.slice(0, 500) });
  }

  /**
   * A request the protocol layer refused before it named a call the gate could run (headers that
   * contradict the body, a 2026-07-28 request without its protocol version): audited under the
   * request's method and coalesced like every refusal, so a flood leaves one line, not millions.
   */
  refuseRequest(principal: Principal, method: string, message: string): void {
    this.ctx.auditRefusal({
      principal: principal.id,
      tool: `mcp:${method.slice(0, 64)}`,
      args_digest: null,
      outcome: "denied",
      code: "invalid_request",
      reason: message.slice(0, 500),
    });
  }

  /**
   * Suspends a principal (an alert rule of "action": "suspend"): recorded in the suspension
   * store, audited, and every call it has running stopped as a budget stop is (a benchmark
   * returns what it measured, generation stops at the next token), answered principal_suspended.
   */
  async suspendPrincipal(s: Suspension): Promise<void> {
    const store = this.ctx.deps.suspensions;
    if (!store) throw new Error("this gate has no suspension store");
    await store.suspend(s);
    const running = [...(this.ctx.running.get(s.principal) ?? [])];
    this.ctx.audit({
      principal: s.principal,
      tool: "principal.suspend",
      args_digest: null,
      args: { rule: s.rule, since: s.since, until: s.until, running_calls_stopped: running.length },
      outcome: "suspended",
      code: "principal_suspended",
      reason: `${s.reason}; ${s.until ? `until ${s.until}` : "until resumed"} (\`${resumeCommand(s.principal)}\`)`,
    });
    const msg = `the call was stopped: ${s.principal} was suspended by the alert rule ${s.rule} (${s.reason}); it is charged the device time it used. ${s.until ? `The suspension ends at ${s.until}, or earlier when an operator runs \`${resumeCommand(s.principal)}\`.` : `An operator ends it with \`${resumeCommand(s.principal)}\`.`}`;
    for (const stop of running)
      stop(
        stopError(
          "principal_suspended",
          msg,
          { rule: s.rule, since: s.since, until: s.until },
          "budget",
        ),
      );
  }

  /** Lifts a principal's suspension (`tpu-mcp principals resume ID`), audited; null if none. */
  async resumePrincipal(id: string, by: Principal): Promise<Suspension | null> {
    const store = this.ctx.deps.suspensions;
    if (!store) throw new Error("this gate has no suspension store");
    const was = await store.resume(id, this.ctx.clock());
    if (was)
      this.ctx.audit({
        principal: id,
        tool: "principal.resume",
        args_digest: null,
        args: { rule: was.rule, since: was.since, until: was.until },
        outcome: "resumed",
        approver: by.id,
        reason: `suspension by ${was.rule} lifted by ${by.id}`,
      });
    return was;
  }

  /** The principals suspended now. */
  async suspended(): Promise<Suspension[]> {
    return (await this.ctx.deps.suspensions?.list(this.ctx.clock())) ?? [];
  }

  /**
   * Settles the calls a killed process left running (reconcile.ts): at start, before any call.
   * Each gets an `interrupted` record, its charge and, if it had consumed one, its approval back.
   */
  reconcileInterrupted(store: LeftBehind): Promise<AuditRecord[]> {
    return reconcileInterrupted(this.ctx, store);
  }

  /**
   * Admits the call (or refuses it, audited), then runs `fn` under the gate's supervision. A call
   * whose approval is asked in band (2026-07-28 era) does not run: its question is the answer;
   * a call without `inBand` is never asked so.
   */
  run<T>(
    call: GateCall & { inBand?: undefined },
    fn: (signal: AbortSignal, deadline: CallDeadline) => Promise<T>,
  ): Promise<T>;
  run<T>(
    call: GateCall,
    fn: (signal: AbortSignal, deadline: CallDeadline) => Promise<T>,
  ): Promise<T | InputRequired>;
  async run<T>(
    call: GateCall,
    fn: (signal: AbortSignal, deadline: CallDeadline) => Promise<T>,
  ): Promise<T | InputRequired> {
    call.trace?.mark("g.start");
    const redacted = redactArgs(call.args, this.ctx.config.audit.redact_args);
    const admitted = await admit(this.ctx, call, redacted);
    if (admitted instanceof InputRequired) return admitted;
    return supervise(this.ctx, admitted, fn);
  }
}
