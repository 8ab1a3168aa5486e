// The server's side of the WebAuthn ceremonies, through @simplewebauthn/server (a maintained
// implementation of the spec's verification steps: client data, RP ID hash, flags, signature,
// attestation). This file decides what is asked and what is accepted:
//   - user verification is required in every ceremony (a PIN or a biometric, not a touch);
//   - a challenge is single-use and made from what is being agreed to (binding.ts);
//   - only active credentials sign; their counters must move forward (store.ts);
//   - with policy.passkeys.allowed_aaguids, only those authenticator models may enrol.
// The expected origin and RP ID come from the console request (its Host header, which the HTTP
// layer already checked against the allowed hosts); a credential keeps the RP ID it was made for.

import {
  generateAuthenticationOptions,
  generateRegistrationOptions,
  verifyAuthenticationResponse,
  verifyRegistrationResponse,
  type AuthenticationResponseJSON,
  type PublicKeyCredentialCreationOptionsJSON,
  type PublicKeyCredentialRequestOptionsJSON,
  type RegistrationResponseJSON,
} from "@simplewebauthn/server";
import { isoBase64URL } from "@simplewebauthn/server/helpers";
import type { ApprovalRecord } from "../approval_record.js";
import { systemClock, type Clock } from "../clock.js";
import type { PasskeysConfig } from "../config.js";
import { isPolicyError } from "../errors.js";
import {
  ChallengeBook,
  decisionBinding,
  decisionChallenge,
  refused,
  SealedChallenges,
  type Decision,
  type DecisionBinding,
  type EnrolmentBinding,
} from "./binding.js";
import type { DecisionEvidence } from "./evidence.js";
import type { Passkeys, StoredCredential } from "./store.js";

/** Where a ceremony runs: the console's origin and the RP ID (its host name). */
export interface Site {
  origin: string;
  rpId: string;
}

/** A verified assertion: who signed, with which credential, and what to keep as evidence. */
export interface VerifiedAssertion {
  operator: string;
  credential: StoredCredential;
  counter: number;
  response: AuthenticationResponseJSON;
}

const RP_NAME = "tpu-mcp";

/** Registration and assertion responses arrive as JSON from the page: only their shape is trusted. */
function asResponse<T>(x: unknown): T {
  const r = x as { id?: unknown; rawId?: unknown; response?: unknown; type?: unknown };
  if (
    !r ||
    typeof r.id !== "string" ||
    typeof r.rawId !== "string" ||
    typeof r.response !== "object" ||
    r.type !== "public-key"
  )
    throw refused("not a WebAuthn credential response");
  return x as T;
}

export class PasskeyCeremonies {
  private readonly book: ChallengeBook;
  private readonly signIns: SealedChallenges;
  private readonly clock: Clock;

  constructor(
    private readonly store: Passkeys,
    private readonly config: PasskeysConfig,
    opts: { clock?: Clock } = {},
  ) {
    this.clock = opts.clock ?? systemClock;
    this.book = new ChallengeBook(config.challenge_ttl_s * 1000, this.clock);
    this.signIns = new SealedChallenges(config.challenge_ttl_s * 1000, this.clock);
  }

  passkeyCount(): Promise<number> {
    return this.store.activeCount();
  }

  // ---- registration --------------------------------------------------------------------------

  /**
   * Options to create a passkey for `operator`: by a code (`via.code`, the first passkey) or from
   * a signed-in passkey session (another device; it waits for an approval).
   */
  async registrationOptions(
    owner: string,
    site: Site,
    via: { code: string } | { operator: string },
  ): Promise<{ nonce: string; options: PublicKeyCredentialCreationOptionsJSON }> {
    const operator = "code" in via ? await this.store.peekEnrolmentCode(via.code) : via.operator;
    const { nonce, challenge } = this.book.issue("register", owner, (n) => ({
      operator,
      nonce: n,
    }));
    const options = await generateRegistrationOptions({
      rpName: RP_NAME,
      rpID: site.rpId,
      userName: operator,
      challenge: isoBase64URL.toBuffer(challenge),
      attestationType: this.config.allowed_aaguids ? "direct" : "none",
      excludeCredentials: (await this.store.list(operator))
        .filter((c) => c.status !== "removed")
        .map((c) => ({ id: c.id })),
      // Discoverable, so sign-in needs no name; user verification in every ceremony.
      authenticatorSelection: { residentKey: "required", userVerification: "required" },
      timeout: this.config.challenge_ttl_s * 1000,
    });
    return { nonce, options };
  }

