// The pure parts of passkey decisions: what a challenge commits to, the single-use expiring
// nonces, and the gate's refusal of a token decision on a passkey rule (the credential store's
// counter and enrolment-code rules are its contract: server/stores/passkeys/contract.ts). The WebAuthn ceremonies themselves run in chromium
// (test/browser/passkeys.test.ts).
import { afterAll, describe, expect, it } from "vitest";
import { SqliteApprovalQueue } from "../../server/stores/approvals/sqlite.js";
import { SqliteAuditTrail } from "../../server/stores/audit/sqlite.js";
import type { PolicyError } from "../../policies/errors.js";
import { decideApproval } from "../../policies/gate/approval_flow.js";
import {
  ChallengeBook,
  SealedChallenges,
  decisionBinding,
  decisionChallenge,
  enrolmentChallenge,
  estimateDigest,
} from "../../policies/passkeys/binding.js";
import type { DecisionEvidence } from "../../policies/passkeys/evidence.js";
import type { Principal } from "../../policies/scopes.js";
import { FakeClock, tempDir } from "./helpers.js";

const tmp = tempDir();
afterAll(() => tmp.cleanup());

const approval = {
  id: "apr_" + "1".repeat(32),
  args_digest: "a".repeat(64),
  estimate: { device_seconds: 12, memory_bytes: 2 ** 30, weight_bytes: 2 ** 20, compile_s: 0 },
} as never;

async function rejected(p: Promise<unknown>): Promise<PolicyError> {
  try {
    await p;
  } catch (e) {
    return e as PolicyError;
  }
  throw new Error("expected a refusal");
}

function thrown(fn: () => unknown): PolicyError {
  try {
    fn();
  } catch (e) {
    return e as PolicyError;
  }
  throw new Error("expected a refusal");
}

describe("decision challenge", () => {
  const base = decisionBinding(approval, "approve", "nonce-1");
  const c = decisionChallenge(base);

  it("is a base64url sha256 and the same for the same binding", () => {
    expect(c).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(decisionChallenge(decisionBinding(approval, "approve", "nonce-1"))).toBe(c);
  });

  it.each([
    ["the approval id", { approval_id: "apr_" + "2".repeat(32) }],
    ["the argument digest", { args_digest: "b".repeat(64) }],
    ["the estimate shown", { estimate_sha256: estimateDigest(null) }],
    ["the decision", { decision: "deny" as const }],
    ["the nonce", { nonce: "nonce-2" }],
  ])("changes with %s", (_what, change) => {
    expect(decisionChallenge({ ...base, ...change })).not.toBe(c);
  });

  it("commits to the estimate's content, not its key order", () => {
    const a = estimateDigest({ device_seconds: 1, memory_bytes: 2 } as never);
    const b = estimateDigest({ memory_bytes: 2, device_seconds: 1 } as never);
    expect(a).toBe(b);
    expect(estimateDigest({ device_seconds: 2, memory_bytes: 2 } as never)).not.toBe(a);
  });

  it("never equals a challenge of another purpose over the same fields", () => {
    const e = enrolmentChallenge({ credential_id: "x", operator: "y", nonce: "nonce-1" });
    expect(e).not.toBe(c);
  });
});

describe("ChallengeBook", () => {
  it("hands a nonce back once, to its owner, for its purpose, before it expires", async () => {
    const clock = new FakeClock();
    const book = new ChallengeBook(60_000, clock.now);
    const one = book.issue("decision", "session-a", (n) => decisionBinding(approval, "deny", n));
    expect(one.challenge).toBe(decisionChallenge(one.binding));
    expect((await book.take(one.nonce, "decision", "session-a")).binding).toEqual(one.binding);
    // Replayed: gone.
    expect(thrown(() => book.take(one.nonce, "decision", "session-a")).code).toBe(
      "passkey_refused",
    );
    // Another session's nonce, or one for another ceremony, is refused and burnt.
    const two = book.issue("decision", "session-a", (n) => ({ nonce: n }));
    expect(thrown(() => book.take(two.nonce, "decision", "session-b")).message).toMatch(
      /unknown or already used/,
    );
    expect(thrown(() => book.take(two.nonce, "decision", "session-a")).code).toBe(
      "passkey_refused",
    );
    const three = book.issue("sign_in", "x", (n) => ({ nonce: n }));
    expect(thrown(() => book.take(three.nonce, "decision", "x")).code).toBe("passkey_refused");
    // Expired.
    const four = book.issue("sign_in", "x", (n) => ({ nonce: n }));
    clock.advance(60_000);
    expect(thrown(() => book.take(four.nonce, "sign_in", "x")).message).toMatch(/expired/);
  });

  it("keeps at most 16 open ceremonies per owner, dropping that owner's oldest", async () => {
    const book = new ChallengeBook(60_000);
    const other = book.issue("sign_in", "someone", (n) => ({ nonce: n }));
    const first = book.issue("sign_in", "flooder", (n) => ({ nonce: n }));
    for (let i = 0; i < 16; i++) book.issue("sign_in", "flooder", (n) => ({ nonce: n }));
    expect(thrown(() => book.take(first.nonce, "sign_in", "flooder")).code).toBe("passkey_refused");
    expect((await book.take(other.nonce, "sign_in", "someone")).owner).toBe("someone");
  });
});

