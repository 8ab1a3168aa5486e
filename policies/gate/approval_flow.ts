// Approvals: which rule makes a call need one, how the gate obtains it (a consumable approval
// the caller presents, the answer to the client's form where the rule allows it, or an
// out-of-band request an operator decides), and the operator's decision itself. Whether to elicit and how long to wait
// for the answer are decided here and nowhere else: the transport only sends the prompt.

import {
  approvalUrl,
  approvalUsableError,
  defaultApproveCommand,
  type ApprovalRecord,
  type ApprovalStore,
} from "../approval_record.js";
import type { AuditLog } from "../audit.js";
import { systemClock, type Clock } from "../clock.js";
import type { ApprovalRule } from "../config.js";
import { PolicyError, isPolicyError } from "../errors.js";
import { decidedUnderOtherPolicy } from "../policy_version.js";
import { shownApproval, shownSha256 } from "../approval_shown.js";
import type { CostEstimate } from "../estimate.js";
import type { DecisionEvidence } from "../passkeys/evidence.js";
import { hasScope, type Principal } from "../scopes.js";
import type { GateContext } from "./context.js";
import {
  approvalPrompt,
  describeEstimate,
  describeRule,
  mayAnswerInBand,
  recordAnswer,
} from "./answers.js";
import { answerInBand, askInBand } from "./input_required.js";
import type { ElicitAnswer, GateCall, InputRequired } from "./types.js";

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

/**
 * The approval step: returns the approval id to consume once a slot is held, undefined when no
 * rule applies, or (2026-07-28 era) the question to answer the call with. Otherwise throws
 * approval_declined, cancelled, or approval_required naming the request an operator decides out
 * of band.
 *
 * Every path goes through one approval record, the in-band prompt included: the person's answer
 * is recorded on it whenever it comes, so an answer given after the client stopped waiting (SDK
 * clients give up on a request after 60 s) is not lost: the agent's retry finds it.
 */
export async function checkApproval(
  ctx: GateContext,
  call: GateCall,
  digest: string,
  redacted: unknown,
): Promise<string | InputRequired | undefined> {
  const { principal, tool, estimate } = call;
  const cfg = ctx.config.approvals;
  const rule = matchApprovalRule(cfg.rules, principal.id, tool, estimate);
  if (!rule) return undefined;

  // The 2026-07-28 era: the user's answer comes back on a retry that echoes the sealed state.
  if (call.inBand?.state !== undefined) return answerInBand(ctx, call, rule, digest, redacted);

  // Only a consumable approval counts. `confirm: true` or any other argument never does.
  const presented = call.args.approval_id;
  let stale = "";
  if (typeof presented === "string" && presented.length > 0) {
    const used = await ctx.deps.approvals.check(presented, principal.id, tool, digest);
    // Decided under another approval policy: it no longer counts, and this call asks again.
    if (!decidedUnderOtherPolicy(used, ctx.policyVersion)) return presented;
    stale = `Approval ${presented} was requested under approval policy ${used.policy_version}; the policy has changed since (now ${ctx.policyVersion}), so it no longer counts and this call needs a new approval. `;
  }

  // Reuse an open request for this exact call rather than piling up new ones (or asking twice),
  // never one requested under another policy version.
  const open = await ctx.deps.approvals.findOpen(principal.id, tool, digest, ctx.policyVersion);
  const extra = stale ? { stale_approval_id: presented, policy_version: ctx.policyVersion } : {};
  if (open?.status === "approved") throw approvalRequired(ctx, call, rule, open, stale, extra);
  const rec =
    open ??
    (await ctx.deps.approvals.create({
      principal: principal.id,
      tool,
      args_digest: digest,
      args_preview: redacted,
      estimate: estimate ?? null,
      assurance: rule.assurance,
      ttl_s: cfg.ttl_s,
      max_pending: cfg.max_pending_per_principal,
      policy_version: ctx.policyVersion,
      rule: describeRule(rule),
    }));
  // In band only where both the rule and the record say an answer in the client decides
  // (`client_form`): whoever answers the form may be the agent itself, so a token or passkey
  // rule is never asked there, whatever the client can show.
  const inBand = cfg.elicitation && mayAnswerInBand(rule, rec);
  // The 2026-07-28 era asks in band by answering input_required: the same approval record, so an
  // operator may still decide it out of band while the user has not answered.
  if (call.inBand?.canAsk && inBand && ctx.deps.requestStates && rec.status === "pending")
    return askInBand(ctx, call, rule, digest, rec);

  // The 2025 era pushes the question to a client that can show a form.
  if (call.elicit && inBand) {
    const answer = await waitForAnswer(ctx, call, rule, rec, digest, redacted);
    if (answer === "accept") return rec.id;
    if (answer === "operator") {
      // Decided out of band while the prompt was up (the console, another replica): that stands.
      const now = await ctx.deps.approvals.get(rec.id);
      const refused = approvalUsableError(now, rec.id, principal.id, tool, digest);
      if (refused) throw refused;
      return rec.id;
    }
    if (answer === "decline" || answer === "cancel") {
      throw new PolicyError(
        "approval_declined",
        `The user ${answer === "decline" ? "declined" : "dismissed"} the approval prompt; the call was not run.`,
        { answer, approval_id: rec.id },
      );
    }
    if (answer === "timeout") {
      // Nobody declined: the request stays open for an operator, as any out-of-band one.
      throw approvalRequired(
        ctx,
        call,
        rule,
        (await ctx.deps.approvals.get(rec.id)) ?? rec,
        `Nobody answered the approval prompt in the client within ${cfg.elicitation_timeout_s} s. `,
        { prompt: "unanswered" },
      );
    }
  }
  // A client that could have asked is told why it was not: the rule wants an operator.
  const couldAsk = call.elicit !== undefined || call.inBand?.canAsk === true;
  throw approvalRequired(
    ctx,
    call,
    rule,
    rec,
    stale + (couldAsk && !inBand ? notInBand(rec) : ""),
    extra,
  );
}

