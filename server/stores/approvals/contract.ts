// The approval queue's contract: one list of cases every backend of ApprovalQueue must pass
// (sqlite.ts, postgres.ts). A test file calls approvalsContract with a factory that opens a fresh,
// empty store on its backend; test/stores/approvals.test.ts runs it on SQLite,
// test/postgres/contracts.test.ts on a real PostgreSQL. Time moves only through the factory's
// `advance`, so expiry and ordering are checked the same way on a backend whose clock is the
// database's; where real time can pass between two statements, a case allows a minute of it.
import { describe, expect, it } from "vitest";
import type { ApprovalEvent, ApprovalQueue } from "../../../policies/approval_record.js";
import { argsDigest } from "../../../policies/digest.js";
import type { PolicyError } from "../../../policies/errors.js";

export interface ApprovalsHandle {
  /** A fresh, empty queue. */
  store: ApprovalQueue;
  /** Moves the backend's clock `ms` forward, for every handle on it. */
  advance(ms: number): void | Promise<void>;
  /** Another handle on the same data, as the CLI or another replica opens it. */
  another(opts?: { keepDecidedS?: number }): Promise<ApprovalQueue>;
  /** Closes every handle the factory opened. */
  close(): Promise<void>;
}

/** Opens a fresh queue on one backend (`keepDecidedS`: approvals.keep_decided_s, pruning on). */
export type OpenApprovals = (opts: { keepDecidedS?: number }) => Promise<ApprovalsHandle>;

/** Real time a backend's own clock may add between two statements of one case. */
const SLACK_MS = 60_000;

const args = { model: "all-minilm-l6-v2", device: "cpu" };
const digest = argsDigest("load_model", args);
const call = {
  principal: "agent",
  tool: "load_model",
  args_digest: digest,
  args_preview: args,
  estimate: null,
  ttl_s: 900,
};
const request = (principal: string, n: number, extra: { max_pending?: number } = {}) => ({
  principal,
  tool: "get_job",
  args_digest: `d${n}`,
  args_preview: { n },
  ttl_s: 900,
  ...extra,
});

async function codeOf(fn: () => Promise<unknown>): Promise<string | undefined> {
  try {
    await fn();
    return undefined;
  } catch (e) {
    return (e as PolicyError).code;
  }
}

