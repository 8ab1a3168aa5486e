// Approvals: which rule makes a call need one, how the gate obtains it (a consumable approval
// the caller presents, the user's answer to an elicitation prompt, or an out-of-band request an
// operator decides), and the operator's decision itself. Whether to elicit and how long to wait
// for the answer are decided here and nowhere else: the transport only sends the prompt.

import {
  approvalUrl,
  defaultApproveCommand,
  type ApprovalRecord,
  type ApprovalStore,
} from "../approvals.js";
import type { AuditLog } from "../audit.js";
import { systemClock, type Clock } from "../clock.js";
import type { ApprovalRule } from "../config.js";
import { PolicyError, isPolicyError } from "../errors.js";
import { formatBytes } from "../../lib/units.js";
import type { CostEstimate } from "../estimate.js";
import type { DecisionEvidence } from "../passkeys/evidence.js";
import { hasScope, type Principal } from "../scopes.js";
import type { GateContext } from "./context.js";
import type { ElicitAnswer, GateCall } from "./types.js";

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

/**
 * The approval step: returns the approval id to consume once a slot is held, or undefined when
 * none is needed (no rule applies, or the user accepted the prompt). Otherwise throws
 * approval_declined, cancelled, or approval_required naming the out-of-band request.
 */
export async function checkApproval(
  ctx: GateContext,
  call: GateCall,
  digest: string,
  redacted: unknown,
): Promise<string | undefined> {
  const { principal, tool, estimate } = call;
  const cfg = ctx.config.approvals;
  const rule = matchApprovalRule(cfg.rules, principal.id, tool, estimate);
  if (!rule) return undefined;

  // Only a consumable approval counts. `confirm: true` or any other argument never does.
  const presented = call.args.approval_id;
  if (typeof presented === "string" && presented.length > 0) {
    ctx.deps.approvals.check(presented, principal.id, tool, digest);
    return presented;
  }

  // Asked in the client when it can show a form and the policy allows it.
  if (call.elicit && cfg.elicitation) {
    const answer = await askClient(ctx, call, rule, redacted);
    if (answer !== null) {
      if (answer === "accept") {
        ctx.audit({
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
  const open = ctx.deps.approvals.findOpen(principal.id, tool, digest);
  const rec =
    open ??
    ctx.deps.approvals.create({
      principal: principal.id,
      tool,
      args_digest: digest,
      args_preview: redacted,
      estimate: estimate ?? null,
      assurance: rule.assurance,
      ttl_s: cfg.ttl_s,
      max_pending: cfg.max_pending_per_principal,
    });
  const link = approvalUrl(ctx.deps.consoleUrl?.(), rec.id);
  const how =
    rec.assurance === "passkey"
      ? `This rule requires a passkey: ask an operator to approve it in the console${link ? ` (${link})` : ""} with their passkey; a token or the CLI cannot.`
      : `Ask an operator to run \`${(ctx.deps.approveCommand ?? defaultApproveCommand)(rec.id)}\` from the tpu-mcp folder with a token holding approvals:grant (--token or TPU_MCP_TOKEN), or to approve it in the console${link ? ` (${link})` : ""}.`;
  const message =
    rec.status === "approved"
      ? `This call was already approved (approval ${rec.id}). Call ${tool} again with the same arguments and approval_id "${rec.id}" before ${rec.expires_at}.`
      : `This call needs human approval (rule: ${describeRule(rule)}; estimate: ${describeEstimate(estimate)}). ${how} Then call ${tool} again with the same arguments and approval_id "${rec.id}". The request expires at ${rec.expires_at}.`;
  throw new PolicyError("approval_required", message, {
    approval_id: rec.id,
    tool,
    args: redacted,
    status: rec.status,
    expires_at: rec.expires_at,
    estimate: estimate ?? null,
    assurance: rec.assurance,
    // The console's page for this request (where a passkey rule is decided).
    ...(link ? { approval_url: link } : {}),
    message,
  });
}

/**
 * The client's answer, "timeout", or null when the prompt could not be shown (fall back to out
 * of band). The one timeout of an elicitation is here (approvals.elicitation_timeout_s): when the
 * gate stops waiting, for it or for the caller's cancellation, it aborts the prompt's signal so
 * the transport withdraws the request.
 */
async function askClient(
  ctx: GateContext,
  call: GateCall,
  rule: ApprovalRule,
  redacted: unknown,
): Promise<ElicitAnswer | "timeout" | null> {
  const timeoutMs = ctx.config.approvals.elicitation_timeout_s * 1000;
  const message = `${call.principal.id} wants to call ${call.tool} (${describeEstimate(call.estimate)}). Approval is required for ${describeRule(rule)}. Allow this call once?`;
  const withdraw = new AbortController();
  let timer: ReturnType<typeof setTimeout> | undefined;
  let onAbort: (() => void) | undefined;
  try {
    return await Promise.race([
      call.elicit!(
        { tool: call.tool, args_preview: redacted, estimate: call.estimate ?? null, message },
        withdraw.signal,
      ),
      new Promise<"timeout">((resolve) => {
        timer = setTimeout(() => {
          withdraw.abort();
          resolve("timeout");
        }, timeoutMs);
      }),
      new Promise<never>((_, reject) => {
        onAbort = () => {
          withdraw.abort();
          reject(
            new PolicyError("cancelled", `${call.tool} was cancelled while waiting for approval.`),
          );
        };
        if (call.signal?.aborted) onAbort();
        else call.signal?.addEventListener("abort", onAbort, { once: true });
      }),
    ]);
  } catch (e) {
    if (isPolicyError(e)) throw e;
    ctx.deps.logger.warn(
      { err: String(e), tool: call.tool },
      "elicitation failed; falling back to out-of-band approval",
    );
    return null;
  } finally {
    clearTimeout(timer);
    if (onAbort) call.signal?.removeEventListener("abort", onAbort);
  }
}

export interface DecideApprovalDeps {
  approvals: ApprovalStore;
  audit: AuditLog;
  clock?: Clock;
  consoleUrl?: () => string | undefined;
}

/**
 * An operator's decision (the CLI calls this, directly or through Gate). The approver needs
 * approvals:grant and must not be the requester; both refusals are audited. An approval whose
 * rule requires a passkey is decided only with `evidence`: an assertion the console verified
 * (policies/passkeys/ceremony.ts) for this approval, this decision and this approver.
 */
export function decideApproval(
  deps: DecideApprovalDeps,
  id: string,
  approver: Principal,
  decision: "approve" | "deny",
  reason?: string,
  evidence?: DecisionEvidence,
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
    if (existing?.assurance === "passkey" && !evidence) {
      const link = approvalUrl(deps.consoleUrl?.(), id);
      throw new PolicyError(
        "approval_needs_passkey",
        `Approval ${id} is under a rule that requires a passkey: a token, the CLI or the API cannot decide it. Approve or deny it in the operator console${link ? ` at ${link}` : " (/console/ on the server's HTTP address)"}, signed in with your passkey.`,
        { approval_id: id, assurance: "passkey", ...(link ? { approval_url: link } : {}) },
      );
    }
    // The evidence must be for exactly this decision by this approver (the console verified the
    // signature; this keeps a proof for one approval from being recorded against another).
    if (
      evidence &&
      (evidence.binding.approval_id !== id ||
        evidence.binding.decision !== decision ||
        evidence.operator !== approver.id ||
        evidence.binding.args_digest !== existing?.args_digest)
    )
      throw new PolicyError(
        "passkey_refused",
        `The passkey assertion was made for another approval, decision or operator; nothing was recorded for ${id}.`,
        { approval_id: id },
      );
    const rec =
      decision === "approve"
        ? deps.approvals.approve(id, approver.id)
        : deps.approvals.deny(id, approver.id, reason);
    deps.audit.append({
      ...base,
      estimate: rec.estimate,
      outcome: decision === "approve" ? "approval_granted" : "approval_denied",
      assurance: evidence ? "passkey" : "token",
      ...(evidence ? { evidence } : {}),
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