describe("decisions on a passkey rule", () => {
  const operator: Principal = { id: "operator", scopes: ["approvals:grant"], via: "token" };

  function setup() {
    const file = tmp.file(`d-${Math.random()}.db`);
    const approvals = new SqliteApprovalQueue(file);
    const audit = new SqliteAuditTrail(file);
    const make = async (assurance: "token" | "passkey") =>
      approvals.create({
        principal: "agent",
        tool: "run_benchmark",
        args_digest: "c".repeat(64),
        args_preview: {},
        estimate: null,
        assurance,
        ttl_s: 60,
      });
    return { approvals, audit, make, deps: { approvals, audit } };
  }

  it("refuses a token decision, saying where to decide, and records the refusal", async () => {
    const { deps, make, audit } = setup();
    const rec = await make("passkey");
    const e = await rejected(
      decideApproval(
        { ...deps, consoleUrl: () => "http://localhost:8000/console/" },
        rec.id,
        operator,
        "approve",
      ),
    );
    expect(e.code).toBe("approval_needs_passkey");
    expect(e.message).toContain(`http://localhost:8000/console/#/approvals/${rec.id}`);
    expect((await deps.approvals.get(rec.id))!.status).toBe("pending");
    expect((await audit.tail(1))[0]).toMatchObject({
      outcome: "denied",
      code: "approval_needs_passkey",
    });
  });

  it("accepts a token decision on a token rule, as before", async () => {
    const { deps, make } = setup();
    const rec = await make("token");
    expect((await decideApproval(deps, rec.id, operator, "approve")).status).toBe("approved");
  });

  it("refuses evidence made for another approval or decision, and records a signed one", async () => {
    const { deps, make, audit } = setup();
    const rec = await make("passkey");
    const other = await make("passkey");
    const evidence = (id: string, decision: "approve" | "deny"): DecisionEvidence => ({
      kind: "webauthn",
      operator: "operator",
      credential_id: "cred",
      rp_id: "localhost",
      origin: "http://localhost:1",
      binding: decisionBinding({ ...rec, id }, decision, "n"),
      authenticator_data: "",
      client_data_json: "",
      signature: "",
      counter: 1,
    });
    const signer = { ...operator, via: "passkey" as const };
    expect(
      (
        await rejected(
          decideApproval(deps, rec.id, signer, "approve", undefined, evidence(other.id, "approve")),
        )
      ).code,
    ).toBe("passkey_refused");
    expect(
      (
        await rejected(
          decideApproval(deps, rec.id, signer, "approve", undefined, evidence(rec.id, "deny")),
        )
      ).code,
    ).toBe("passkey_refused");
    // Evidence signed by another operator's passkey is not this approver's decision.
    const bobs = { ...evidence(rec.id, "approve"), operator: "bob" };
    expect(
      (await rejected(decideApproval(deps, rec.id, signer, "approve", undefined, bobs))).code,
    ).toBe("passkey_refused");
    expect((await deps.approvals.get(rec.id))!.status).toBe("pending");
    const ok = await decideApproval(deps, rec.id, signer, "deny", "no", evidence(rec.id, "deny"));
    expect(ok.status).toBe("denied");
    expect((await audit.tail(1))[0]).toMatchObject({
      outcome: "approval_denied",
      assurance: "passkey",
      evidence: { credential_id: "cred", binding: { approval_id: rec.id, decision: "deny" } },
    });
  });
});

describe("sealed sign-in challenges", () => {
  it("are answered once, expire, and are refused when forged", async () => {
    const clock = new FakeClock();
    const seals = new SealedChallenges(60_000, clock.now);
    const a = seals.issue();
    expect(await seals.take(a.nonce)).toBe(a.challenge);
    expect(thrown(() => seals.take(a.nonce)).message).toMatch(/unknown or already used/);
    const b = seals.issue();
    const forged = b.nonce.replace(/\.[^.]+\./, `.${(clock.ms + 3_600_000).toString(36)}.`);
    expect(thrown(() => seals.take(forged)).message).toMatch(/unknown or already used/);
    expect(thrown(() => seals.take("junk")).code).toBe("passkey_refused");
    clock.advance(60_000);
    expect(thrown(() => seals.take(b.nonce)).message).toMatch(/expired/);
    // Another process (a restart) does not know this one's nonces.
    const c = seals.issue();
    expect(thrown(() => new SealedChallenges(60_000, clock.now).take(c.nonce)).code).toBe(
      "passkey_refused",
    );
  });

  it("store nothing when issued: a flood of sign-in options cannot evict a pending one", async () => {
    const seals = new SealedChallenges(60_000);
    const operators = seals.issue();
    for (let i = 0; i < 10_000; i++) seals.issue();
    expect(await seals.take(operators.nonce)).toBe(operators.challenge);
  });
});