  async register(
    owner: string,
    site: Site,
    nonce: unknown,
    raw: unknown,
    via: { code: string } | { operator: string },
  ): Promise<StoredCredential> {
    const entry = this.book.take<{ operator: string }>(nonce, "register", owner);
    const response = asResponse<RegistrationResponseJSON>(raw);
    const v = await this.guard(() =>
      verifyRegistrationResponse({
        response,
        expectedChallenge: entry.challenge,
        expectedOrigin: site.origin,
        expectedRPID: site.rpId,
        requireUserVerification: true,
      }),
    );
    if (!v.verified) throw refused("the new passkey could not be verified");
    const info = v.registrationInfo;
    const allowed = this.config.allowed_aaguids;
    if (allowed && (info.fmt === "none" || !allowed.includes(info.aaguid.toLowerCase())))
      throw refused(
        `this authenticator (AAGUID ${info.aaguid}, attestation ${info.fmt}) is not in policy.passkeys.allowed_aaguids`,
        { aaguid: info.aaguid },
      );
    return this.store.addCredential(
      {
        id: info.credential.id,
        operator: entry.binding.operator,
        public_key: info.credential.publicKey,
        counter: info.credential.counter,
        transports: info.credential.transports ?? [],
        aaguid: info.aaguid,
        rp_id: site.rpId,
      },
      "code" in via ? { code: via.code } : { session: owner },
    );
  }

  // ---- assertions ----------------------------------------------------------------------------

  private async requestOptions(
    site: Site,
    challenge: string,
    credentials?: StoredCredential[],
  ): Promise<PublicKeyCredentialRequestOptionsJSON> {
    return generateAuthenticationOptions({
      rpID: site.rpId,
      challenge: isoBase64URL.toBuffer(challenge),
      userVerification: "required",
      allowCredentials: credentials?.map((c) => ({
        id: c.id,
        transports: c.transports as never,
      })),
      timeout: this.config.challenge_ttl_s * 1000,
    });
  }

  /**
   * Sign-in: any enrolled, active passkey (discoverable: the authenticator offers its own). The
   * challenge is sealed, not booked: asking for options before any session stores nothing, so
   * nobody's requests can evict the operator's pending sign-in.
   */
  async signInOptions(site: Site) {
    const { nonce, challenge } = this.signIns.issue();
    return { nonce, options: await this.requestOptions(site, challenge) };
  }

  async signIn(site: Site, nonce: unknown, raw: unknown) {
    return this.verifyAssertion(site, this.signIns.take(nonce), raw);
  }

  /** A decision on `approval`: the challenge commits to the approval as stored and the decision. */
  async decisionOptions(
    owner: string,
    site: Site,
    approval: ApprovalRecord,
    decision: Decision,
    operator: string,
  ) {
    const { nonce, challenge } = this.book.issue("decision", owner, (n) =>
      decisionBinding(approval, decision, n),
    );
    return {
      nonce,
      options: await this.requestOptions(site, challenge, await this.activeOf(operator)),
    };
  }

  /**
   * Verifies a decision's assertion against the approval as it is stored now and the decision
   * asked for: the challenge is recomputed from them, never taken from the page or the book.
   */
  async verifyDecision(
    owner: string,
    site: Site,
    nonce: unknown,
    raw: unknown,
    approval: ApprovalRecord,
    decision: Decision,
  ): Promise<DecisionEvidence> {
    const entry = this.book.take<DecisionBinding>(nonce, "decision", owner);
    const binding = decisionBinding(approval, decision, entry.binding.nonce);
    const a = await this.verifyAssertion(site, decisionChallenge(binding), raw);
    return {
      kind: "webauthn",
      operator: a.operator,
      credential_id: a.credential.id,
      rp_id: a.credential.rp_id,
      origin: site.origin,
      binding,
      authenticator_data: a.response.response.authenticatorData,
      client_data_json: a.response.response.clientDataJSON,
      signature: a.response.response.signature,
      counter: a.counter,
    };
  }