/** Why a client that can show a form was not asked (the rule needs more than its answer). */
function notInBand(rec: ApprovalRecord): string {
  return `An answer in the client cannot decide this approval (its rule's assurance is "${rec.assurance}", not "client_form"): an operator decides it out of band. `;
}

function approvalRequired(
  ctx: GateContext,
  call: GateCall,
  rule: ApprovalRule,
  rec: ApprovalRecord,
  lead = "",
  extra: Record<string, unknown> = {},
): PolicyError {
  const { tool, estimate } = call;
  const command = (ctx.deps.approveCommand ?? defaultApproveCommand)(rec.id);
  const consoleUrl = ctx.deps.consoleUrl?.();
  // The console's page for this request (where a passkey rule is decided).
  const link = approvalUrl(consoleUrl, rec.id);
  // No console of its own (stdio): how to serve one on the same data, else none is named.
  const start = consoleUrl ? undefined : ctx.deps.consoleStart;
  const where = link
    ? `in the console (${link})`
    : consoleUrl
      ? `in the console at ${consoleUrl}`
      : start
        ? `in a console (start one on this server's data with \`${start.command}\`, then open ${start.url ?? "the console address it prints"})`
        : undefined;
  const how =
    rec.assurance === "passkey"
      ? `This rule requires a passkey: ask an operator to approve it ${where ?? "in the console"} with their passkey; a token or the CLI cannot.`
      : `Ask an operator to ${where ? `approve it ${where}, or to ` : ""}run \`${command}\` (from any folder).`;
  const message =
    rec.status === "approved"
      ? `This call was already approved (approval ${rec.id}). Call ${tool} again with the same arguments and approval_id "${rec.id}" before ${rec.expires_at}.`
      : `${lead}This call needs human approval (rule: ${describeRule(rule)}; estimate: ${describeEstimate(estimate)}). ${how} Then call ${tool} again with the same arguments and approval_id "${rec.id}". The request expires at ${rec.expires_at}.`;
  return new PolicyError(
    "approval_required",
    message,
    {
      approval_id: rec.id,
      tool,
      args: rec.args_preview,
      status: rec.status,
      expires_at: rec.expires_at,
      estimate: estimate ?? null,
      assurance: rec.assurance,
      // What the operator is shown of this request (the MCP App renders it too).
      shown: shownApproval(rec),
      ...(rec.assurance === "passkey" ? {} : { approve_command: command }),
      ...(consoleUrl ? { console_url: consoleUrl } : {}),
      ...(link ? { approval_url: link } : {}),
      ...(start ? { console_command: start.command } : {}),
      ...extra,
      message,
    },
    [
      command,
      ...(link ? [link] : []),
      ...(consoleUrl ? [consoleUrl] : []),
      ...(start ? [start.command, ...(start.url ? [start.url] : [])] : []),
    ],
  );
}

/** "operator": the approval was decided out of band while the prompt was up. */
type Answer = ElicitAnswer | "timeout" | "operator" | null;

/**
 * The call's wait for the in-band answer. The prompt itself (one per approval: a retry joins the
 * prompt already shown instead of asking again) outlives the call: when the caller gives up or
 * cancels, the call ends `cancelled` but the prompt stays up until it is answered or times out,
 * and its answer is recorded on the approval.
 */
