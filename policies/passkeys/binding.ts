// What a passkey signs. A WebAuthn assertion signs the authenticator data and the hash of the
// client data, which holds the challenge the server chose: so the challenge is made from the
// exact thing being agreed to (a decision on one approval: its id, argument digest, the estimate
// the operator was shown, approve or deny) plus a single-use nonce, and the server recomputes it
// from the approval as stored before it records anything. An assertion made for another
// approval, another decision or an older nonce then carries a different challenge and is refused.
// Pure functions, a small in-memory book of nonces and the sealed sign-in challenges (clock
// injected): no SQLite, no WebAuthn verification here (ceremony.ts does that).

import { createHash, createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import { canonicalJson } from "../digest.js";
import type { CostEstimate } from "../estimate.js";
import { PolicyError } from "../errors.js";
import { systemClock, type Clock } from "../clock.js";

export type Decision = "approve" | "deny";

/** Everything a decision's challenge commits to; kept in the audit record to re-derive it. */
export interface DecisionBinding {
  approval_id: string;
  args_digest: string;
  /** sha256 of the canonical JSON of the estimate shown (null when there was none). */
  estimate_sha256: string;
  decision: Decision;
  nonce: string;
}

/** Approving a pending passkey enrolment: which credential, for which operator. */
export interface EnrolmentBinding {
  credential_id: string;
  operator: string;
  nonce: string;
}

// Domain tags: a challenge of one kind can never equal one of another kind.
const TAGS = {
  decision: "tpu-mcp/passkey/decision/v1",
  enrolment: "tpu-mcp/passkey/enrolment/v1",
  sign_in: "tpu-mcp/passkey/sign-in/v1",
  register: "tpu-mcp/passkey/register/v1",
} as const;
export type ChallengePurpose = keyof typeof TAGS;

export function estimateDigest(estimate: CostEstimate | null | undefined): string {
  return createHash("sha256")
    .update(canonicalJson(estimate ?? null), "utf8")
    .digest("hex");
}

export function decisionBinding(
  approval: { id: string; args_digest: string; estimate: CostEstimate | null },
  decision: Decision,
  nonce: string,
): DecisionBinding {
  return {
    approval_id: approval.id,
    args_digest: approval.args_digest,
    estimate_sha256: estimateDigest(approval.estimate),
    decision,
    nonce,
  };
}

/** base64url(sha256(tag NUL canonical JSON of the binding)): the WebAuthn challenge. */
export function challengeFor(purpose: ChallengePurpose, binding: object): string {
  return createHash("sha256")
    .update(`${TAGS[purpose]}\u0000${canonicalJson(binding)}`, "utf8")
    .digest("base64url");
}

export const decisionChallenge = (b: DecisionBinding) => challengeFor("decision", b);
export const enrolmentChallenge = (b: EnrolmentBinding) => challengeFor("enrolment", b);

export function newNonce(): string {
  return randomBytes(18).toString("base64url");
}

export const refused = (message: string, details: Record<string, unknown> = {}) =>
  new PolicyError("passkey_refused", message, details);

const PER_OWNER = 16;

interface Issued<B> {
  purpose: ChallengePurpose;
  /** Whose ceremony: a console session id, so one session cannot answer another's. */
  owner: string;
  binding: B;
  challenge: string;
  expires: number;
}

/**
 * The nonces the server has handed out and not yet seen back. Each is taken once: a replayed
 * assertion, or one answered after its expiry, finds nothing. In memory on purpose: a restart
 * invalidates ceremonies in flight, and nothing here needs to outlive the process.
 */
export class ChallengeBook {
  private readonly issued = new Map<string, Issued<unknown>>();
  constructor(
    private readonly ttlMs: number,
    private readonly clock: Clock = systemClock,
    private readonly max = 10_000,
  ) {}

  issue<B extends { nonce: string }>(
    purpose: ChallengePurpose,
    owner: string,
    make: (nonce: string) => B,
  ): { nonce: string; challenge: string; binding: B } {
    this.sweep();
    // One owner (a session, a sign-in address) holds at most PER_OWNER open ceremonies: its
    // oldest goes first, so one client cannot crowd out the others' sign-ins.
    const mine = [...this.issued].filter(([, v]) => v.owner === owner);
    if (mine.length >= PER_OWNER) this.issued.delete(mine[0][0]);
    if (this.issued.size >= this.max) throw refused("too many passkey ceremonies in flight");
    const nonce = newNonce();
    const binding = make(nonce);
    const challenge = challengeFor(purpose, binding);
    this.issued.set(nonce, {
      purpose,
      owner,
      binding,
      challenge,
      expires: this.clock() + this.ttlMs,
    });
    return { nonce, challenge, binding };
  }

  /** The ceremony for this nonce, removed whatever happens next (single use). */
  take<B>(nonce: unknown, purpose: ChallengePurpose, owner: string): Issued<B> {
    const entry = typeof nonce === "string" ? this.issued.get(nonce) : undefined;
    if (entry) this.issued.delete(nonce as string);
    if (!entry || entry.purpose !== purpose || entry.owner !== owner)
      throw refused(
        "this passkey challenge is unknown or already used (each is answered once); start again",
      );
    if (this.clock() >= entry.expires)
      throw refused("this passkey challenge expired before it was answered; start again");
    return entry as Issued<B>;
  }

  private sweep() {
    const now = this.clock();
    for (const [k, v] of this.issued) if (now >= v.expires) this.issued.delete(k);
  }
}

/**
 * Sign-in challenges that need no entry until they are answered: the nonce carries its expiry
 * and a MAC under a key of this process, so asking for sign-in options stores nothing and no
 * number of requests from one address (on one machine, every process's) can evict an operator's
 * pending sign-in. Each is still answered once: a nonce seen back is remembered until it expires
 * (at most `maxUsed` at once; then answers are refused until some expire).
 */
export class SealedChallenges {
  private readonly key = randomBytes(32);
  private readonly used = new Map<string, number>();
  constructor(
    private readonly ttlMs: number,
    private readonly clock: Clock = systemClock,
    private readonly maxUsed = 100_000,
  ) {}

  issue(): { nonce: string; challenge: string } {
    const body = `${newNonce()}.${(this.clock() + this.ttlMs).toString(36)}`;
    const nonce = `${body}.${this.mac(body)}`;
    return { nonce, challenge: challengeFor("sign_in", { nonce }) };
  }

  /** The challenge of a nonce this process issued, unexpired and not seen before (single use). */
  take(nonce: unknown): string {
    const unknown = () =>
      refused(
        "this passkey challenge is unknown or already used (each is answered once); start again",
      );
    if (typeof nonce !== "string" || nonce.length > 200) throw unknown();
    const cut = nonce.lastIndexOf(".");
    const body = nonce.slice(0, cut);
    const want = Buffer.from(this.mac(body));
    const got = Buffer.from(nonce.slice(cut + 1));
    if (cut < 0 || want.length !== got.length || !timingSafeEqual(want, got)) throw unknown();
    const expires = parseInt(body.split(".")[1] ?? "", 36);
    const now = this.clock();
    if (!(now < expires))
      throw refused("this passkey challenge expired before it was answered; start again");
    // Insertion order is expiry order (one TTL): the expired ones are at the front.
    for (const [k, until] of this.used) {
      if (now < until) break;
      this.used.delete(k);
    }
    if (this.used.has(nonce)) throw unknown();
    if (this.used.size >= this.maxUsed) throw refused("too many passkey sign-ins in flight");
    this.used.set(nonce, expires);
    return challengeFor("sign_in", { nonce });
  }

  private mac(body: string): string {
    return createHmac("sha256", this.key).update(body).digest("base64url").slice(0, 32);
  }
}