export function approvalsContract(name: string, open: OpenApprovals): void {
  describe(`ApprovalQueue contract: ${name}`, () => {
    /** A fresh queue with one pending request for `call`. */
    async function setup(opts: { keepDecidedS?: number } = {}) {
      const h = await open(opts);
      const rec = await h.store.create(call);
      return { ...h, rec };
    }

    it("creates unguessable pending approvals that expire one TTL after they were made", async () => {
      const { store, rec, close } = await setup();
      expect(rec.id).toMatch(/^apr_[0-9a-f]{32}$/);
      expect(rec.status).toBe("pending");
      expect(Date.parse(rec.expires_at) - Date.parse(rec.created_at)).toBe(900_000);
      expect((await store.list({ status: "pending" })).map((r) => r.id)).toEqual([rec.id]);
      await close();
    });

    it("is consumed exactly once by the same principal, tool and arguments", async () => {
      const { store, rec, close } = await setup();
      expect(await codeOf(() => store.consume(rec.id, "agent", "load_model", digest))).toBe(
        "approval_pending",
      );
      await store.approve(rec.id, "operator");
      expect(await store.get(rec.id)).toMatchObject({ status: "approved", decided_by: "operator" });
      expect((await store.consume(rec.id, "agent", "load_model", digest)).status).toBe("used");
      expect(await codeOf(() => store.consume(rec.id, "agent", "load_model", digest))).toBe(
        "approval_used",
      );
      await close();
    });

    it("refuses self-grant, and the approval stays pending", async () => {
      const { store, rec, close } = await setup();
      expect(await codeOf(() => store.approve(rec.id, "agent"))).toBe("approval_self_grant");
      expect(await codeOf(() => store.deny(rec.id, "agent"))).toBe("approval_self_grant");
      expect((await store.get(rec.id))!.status).toBe("pending");
      await close();
    });

    it("refuses another principal (as not found, revealing nothing), tool or arguments", async () => {
      const { store, rec, close } = await setup();
      await store.approve(rec.id, "operator");
      expect(await codeOf(() => store.consume(rec.id, "mallory", "load_model", digest))).toBe(
        "approval_not_found",
      );
      expect(await codeOf(() => store.consume(rec.id, "agent", "run_benchmark", digest))).toBe(
        "approval_mismatch",
      );
      const other = argsDigest("load_model", { ...args, dtype: "float16" });
      expect(await codeOf(() => store.consume(rec.id, "agent", "load_model", other))).toBe(
        "approval_mismatch",
      );
      expect(await codeOf(() => store.consume("apr_nope", "agent", "load_model", digest))).toBe(
        "approval_not_found",
      );
      expect(await codeOf(() => store.approve("apr_nope", "operator"))).toBe("approval_not_found");
      // Failed attempts do not use it up.
      expect((await store.consume(rec.id, "agent", "load_model", digest)).status).toBe("used");
      await close();
    });

    it("expires pending approvals, and approved ones a fresh TTL after the approval", async () => {
      const { store, rec, advance, close } = await setup();
      await advance(600_000);
      await store.approve(rec.id, "operator");
      const late = await store.create(call);
      await advance(600_000); // past the first expiry, within the TTL restarted on approval
      expect((await store.get(rec.id))!.status).toBe("approved");
      expect((await store.get(late.id))!.status).toBe("pending");
      await advance(300_000);
      expect((await store.get(rec.id))!.status).toBe("expired");
      expect(await codeOf(() => store.consume(rec.id, "agent", "load_model", digest))).toBe(
        "approval_expired",
      );
      expect(await codeOf(() => store.approve(late.id, "operator"))).toBe("approval_expired");
      expect((await store.list({ status: "expired" })).map((r) => r.id).sort()).toEqual(
        [rec.id, late.id].sort(),
      );
      expect(await store.findOpen("agent", "load_model", digest)).toBeUndefined();
      await close();
    });

    it("records denials with their reason, and decisions are final", async () => {
      const { store, rec, close } = await setup();
      await store.deny(rec.id, "operator", "too big for today");
      expect(await store.get(rec.id)).toMatchObject({
        status: "denied",
        reason: "too big for today",
        decided_by: "operator",
      });
      expect(await codeOf(() => store.consume(rec.id, "agent", "load_model", digest))).toBe(
        "approval_denied",
      );
      expect(await codeOf(() => store.approve(rec.id, "operator2"))).toBe(
        "approval_already_decided",
      );
      await close();
    });

    it("finds the open approval for the same call, an approved one before a newer pending one", async () => {
      const { store, rec, advance, close } = await setup();
      expect((await store.findOpen("agent", "load_model", digest))!.id).toBe(rec.id);
      expect(await store.findOpen("agent", "load_model", "0".repeat(64))).toBeUndefined();
      await store.approve(rec.id, "operator");
      await advance(1000);
      const newer = await store.create(call);
      expect((await store.findOpen("agent", "load_model", digest))!.id).toBe(rec.id);
      await store.consume(rec.id, "agent", "load_model", digest);
      expect((await store.findOpen("agent", "load_model", digest))!.id).toBe(newer.id);
      await close();
    });

    it("keeps the policy version and rule a request was made under; finds it open only under that version", async () => {
      const { store, rec, close } = await setup();
      const v1 = await store.create({ ...call, policy_version: "pv_1", rule: "every load" });
      expect(await store.get(v1.id)).toMatchObject({ policy_version: "pv_1", rule: "every load" });
      // `rec` has no version (made before versions were): it counts under any.
      expect(rec.policy_version).toBeNull();
      await store.approve(rec.id, "operator");
      expect((await store.findOpen("agent", "load_model", digest, "pv_2"))!.id).toBe(rec.id);
      const only = await store.create({
        ...call,
        args_digest: "1".repeat(64),
        policy_version: "pv_1",
      });
      expect((await store.findOpen("agent", "load_model", "1".repeat(64), "pv_1"))!.id).toBe(
        only.id,
      );
      expect(await store.findOpen("agent", "load_model", "1".repeat(64), "pv_2")).toBeUndefined();
      await close();
    });

    it("a second handle sees decisions at once, and the data outlives the first handle", async () => {
      const { store, rec, another, close } = await setup();
      const cli = await another();
      await cli.approve(rec.id, "operator");
      expect((await store.get(rec.id))!.status).toBe("approved");
      await store.close();
      const reopened = await another();
      expect(await reopened.get(rec.id)).toMatchObject({ status: "approved", args_preview: args });
      expect((await reopened.consume(rec.id, "agent", "load_model", digest)).status).toBe("used");
      expect(await codeOf(() => cli.consume(rec.id, "agent", "load_model", digest))).toBe(
        "approval_used",
      );
      await close();
    });

    it("tells subscribers each change once it is made, and moves the change mark", async () => {
      const { store, close } = await open({});
      const events: ApprovalEvent[] = [];
      const stop = store.subscribe((e) => events.push(e));
      const mark = store.changeMark();
      const rec = await store.create(call);
      expect(store.changeMark()).not.toBe(mark);
      await store.approve(rec.id, "operator");
      await store.consume(rec.id, "agent", "load_model", digest);
      expect(events.map((e) => [e.type, e.record.status])).toEqual([
        ["created", "pending"],
        ["decided", "approved"],
        ["used", "used"],
      ]);
      stop();
      await store.create(call);
      expect(events).toHaveLength(3);
      await close();
    });

    it("gives back a used approval only to its own call and before its expiry", async () => {
      const { store, rec, advance, close } = await setup();
      await store.approve(rec.id, "operator");
      await store.consume(rec.id, "agent", "load_model", digest);
      expect(await store.restoreUsed(rec.id, "mallory", "load_model", digest)).toBeUndefined();
      expect(
        await store.restoreUsed(rec.id, "agent", "load_model", "0".repeat(64)),
      ).toBeUndefined();
      expect(await store.restoreUsed(rec.id, "agent", "load_model", digest)).toMatchObject({
        status: "approved",
        used_at: null,
      });
      // Given back once: it is approved now, not used.
      expect(await store.restoreUsed(rec.id, "agent", "load_model", digest)).toBeUndefined();
      await store.consume(rec.id, "agent", "load_model", digest);
      await advance(900_000);
      expect(await store.restoreUsed(rec.id, "agent", "load_model", digest)).toBeUndefined();
      expect((await store.get(rec.id))!.status).toBe("used");
      await close();
    });

    // Issue 23, item 1: pending approvals cannot be pushed out of sight, a principal's pending
    // ones are capped, and decided ones are pruned after a configured time.
    it("lists every pending approval first (soonest to expire first), then the rest newest first", async () => {
      const { store, advance, close } = await open({});
      const victim = await store.create(request("victim", 0));
      const decided = await store.create(request("victim", 1));
      await store.deny(decided.id, "operator");
      for (let i = 0; i < 250; i++) {
        await advance(10);
        await store.create(request("agent", i + 2));
      }
      const page = await store.page({ limit: 100 });
      expect(page.pending_total).toBe(251);
      expect(page.history_total).toBe(1);
      expect(page.items[0].id).toBe(victim.id);
      expect(page.items.every((a) => a.status === "pending")).toBe(true);
      const expiries = page.items.map((a) => Date.parse(a.expires_at));
      expect(expiries).toEqual([...expiries].sort((a, b) => a - b));
      // The last page holds the rest of the pending ones, then the history.
      const last = await store.page({ limit: 100, offset: 200 });
      expect(last.items).toHaveLength(52);
      expect(last.items.at(-1)!.id).toBe(decided.id);
      expect((await store.list({ status: "denied" })).map((a) => a.id)).toEqual([decided.id]);
      // The history alone, newest first.
      await advance(10);
      const later = await store.create(request("victim", 2));
      await store.deny(later.id, "operator");
      expect((await store.list({ status: "denied" })).map((a) => a.id)).toEqual([
        later.id,
        decided.id,
      ]);
      await close();
    });

    it("refuses a principal's request over max_pending with approval_limit, and keeps the older ones", async () => {
      const { store, close } = await open({});
      const first = [];
      for (const i of [0, 1, 2])
        first.push(await store.create(request("agent", i, { max_pending: 3 })));
      let err: PolicyError | undefined;
      try {
        await store.create(request("agent", 3, { max_pending: 3 }));
      } catch (e) {
        err = e as PolicyError;
      }
      expect(err?.code).toBe("approval_limit");
      expect(err?.message).toMatch(/refused/);
      expect(err?.details).toMatchObject({ pending: 3, limit: 3 });
      // The wait is until the first pending one expires.
      const retry = (err?.details as { retry_after_ms: number }).retry_after_ms;
      expect(retry).toBeLessThanOrEqual(900_000);
      expect(retry).toBeGreaterThan(900_000 - SLACK_MS);
      expect((await store.list({ status: "pending" })).map((a) => a.id).sort()).toEqual(
        first.map((a) => a.id).sort(),
      );
      // Another principal is not affected, and a decision frees a place.
      expect((await store.create(request("other", 0, { max_pending: 3 }))).status).toBe("pending");
      await store.deny(first[0].id, "operator");
      expect((await store.create(request("agent", 4, { max_pending: 3 }))).status).toBe("pending");
      await close();
    });

    it("does not count expired requests against the cap: once they expire, new ones are taken", async () => {
      const { store, advance, close } = await open({});
      for (let i = 0; i < 3; i++) await store.create(request("agent", i, { max_pending: 3 }));
      await advance(900_000); // all three expire now (ttl_s 900)
      expect(await store.list({ status: "expired" })).toHaveLength(3);
      const next = await store.create(request("agent", 3, { max_pending: 3 }));
      expect(next.status).toBe("pending");
      await close();
    });

    it("prunes approvals keep_decided_s after they are over, and never an open one", async () => {
      const { store, advance, another, close } = await open({ keepDecidedS: 3600 });
      const denied = await store.create(request("agent", 0));
      await store.deny(denied.id, "operator");
      const open1 = await store.create(request("agent", 1));
      await advance(900_000 + 3_600_000 - SLACK_MS);
      expect(await store.prune()).toBe(0);
      await advance(SLACK_MS + 1);
      expect(await store.prune()).toBe(2); // the denied one, and the pending one that expired an hour ago
      expect(await store.get(denied.id)).toBeUndefined();
      expect(await store.get(open1.id)).toBeUndefined();
      const fresh = await store.create(request("agent", 2));
      expect(await store.prune()).toBe(0);
      expect((await store.get(fresh.id))?.status).toBe("pending");
      // Without keepDecidedS (the read-only CLI) nothing is deleted.
      const reader = await another();
      await advance(10 * 86_400_000);
      expect(await reader.prune()).toBe(0);
      expect((await reader.get(fresh.id))?.status).toBe("expired");
      await close();
    });
  });
}