  /** Approving another passkey's enrolment: bound to that credential and its operator. */
  async enrolmentOptions(owner: string, site: Site, pending: StoredCredential, operator: string) {
    const { nonce, challenge } = this.book.issue<EnrolmentBinding>("enrolment", owner, (n) => ({
      credential_id: pending.id,
      operator: pending.operator,
      nonce: n,
    }));
    return {
      nonce,
      options: await this.requestOptions(site, challenge, await this.activeOf(operator)),
    };
  }

  async approveEnrolment(
    owner: string,
    site: Site,
    nonce: unknown,
    raw: unknown,
    pending: StoredCredential,
  ): Promise<{ approver: VerifiedAssertion; credential: StoredCredential }> {
    const entry = this.book.take<EnrolmentBinding>(nonce, "enrolment", owner);
    if (entry.binding.credential_id !== pending.id || entry.binding.operator !== pending.operator)
      throw refused("this challenge was made for another enrolment");
    const approver = await this.verifyAssertion(site, entry.challenge, raw);
    if (approver.credential.id === pending.id) throw refused("a passkey cannot approve itself");
    return {
      approver,
      credential: await this.store.activate(pending.id, approver.credential.id),
    };
  }

  private async activeOf(operator: string): Promise<StoredCredential[]> {
    const mine = (await this.store.list(operator)).filter((c) => c.status === "active");
    if (mine.length === 0)
      throw refused(`${operator} has no enrolled passkey; enrol one first (Passkeys page)`);
    return mine;
  }

  /** The checks every assertion passes, then the counter moves forward (or the assertion fails). */
  private async verifyAssertion(
    site: Site,
    expectedChallenge: string,
    raw: unknown,
  ): Promise<VerifiedAssertion> {
    const response = asResponse<AuthenticationResponseJSON>(raw);
    const credential = await this.store.get(response.id);
    if (!credential || credential.status !== "active")
      throw refused(
        credential?.status === "pending"
          ? "this passkey's enrolment is still waiting for an approval by an existing passkey"
          : credential
            ? "this passkey was removed (`tpu-mcp operators remove`); it no longer signs"
            : "this passkey is not enrolled here",
      );
    if (credential.rp_id !== site.rpId)
      throw refused(`this passkey was enrolled for ${credential.rp_id}, not ${site.rpId}`);
    const v = await this.guard(() =>
      verifyAuthenticationResponse({
        response,
        expectedChallenge,
        expectedOrigin: site.origin,
        expectedRPID: credential.rp_id,
        credential: {
          id: credential.id,
          publicKey: credential.public_key as Uint8Array<ArrayBuffer>,
          counter: credential.counter,
          transports: credential.transports as never,
        },
        requireUserVerification: true,
      }),
    );
    // The library answers a wrong signature with verified: false (a missing UV flag throws).
    if (!v.verified)
      throw refused("the signature does not verify with this passkey's enrolled public key");
    if (!v.authenticationInfo.userVerified)
      throw refused("the assertion did not verify (user verification is required)");
    await this.store.advanceCounter(credential.id, v.authenticationInfo.newCounter);
    return {
      operator: credential.operator,
      credential,
      counter: v.authenticationInfo.newCounter,
      response,
    };
  }

  /** The library throws plain Errors with a reason; they become passkey_refused with it. */
  private async guard<T>(fn: () => Promise<T>): Promise<T> {
    try {
      return await fn();
    } catch (e) {
      if (isPolicyError(e)) throw e;
      const msg = (e as Error).message ?? String(e);
      if (/counter/i.test(msg))
        throw refused(
          `the passkey's signature counter went back (${msg}): a cloned or replayed authenticator; the assertion was refused`,
        );
      if (/challenge/i.test(msg))
        throw refused(
          `the assertion was made for another challenge (another approval, decision or ceremony): ${msg}`,
        );
      throw refused(`the passkey response was refused: ${msg}`);
    }
  }

  /** For tests: the clock the book reads. */
  now(): number {
    return this.clock();
  }
}
