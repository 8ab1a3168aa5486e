// How an approval is put to a person (the rule and the estimate in words) and how that person's
// answer in the client is recorded, for both protocol eras (approval_flow.ts pushes the question
// in a 2025 session, input_required.ts asks it in a 2026-07-28 result).

import { formatBytes } from "../../lib/units.js";
import type { ApprovalRule } from "../config.js";
import type { CostEstimate } from "../estimate.js";
import type { GateContext } from "./context.js";
import type { ApprovalForm, ElicitAnswer, ElicitPrompt, GateCall } from "./types.js";

export function describeRule(rule: ApprovalRule): string {
  const w = rule.when ?? {};
  const parts = [
    w.min_weight_bytes !== undefined ? `weights ≥ ${formatBytes(w.min_weight_bytes)}` : null,
    w.min_device_seconds !== undefined ? `device time ≥ ${w.min_device_seconds} s` : null,
    w.min_memory_bytes !== undefined ? `memory ≥ ${formatBytes(w.min_memory_bytes)}` : null,
  ].filter(Boolean);
  return parts.length ? `${rule.tool} when ${parts.join(" or ")}` : `every ${rule.tool} call`;
}

export function describeEstimate(e: CostEstimate | undefined | null): string {
  if (!e) return "no estimate";
  return `~${e.device_seconds} device-seconds, ${formatBytes(e.memory_bytes)} memory${e.compile_s ? `, ${e.compile_s} s compile` : ""}`;
}

/** The question put to the person at the client, in either era: who, which tool, on which model. */
export function promptMessage(call: GateCall, rule: ApprovalRule): string {
  const model = typeof call.args.model === "string" ? ` on model ${call.args.model}` : "";
  return `${call.principal.id} wants to call ${call.tool}${model} (${describeEstimate(call.estimate)}). Approval is required for ${describeRule(rule)}. Allow this call once?`;
}

/**
 * The whole question, in either era: its wording (`suffix` appended, the 2025 prompt names its
 * approval) and the form that takes the answer, which shows the arguments and the estimate.
 */
export function approvalPrompt(
  call: GateCall,
  rule: ApprovalRule,
  argsPreview: unknown,
  estimate: CostEstimate | null,
  suffix = "",
): ElicitPrompt {
  return {
    tool: call.tool,
    args_preview: argsPreview,
    estimate,
    message: `${promptMessage(call, rule)}${suffix}`,
    form: approvalForm(call.tool, argsPreview, estimate),
  };
}

function approvalForm(tool: string, argsPreview: unknown, estimate: unknown): ApprovalForm {
  return {
    type: "object",
    properties: {
      approve: {
        type: "boolean",
        title: `Approve ${tool}?`,
        description: `Arguments: ${JSON.stringify(argsPreview).slice(0, 500)}; estimate: ${JSON.stringify(estimate ?? {}).slice(0, 300)}`,
      },
    },
    required: ["approve"],
  };
}

/**
 * The person's answer to the form, from the client's elicitation result (untrusted: an accept
 * that does not tick `approve` declines; anything else unreadable is no answer).
 */
export function formAnswer(result: unknown): ElicitAnswer | undefined {
  const r = result as { action?: unknown; content?: { approve?: unknown } } | undefined;
  if (!r || typeof r !== "object") return undefined;
  if (r.action === "accept") return r.content?.approve === true ? "accept" : "decline";
  if (r.action === "decline" || r.action === "cancel") return r.action;
  return undefined;
}

/**
 * The answer of the person at the client, in either era, recorded on its approval: decided as
 * `elicitation:<principal>` (never the principal itself) and audited. Throws what the store
 * throws when the approval was decided meanwhile (approval_already_decided) or expired.
 */
export function recordAnswer(
  ctx: GateContext,
  call: GateCall,
  rule: ApprovalRule,
  id: string,
  answer: ElicitAnswer,
  digest: string,
  redacted: unknown,
): void {
  const { principal, tool, estimate } = call;
  const approver = `elicitation:${principal.id}`;
  const reason =
    answer === "accept"
      ? `accepted in the client (${describeRule(rule)})`
      : `${answer === "decline" ? "declined" : "dismissed"} in the client`;
  if (answer === "accept") ctx.deps.approvals.approve(id, approver);
  else ctx.deps.approvals.deny(id, approver, reason);
  ctx.audit({
    principal: principal.id,
    tool,
    args_digest: digest,
    args: redacted,
    estimate: estimate ?? null,
    approval_id: id,
    outcome: answer === "accept" ? "approval_granted" : "approval_denied",
    approver,
    reason,
  });
}
