// The version of the approval policy an approval was decided under: a digest of the approvals
// section as in effect (its rules, TTL, assurance and overrun settings, defaults filled in). An
// approval records it when it is requested; used under another version (the config changed and
// was reloaded, or the server restarted with another one) it no longer counts, and the call asks
// again (approval_flow.ts).

import { createHash } from "node:crypto";
import type { PolicyConfig } from "./config.js";
import { canonicalJson } from "./digest.js";

export function policyVersion(approvals: PolicyConfig["approvals"]): string {
  return `pv_${createHash("sha256").update(canonicalJson(approvals)).digest("hex").slice(0, 32)}`;
}

/**
 * Whether an approval was decided under another policy version than `current`. One recorded
 * before versions were (null) counts as the current one: a store upgraded in place keeps its
 * approvals.
 */
export function decidedUnderOtherPolicy(
  rec: { policy_version: string | null },
  current: string,
): boolean {
  return rec.policy_version !== null && rec.policy_version !== current;
}
