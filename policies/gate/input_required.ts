// The 2026-07-28 era's in-band approval. The server cannot push a question there: a call that
// needs approval answers input_required with the form and a requestState sealed to the principal,
// the tool, the argument digest and the approval (policies/request_state.ts); the client's retry
// carries the state back with the user's answer, which decides that approval once (a replayed,
// forged, expired or misplaced state is refused). The question is returned, not thrown: it is an
// outcome of the call (InputRequired), which the gate audits as approval_requested. The 2025 era's
// pushed prompt is in approval_flow.ts; both record the answer the same way (recordAnswer).

import type { ApprovalRecord } from "../approval_record.js";
import type { ApprovalRule } from "../config.js";
import { PolicyError, isPolicyError } from "../errors.js";
import { decidedUnderOtherPolicy } from "../policy_version.js";
import { RequestStateError, type ApprovalState, type StateRefusal } from "../request_state.js";
import { approvalPrompt, mayAnswerInBand, recordAnswer } from "./answers.js";
import type { GateContext } from "./context.js";
import { InputRequired, type GateCall } from "./types.js";

/** The question: the prompt and a state sealed to this principal, call and approval. */
export function askInBand(
  ctx: GateContext,
  call: GateCall,
  rule: ApprovalRule,
  digest: string,
  rec: ApprovalRecord,
): InputRequired {
  const ttlMs = Math.min(
    ctx.config.approvals.elicitation_timeout_s * 1000,
    Math.max(0, Date.parse(rec.expires_at) - ctx.clock()),
  );
  const state = ctx.deps.requestStates!.seal(
    { p: call.principal.id, t: call.tool, d: digest, a: rec.id },
    ttlMs,
  );
  return new InputRequired(
    rec.id,
    approvalPrompt(call, rule, rec.args_preview, rec.estimate),
    state,
    new Date(ctx.clock() + ttlMs).toISOString(),
  );
}

const STATE_REFUSALS: Record<StateRefusal, string> = {
  malformed: "is not a requestState this server issued",
  mac: "failed its integrity check (it was altered or not issued by this server)",
  expired: "has expired",
};

/**
 * The retry of an in-band approval: the state must open (MAC, expiry) and name this principal, this
 * tool and these exact arguments; answering decides its approval, which can happen once only, so a
 * replayed state is refused. An accepted approval is consumed by the gate like one presented by id;
 * a retry without an answer is asked again.
 */
export async function answerInBand(
  ctx: GateContext,
  call: GateCall,
  rule: ApprovalRule,
  digest: string,
  redacted: unknown,
): Promise<string | InputRequired> {
  const { principal, tool } = call;
  const refuse = (why: string, detail: string) =>
    new PolicyError(
      "invalid_request_state",
      `The requestState of this retry ${detail}; the call was not run. Call ${tool} again without it to be asked again.`,
      { why },
    );
  let s: ApprovalState;
  try {
    s = ctx.deps.requestStates!.open(call.inBand!.state);
  } catch (e) {
    const why = e instanceof RequestStateError ? e.why : "malformed";
    throw refuse(why, STATE_REFUSALS[why]);
  }
  if (s.p !== principal.id) throw refuse("principal", "was issued to another principal");
  if (s.t !== tool || s.d !== digest)
    throw refuse("call", "was issued for another call (the tool or the arguments differ)");
  // A nonce is consumed once wherever it is presented (a shared store); a replay is refused.
  if (ctx.deps.consumedStates && !(await ctx.deps.consumedStates.consume(s.n)))
    throw refuse(
      "replayed",
      `answers approval ${s.a}, which was already decided (a state is single-use)`,
    );
  const rec = await ctx.deps.approvals.get(s.a);
  // Only a client_form rule's approval is decided by the answer in the client (no other is ever
  // sealed a state; a config that raised the rule since the state was sealed holds too).
  if (rec && !mayAnswerInBand(rule, rec))
    throw refuse(
      "assurance",
      `answers approval ${s.a}, which an operator decides out of band (${rec.assurance === "passkey" ? "with a passkey" : "its rule's assurance is not client_form"})`,
    );
  // Sealed under another approval policy (a reload changed it since): asked again, afresh.
  if (rec && decidedUnderOtherPolicy(rec, ctx.policyVersion))
    throw refuse(
      "policy",
      `answers approval ${s.a}, which was requested under approval policy ${rec.policy_version}; the policy has changed since (now ${ctx.policyVersion})`,
    );
  if (!rec || rec.status !== "pending")
    throw refuse(
      "replayed",
      `answers approval ${s.a}, which was already decided (a state is single-use)`,
    );
  const answer = call.inBand!.answer;
  // A retry that carries the state but no answer is asked again, for the same approval.
  if (answer === undefined) return askInBand(ctx, call, rule, digest, rec);
  try {
    await recordAnswer(ctx, call, rule, s.a, answer, digest, redacted);
  } catch (e) {
    // Decided between the read above and now (an operator, or a concurrent replay).
    if (isPolicyError(e) && e.code === "approval_already_decided")
      throw refuse(
        "replayed",
        `answers approval ${s.a}, which was already decided (a state is single-use)`,
      );
    throw e;
  }
  if (answer !== "accept")
    throw new PolicyError(
      "approval_declined",
      `The user ${answer === "decline" ? "declined" : "cancelled"} the approval prompt; the call was not run.`,
      { answer, approval_id: s.a },
    );
  return s.a;
}
