// The passkey store's contract: one list of cases every backend of Passkeys must pass
// (sqlite.ts, postgres.ts). A test file calls passkeysContract with a factory that opens a fresh,
// empty store on its backend; test/stores/passkeys.test.ts runs it on SQLite,
// test/postgres/contracts.test.ts on a real PostgreSQL. Time moves only through the factory's
// `advance`; where real time can pass between two statements, a case allows a minute of it.
import { describe, expect, it } from "vitest";
import type { PolicyError } from "../../../policies/errors.js";
import type { Passkeys, StoredCredential } from "../../../policies/passkeys/store.js";

export interface PasskeysHandle {
  /** A fresh, empty store. */
  store: Passkeys;
  /** Moves the backend's clock `ms` forward, for every handle on it. */
  advance(ms: number): void | Promise<void>;
  /** Another handle on the same data, as the CLI or another replica opens it. */
  another(): Promise<Passkeys>;
  /** Closes every handle the factory opened. */
  close(): Promise<void>;
}

export type OpenPasskeys = () => Promise<PasskeysHandle>;

/** Real time a backend's own clock may add between two statements of one case. */
const SLACK_MS = 60_000;

type NewCredential = Omit<
  StoredCredential,
  "status" | "enrolled_by" | "created_at" | "last_used_at"
>;

const cred = (id: string, operator = "alice"): NewCredential => ({
  id,
  operator,
  public_key: new Uint8Array([1, 2, 3]),
  counter: 0,
  transports: ["usb", "nfc"],
  aaguid: "00000000-0000-0000-0000-000000000000",
  rp_id: "localhost",
});

async function rejected(p: Promise<unknown>): Promise<PolicyError> {
  try {
    await p;
  } catch (e) {
    return e as PolicyError;
  }
  throw new Error("expected a refusal");
}

/** Enrols `id` for `operator` with a fresh code; the credential as stored. */
async function enrol(store: Passkeys, id: string, operator: string): Promise<StoredCredential> {
  const { code } = await store.createEnrolmentCode(operator, 600);
  return store.addCredential(cred(id, operator), { code });
}

