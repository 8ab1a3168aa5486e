// A passkey decision's evidence, as the audit record keeps it, and its re-verification later
// (`tpu-mcp audit verify`): the challenge is recomputed from the binding, and the signature is
// checked again over the stored authenticator data and client data with the operator's public
// key from the credential store. The audit chain's MAC says the record was not edited; this says
// the decision was signed by that passkey for that exact call — a check that needs no secret.

import { verifyAuthenticationResponse } from "@simplewebauthn/server";
import type { StoredAuditRecord } from "../audit_record.js";
import { decisionChallenge, type DecisionBinding } from "./binding.js";
import type { StoredCredential } from "./store.js";

export interface DecisionEvidence {
  kind: "webauthn";
  operator: string;
  credential_id: string;
  rp_id: string;
  origin: string;
  binding: DecisionBinding;
  /** base64url, as the browser sent them. */
  authenticator_data: string;
  client_data_json: string;
  signature: string;
  counter: number;
}

export interface EvidenceCheck {
  seq: number;
  approval_id: string;
  ok: boolean;
  reason: string;
}

/** Re-verifies one audit record's evidence; `credential` is the stored one (undefined: gone). */
export async function verifyDecisionEvidence(
  record: Pick<StoredAuditRecord, "seq" | "approval_id" | "args_digest" | "outcome" | "evidence">,
  credential: StoredCredential | undefined,
): Promise<EvidenceCheck> {
  const e = record.evidence!;
  const out = (ok: boolean, reason: string): EvidenceCheck => ({
    seq: record.seq,
    approval_id: record.approval_id ?? "?",
    ok,
    reason,
  });
  const decision = record.outcome === "approval_granted" ? "approve" : "deny";
  if (e.binding.approval_id !== record.approval_id || e.binding.args_digest !== record.args_digest)
    return out(false, "the evidence is bound to another approval or other arguments");
  if (e.binding.decision !== decision)
    return out(false, `the evidence signs "${e.binding.decision}" but the record says ${decision}`);
  // A removed passkey still verifies what it signed while it was enrolled.
  if (!credential) return out(false, `credential ${e.credential_id} is not in the passkey store`);
  if (credential.operator !== e.operator)
    return out(false, `credential ${e.credential_id} belongs to ${credential.operator}`);
  try {
    const v = await verifyAuthenticationResponse({
      response: {
        id: e.credential_id,
        rawId: e.credential_id,
        type: "public-key",
        clientExtensionResults: {},
        response: {
          authenticatorData: e.authenticator_data,
          clientDataJSON: e.client_data_json,
          signature: e.signature,
        },
      },
      expectedChallenge: decisionChallenge(e.binding),
      expectedOrigin: e.origin,
      expectedRPID: e.rp_id,
      // The counter was checked when the decision was made; here only the signature matters.
      credential: {
        id: credential.id,
        publicKey: credential.public_key as Uint8Array<ArrayBuffer>,
        counter: 0,
      },
      requireUserVerification: true,
    });
    return v.verified
      ? out(true, `signed by ${e.operator}'s passkey`)
      : out(false, "the signature does not verify");
  } catch (err) {
    return out(false, (err as Error).message);
  }
}
