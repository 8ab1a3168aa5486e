// What an approver is shown of an approval request, and its hash. The console, the CLI and the
// MCP App render this one payload, and a decision's audit record carries the SHA-256 of its
// canonical JSON (`shown_sha256`), so what the human saw is provable from the trail: anyone
// holding the payload recomputes the hash. Only what stays fixed while the request waits (not
// its status or decision) is in it.

import { createHash } from "node:crypto";
import type { ApprovalRecord } from "./approval_record.js";
import { canonicalJson } from "./digest.js";
import type { CostEstimate } from "./estimate.js";

export interface ShownApproval {
  approval_id: string;
  /** Who asked (the principal whose call it is). */
  requested_by: string;
  tool: string;
  /** The call's arguments as redacted for display and the audit. */
  args: unknown;
  args_digest: string;
  estimate: CostEstimate | null;
  /** The rule that asked, in words; null for a request recorded before rules were kept. */
  rule: string | null;
  /** What the decision must prove. */
  assurance: ApprovalRecord["assurance"];
  policy_version: string | null;
  requested_at: string;
}

export function shownApproval(rec: ApprovalRecord): ShownApproval {
  return {
    approval_id: rec.id,
    requested_by: rec.principal,
    tool: rec.tool,
    args: rec.args_preview,
    args_digest: rec.args_digest,
    estimate: rec.estimate,
    rule: rec.rule,
    assurance: rec.assurance,
    policy_version: rec.policy_version,
    requested_at: rec.created_at,
  };
}

/** sha256 (hex) of the payload's canonical JSON (policies/digest.ts). */
export function shownSha256(shown: ShownApproval): string {
  return createHash("sha256").update(canonicalJson(shown)).digest("hex");
}