async function waitForAnswer(
  ctx: GateContext,
  call: GateCall,
  rule: ApprovalRule,
  rec: ApprovalRecord,
  digest: string,
  redacted: unknown,
): Promise<Answer> {
  const cancelled = () =>
    new PolicyError(
      "cancelled",
      `${call.tool} was cancelled while waiting for approval; an answer to the prompt is still recorded on approval ${rec.id} (call again with approval_id "${rec.id}" once approved).`,
      { approval_id: rec.id },
    );
  // A call given up already asks nobody.
  if (call.signal?.aborted) throw cancelled();
  let prompt = ctx.prompts.get(rec.id);
  if (!prompt) {
    prompt = askAndRecord(ctx, call, rule, rec, digest, redacted);
    ctx.prompts.set(rec.id, prompt);
    const forget = () => ctx.prompts.delete(rec.id);
    prompt.then(forget, forget);
  }
  let onAbort: (() => void) | undefined;
  try {
    return await Promise.race([
      prompt,
      new Promise<never>((_, reject) => {
        onAbort = () => reject(cancelled());
        call.signal?.addEventListener("abort", onAbort, { once: true });
      }),
    ]);
  } finally {
    if (onAbort) call.signal?.removeEventListener("abort", onAbort);
  }
}

/**
 * Shows the prompt and records its answer on the approval (approved or denied by
 * `client-form:<principal>`, audited). The one timeout of an elicitation is here
 * (approvals.elicitation_timeout_s): then the prompt is withdrawn (its signal aborted, which
 * cancels the request on the wire) and the approval stays pending for an operator. A decision
 * made meanwhile out of band (the console, the CLI, another replica: whatever the store's
 * subscribers hear) also withdraws it, and resolves "operator". Resolves null when the prompt
 * could not be shown (fall back to out of band). Never rejects.
 */
async function askAndRecord(
  ctx: GateContext,
  call: GateCall,
  rule: ApprovalRule,
  rec: ApprovalRecord,
  digest: string,
  redacted: unknown,
): Promise<Answer> {
  const { tool } = call;
  const timeoutMs = ctx.config.approvals.elicitation_timeout_s * 1000;
  const prompt = approvalPrompt(
    call,
    rule,
    redacted,
    call.estimate ?? null,
    ` (approval ${rec.id})`,
  );
  const withdraw = new AbortController();
  let timer: ReturnType<typeof setTimeout> | undefined;
  let unsubscribe: (() => void) | undefined;
  let answer: Answer;
  try {
    answer = await Promise.race([
      call.elicit!(prompt, withdraw.signal),
      new Promise<"timeout">((resolve) => {
        timer = setTimeout(() => {
          withdraw.abort();
          resolve("timeout");
        }, timeoutMs);
      }),
      new Promise<"operator">((resolve) => {
        unsubscribe = ctx.deps.approvals.subscribe?.((e) => {
          if (e.record.id !== rec.id || e.record.status === "pending") return;
          withdraw.abort();
          resolve("operator");
        });
      }),
    ]);
  } catch (e) {
    ctx.deps.logger.warn(
      { err: String(e), tool },
      "elicitation failed; falling back to out-of-band approval",
    );
    return null;
  } finally {
    clearTimeout(timer);
    unsubscribe?.();
  }
  if (answer === "timeout" || answer === "operator") return answer;
  try {
    await recordAnswer(ctx, call, rule, rec.id, answer, digest, redacted);
    return answer;
  } catch (e) {
    // Decided meanwhile (an operator in the console, or it expired): that decision stands.
    ctx.deps.logger.warn(
      { err: String(e), tool, approval_id: rec.id },
      "the answer to the approval prompt came after the approval was decided or expired",
    );
    const now = await ctx.deps.approvals.get(rec.id).catch(() => undefined);
    return now?.status === "approved" ? "accept" : now?.status === "denied" ? "decline" : null;
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
export async function decideApproval(
  deps: DecideApprovalDeps,
  id: string,
  approver: Principal,
  decision: "approve" | "deny",
  reason?: string,
  evidence?: DecisionEvidence,
): Promise<ApprovalRecord> {
  const now = (deps.clock ?? systemClock)();
  const existing = await deps.approvals.get(id);
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
        ? await deps.approvals.approve(id, approver.id)
        : await deps.approvals.deny(id, approver.id, reason);
    await deps.audit.append({
      ...base,
      estimate: rec.estimate,
      // What the approver was shown: the request as it stood undecided (existing is that read).
      ...(existing ? { shown_sha256: shownSha256(shownApproval(existing)) } : {}),
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
      await deps.audit.append({ ...base, outcome: "denied", code: e.code, reason: e.message });
    }
    throw e;
  }
}
