// `tpu-mcp audit verify` re-verifies each passkey decision's evidence (policies/passkeys/
// evidence.ts): the signature over the stored authenticator and client data with the enrolled
// public key, and that what was signed is what the record says was decided. A software
// authenticator (its own P-256 key) signs real assertions here, so a record whose outcome was
// changed after a valid signature is caught by the binding check, not by a broken signature.
import { createHash, generateKeyPairSync, sign } from "node:crypto";
import { isoCBOR } from "@simplewebauthn/server/helpers";
import { describe, expect, it } from "vitest";
import {
  decisionBinding,
  decisionChallenge,
  type Decision,
} from "../../policies/passkeys/binding.js";
import { verifyDecisionEvidence, type DecisionEvidence } from "../../policies/passkeys/evidence.js";
import type { StoredCredential } from "../../policies/passkeys/store.js";

const origin = "http://localhost:7801";
const rpId = "localhost";
const { privateKey, publicKey } = generateKeyPairSync("ec", { namedCurve: "P-256" });
const jwk = publicKey.export({ format: "jwk" });
const coseKey = isoCBOR.encode(
  new Map<number, number | Uint8Array>([
    [1, 2], // kty: EC2
    [3, -7], // alg: ES256
    [-1, 1], // crv: P-256
    [-2, Buffer.from(jwk.x!, "base64url")],
    [-3, Buffer.from(jwk.y!, "base64url")],
  ]),
);
const credential = {
  id: "Y3JlZC1hbGljZQ",
  operator: "alice",
  public_key: new Uint8Array(coseKey),
  counter: 0,
  rp_id: rpId,
  status: "active",
} as unknown as StoredCredential;

const approval = {
  id: "apr_" + "3".repeat(32),
  args_digest: "e".repeat(64),
  estimate: { device_seconds: 3, memory_bytes: 1, weight_bytes: 1, compile_s: 0 },
} as never;

/** What the console keeps after alice's passkey signed `decision` on the approval. */
function signed(decision: Decision): DecisionEvidence {
  const binding = decisionBinding(approval, decision, "nonce-1");
  const clientData = Buffer.from(
    JSON.stringify({ type: "webauthn.get", challenge: decisionChallenge(binding), origin }),
  );
  const counter = Buffer.alloc(4);
  counter.writeUInt32BE(7);
  const authData = Buffer.concat([
    createHash("sha256").update(rpId).digest(),
    Buffer.from([0x05]), // user present + user verified
    counter,
  ]);
  const signature = sign(
    "sha256",
    Buffer.concat([authData, createHash("sha256").update(clientData).digest()]),
    privateKey,
  );
  return {
    kind: "webauthn",
    operator: "alice",
    credential_id: credential.id,
    rp_id: rpId,
    origin,
    binding,
    authenticator_data: authData.toString("base64url"),
    client_data_json: clientData.toString("base64url"),
    signature: signature.toString("base64url"),
    counter: 7,
  };
}

const record = (outcome: "approval_granted" | "approval_denied", evidence: DecisionEvidence) => ({
  seq: 12,
  approval_id: (approval as { id: string }).id,
  args_digest: (approval as { args_digest: string }).args_digest,
  outcome,
  evidence,
});

describe("re-verifying a passkey decision's evidence", () => {
  it("accepts a decision signed for what the record says", async () => {
    const check = await verifyDecisionEvidence(
      record("approval_denied", signed("deny")),
      credential,
    );
    expect(check).toMatchObject({ ok: true, reason: "signed by alice's passkey" });
  });

  it("refuses a record whose decision differs from the one signed (a denial rewritten as a grant)", async () => {
    const check = await verifyDecisionEvidence(
      record("approval_granted", signed("deny")),
      credential,
    );
    expect(check.ok).toBe(false);
    expect(check.reason).toMatch(/signs "deny" but the record says approve/);
  });

  it("refuses evidence bound to other arguments, a tampered signature, and a missing credential", async () => {
    const moved = { ...record("approval_denied", signed("deny")), args_digest: "f".repeat(64) };
    expect((await verifyDecisionEvidence(moved, credential)).ok).toBe(false);
    const e = signed("deny");
    const bad = { ...e, signature: signed("approve").signature };
    expect((await verifyDecisionEvidence(record("approval_denied", bad), credential)).ok).toBe(
      false,
    );
    expect((await verifyDecisionEvidence(record("approval_denied", e), undefined)).ok).toBe(false);
  });
});
