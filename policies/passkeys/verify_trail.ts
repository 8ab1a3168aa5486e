// `tpu-mcp audit verify`'s second half: every passkey-signed decision in the trail is checked
// again against the credential store (evidence.ts), so a decision recorded with evidence that no
// enrolled passkey signed — or signed for another call — is reported, whatever the chain says.

import type { StoredAuditRecord } from "../audit_record.js";
import { verifyDecisionEvidence, type EvidenceCheck } from "./evidence.js";
import type { Passkeys } from "./store.js";

export interface TrailEvidenceResult {
  ok: boolean;
  checked: number;
  failures: EvidenceCheck[];
}

/** Where the enrolled credentials are read (the passkey store of either backend). */
export type CredentialLookup = Pick<Passkeys, "get">;

export async function verifySignedDecisions(
  records: Iterable<StoredAuditRecord>,
  store: CredentialLookup,
): Promise<TrailEvidenceResult> {
  const failures: EvidenceCheck[] = [];
  let checked = 0;
  for (const r of records) {
    if (!r.evidence) continue;
    checked++;
    const c = await verifyDecisionEvidence(r, await store.get(r.evidence.credential_id));
    if (!c.ok) failures.push(c);
  }
  return { ok: failures.length === 0, checked, failures };
}