export function passkeysContract(name: string, open: OpenPasskeys): void {
  describe(`Passkeys contract: ${name}`, () => {
    it("bootstraps the first passkey by code; later ones wait for an approval", async () => {
      const { store, close } = await open();
      const { code, expires_at } = await store.createEnrolmentCode("alice", 600);
      expect(code).toMatch(/^[A-Za-z0-9_-]{20}$/);
      expect(Date.parse(expires_at)).toBeGreaterThan(0);
      expect(await store.peekEnrolmentCode(code)).toBe("alice");
      const first = await store.addCredential(cred("cred-alice-1"), { code });
      expect(first).toMatchObject({
        id: "cred-alice-1",
        operator: "alice",
        status: "active",
        enrolled_by: "enrolment-code",
        counter: 0,
        transports: ["usb", "nfc"],
        last_used_at: null,
      });
      expect([...first.public_key]).toEqual([1, 2, 3]);
      // Used twice: refused, for peeking too.
      expect((await rejected(store.addCredential(cred("cred-alice-2"), { code }))).message).toMatch(
        /already used/,
      );
      expect((await rejected(store.peekEnrolmentCode(code))).message).toMatch(/already used/);
      // A code for alice is refused now that she has a passkey.
      expect((await rejected(store.createEnrolmentCode("alice", 600))).code).toBe(
        "passkey_refused",
      );
      // Bob's code works, but his passkey waits: a passkey exists on this server.
      const bob = await store.createEnrolmentCode("bob", 600);
      const pending = await store.addCredential(cred("cred-bob-1", "bob"), { code: bob.code });
      expect(pending).toMatchObject({ status: "pending", enrolled_by: null });
      expect(await store.activeCount()).toBe(1);
      expect(await store.activeCount("bob")).toBe(0);
      expect(await store.activate(pending.id, "cred-alice-1")).toMatchObject({
        status: "active",
        enrolled_by: "cred-alice-1",
      });
      expect(await store.activeCount("bob")).toBe(1);
      // Activated once: a second approval finds nothing waiting.
      expect((await rejected(store.activate(pending.id, "cred-alice-1"))).message).toMatch(
        /no passkey enrolment waits/,
      );
      expect((await rejected(store.activate("cred-nobody", "cred-alice-1"))).code).toBe(
        "passkey_refused",
      );
      await close();
    });

    it("adds a device from a session as pending, and never enrols one credential twice", async () => {
      const { store, close } = await open();
      await enrol(store, "cred-alice-1", "alice");
      const added = await store.addCredential(cred("cred-alice-2"), { session: "s1" });
      expect(added).toMatchObject({ status: "pending", enrolled_by: null });
      expect(
        (await rejected(store.addCredential(cred("cred-alice-2"), { session: "s1" }))).message,
      ).toMatch(/already enrolled/);
      await close();
    });

    it("refuses an unknown code, and an expired one once its TTL has passed", async () => {
      const { store, advance, close } = await open();
      expect((await rejected(store.peekEnrolmentCode("no-such-code"))).message).toMatch(/unknown/);
      expect(
        (await rejected(store.addCredential(cred("x", "carol"), { code: "no-such-code" }))).message,
      ).toMatch(/unknown/);
      const { code } = await store.createEnrolmentCode("carol", 600);
      await advance(600_000 - SLACK_MS);
      expect(await store.peekEnrolmentCode(code)).toBe("carol");
      await advance(SLACK_MS);
      expect((await rejected(store.peekEnrolmentCode(code))).message).toMatch(/expired/);
      expect(
        (await rejected(store.addCredential(cred("cred-carol", "carol"), { code }))).message,
      ).toMatch(/expired/);
      expect(await store.get("cred-carol")).toBeUndefined();
      await close();
    });

    it("a code enrols only its operator, and a refused use leaves it usable", async () => {
      const { store, close } = await open();
      const { code } = await store.createEnrolmentCode("dora", 600);
      expect(
        (await rejected(store.addCredential(cred("cred-eve", "eve"), { code }))).message,
      ).toMatch(/another operator/);
      expect(await store.get("cred-eve")).toBeUndefined();
      expect((await store.addCredential(cred("cred-dora", "dora"), { code })).status).toBe(
        "active",
      );
      await close();
    });

    it("a new code replaces the operator's unused one", async () => {
      const { store, close } = await open();
      const old = await store.createEnrolmentCode("frank", 600);
      const fresh = await store.createEnrolmentCode("frank", 600);
      expect((await rejected(store.peekEnrolmentCode(old.code))).message).toMatch(/unknown/);
      expect(await store.peekEnrolmentCode(fresh.code)).toBe("frank");
      await close();
    });

    it("moves a counter forward only, and another handle sees it", async () => {
      const { store, another, close } = await open();
      await enrol(store, "cred-dave", "dave");
      // An authenticator that keeps no counter sends 0 every time: allowed while the stored is 0.
      await store.advanceCounter("cred-dave", 0);
      await store.advanceCounter("cred-dave", 0);
      await store.advanceCounter("cred-dave", 5);
      expect((await rejected(store.advanceCounter("cred-dave", 5))).message).toMatch(/went back/);
      expect((await rejected(store.advanceCounter("cred-dave", 3))).code).toBe("passkey_refused");
      expect((await rejected(store.advanceCounter("cred-dave", 0))).message).toMatch(
        /went back \(0 after 5\)/,
      );
      expect((await rejected(store.advanceCounter("no-such", 4))).message).toMatch(/not enrolled/);
      const cli = await another();
      const seen = await cli.get("cred-dave");
      expect(seen).toMatchObject({ counter: 5, status: "active" });
      expect(seen!.last_used_at).not.toBeNull();
      expect((await rejected(cli.advanceCounter("cred-dave", 4))).code).toBe("passkey_refused");
      await cli.advanceCounter("cred-dave", 6);
      expect((await store.get("cred-dave"))!.counter).toBe(6);
      await close();
    });

    it("lists passkeys in the order they were enrolled, all or one operator's", async () => {
      const { store, advance, close } = await open();
      await enrol(store, "cred-z", "zoe");
      await advance(1000);
      await store.addCredential(cred("cred-a", "zoe"), { session: "s" });
      await advance(1000);
      await enrol(store, "cred-m", "mia");
      expect((await store.list()).map((c) => c.id)).toEqual(["cred-z", "cred-a", "cred-m"]);
      expect((await store.list("zoe")).map((c) => c.id)).toEqual(["cred-z", "cred-a"]);
      expect(await store.list("nobody")).toEqual([]);
      await close();
    });

    it("keeps a removed passkey's public key, and lets its operator enrol again by code", async () => {
      const { store, close } = await open();
      await enrol(store, "cred-erin", "erin");
      expect(await store.removeOperator("erin")).toBe(1);
      expect(await store.removeOperator("erin")).toBe(0);
      expect(await store.get("cred-erin")).toMatchObject({ status: "removed" });
      expect([...(await store.get("cred-erin"))!.public_key]).toEqual([1, 2, 3]);
      expect(await store.activeCount()).toBe(0);
      // The recovery: a new code, and (no passkey left anywhere) the new passkey is the first.
      const again = await enrol(store, "cred-erin-2", "erin");
      expect(again.status).toBe("active");
      await close();
    });
  });
}
