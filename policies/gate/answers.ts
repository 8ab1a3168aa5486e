// How an approval is put to a person (the rule and the estimate in words), whether the answer in
// the client may decide it, and how that answer is recorded, for both protocol eras
// (approval_flow.ts pushes the question in a 2025 session, input_required.ts asks it in a
// 2026-07-28 result).

import { formatBytes } from "../../lib/units.js";
import type { ApprovalRecord } from "../approval_record.js";
import type { ApprovalRule } from "../config.js";
import { extensionNote, type CostEstimate } from "../estimate.js";
import { costNote } from "../limits/pricing.js";
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
  return `~${e.device_seconds} device-seconds${costNote(e)}${extensionNote(e)}, ${formatBytes(e.memory_bytes)} memory${e.compile_s ? `, ${e.compile_s} s compile` : ""}`;
}

/**
 * May the answer to the client's form decide this approval? Only when the rule asks for no more
 * (`"assurance": "client_form"`) and so did the rule when the approval was made: a config that
 * raised the rule since still holds for approvals made before.
 */
export function mayAnswerInBand(rule: ApprovalRule, rec: ApprovalRecord): boolean {
  return rule.assurance === "client_form" && rec.assurance === "client_form";
}

/**
 * What a client_form rule is worth, in the words of the start-up banner and `tpu-mcp doctor`
 * (docs/security.md says the same): whoever answers the client's form approves, and an agent
 * that answers its own client's prompts is that someone.
 */
export function clientFormText(tools: readonly string[]): string {
  return (
    `client_form rule(s) (${tools.join(", ")}): approved by whoever answers the client's form — ` +
    "an agent that answers its own client's prompts approves its own calls. Keep it only for a desktop host whose own dialog a person answers; " +
    'use "assurance": "token" or "passkey" where an agent may answer'
  );
}

/** The tools of the rules an answer in the client decides (none with elicitation off). */
export function clientFormRules(approvals: {
  rules: readonly ApprovalRule[];
  elicitation: boolean;
}): string[] {
  if (!approvals.elicitation) return [];
  return approvals.rules.filter((r) => r.assurance === "client_form").map((r) => r.tool);
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
 * The answer to the client's form, in either era, recorded on its approval: decided as
 * `client-form:<principal>` (whoever answered the form that principal's client showed, the agent
 * itself included; never the principal's own id) and audited with assurance "client_form". Throws
 * what the store throws when the approval was decided meanwhile (approval_already_decided) or
 * expired.
 */
export async function recordAnswer(
  ctx: GateContext,
  call: GateCall,
  rule: ApprovalRule,
  id: string,
  answer: ElicitAnswer,
  digest: string,
  redacted: unknown,
): Promise<void> {
  const { principal, tool, estimate } = call;
  const approver = `client-form:${principal.id}`;
  const reason =
    answer === "accept"
      ? `accepted in the client (${describeRule(rule)})`
      : `${answer === "decline" ? "declined" : "dismissed"} in the client`;
  if (answer === "accept") await ctx.deps.approvals.approve(id, approver);
  else await ctx.deps.approvals.deny(id, approver, reason);
  ctx.audit({
    principal: principal.id,
    tool,
    args_digest: digest,
    args: redacted,
    estimate: estimate ?? null,
    approval_id: id,
    outcome: answer === "accept" ? "approval_granted" : "approval_denied",
    approver,
    assurance: "client_form",
    reason,
  });
}
