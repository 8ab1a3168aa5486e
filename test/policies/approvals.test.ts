import { afterAll, describe, expect, it } from "vitest";
import { SqliteApprovalStore } from "../../policies/approvals.js";
import { argsDigest } from "../../policies/digest.js";
import type { PolicyError } from "../../policies/errors.js";
import { FakeClock, tempDir } from "./helpers.js";

const tmp = tempDir();
afterAll(() => tmp.cleanup());

const args = { model: "all-minilm-l6-v2", device: "cpu" };
const digest = argsDigest("load_model", args);

async function setup(file = tmp.file(`a-${Math.random().toString(36).slice(2)}.db`)) {
  const clock = new FakeClock();
  const store = new SqliteApprovalStore(file, { clock: clock.now });
  const rec = await store.create({
    principal: "agent",
    tool: "load_model",
    args_digest: digest,
    args_preview: args,
    estimate: null,
    ttl_s: 900,
  });
  return { clock, store, rec, file };
}

async function codeOf(fn: () => unknown): Promise<string | undefined> {
  try {
    await fn();
    return undefined;
  } catch (e) {
    return (e as PolicyError).code;
  }
}

describe("SqliteApprovalStore", () => {
  it("creates unguessable pending approvals", async () => {
    const { store, rec } = await setup();
    expect(rec.id).toMatch(/^apr_[0-9a-f]{32}$/);
    expect(rec.status).toBe("pending");
    expect(Date.parse(rec.expires_at) - Date.parse(rec.created_at)).toBe(900_000);
    expect((await store.list({ status: "pending" })).map((r) => r.id)).toEqual([rec.id]);
    store.close();
  });

  it("is consumed exactly once by the same principal, tool and arguments", async () => {
    const { store, rec } = await setup();
    expect(
      await codeOf(async () => await store.consume(rec.id, "agent", "load_model", digest)),
    ).toBe("approval_pending");
    await store.approve(rec.id, "operator");
    expect(await store.get(rec.id)).toMatchObject({ status: "approved", decided_by: "operator" });
    expect((await store.consume(rec.id, "agent", "load_model", digest)).status).toBe("used");
    expect(
      await codeOf(async () => await store.consume(rec.id, "agent", "load_model", digest)),
    ).toBe("approval_used");
    store.close();
  });

  it("refuses self-grant", async () => {
    const { store, rec } = await setup();
    expect(await codeOf(async () => await store.approve(rec.id, "agent"))).toBe(
      "approval_self_grant",
    );
    expect(await codeOf(async () => await store.deny(rec.id, "agent"))).toBe("approval_self_grant");
    expect((await store.get(rec.id))!.status).toBe("pending");
    store.close();
  });

  it("refuses another principal (as not found, revealing nothing), tool or arguments", async () => {
    const { store, rec } = await setup();
    await store.approve(rec.id, "operator");
    expect(
      await codeOf(async () => await store.consume(rec.id, "mallory", "load_model", digest)),
    ).toBe("approval_not_found");
    expect(
      await codeOf(async () => await store.consume(rec.id, "agent", "run_benchmark", digest)),
    ).toBe("approval_mismatch");
    const other = argsDigest("load_model", { ...args, dtype: "float16" });
    expect(
      await codeOf(async () => await store.consume(rec.id, "agent", "load_model", other)),
    ).toBe("approval_mismatch");
    expect(
      await codeOf(async () => await store.consume("apr_nope", "agent", "load_model", digest)),
    ).toBe("approval_not_found");
    // Failed attempts do not use it up.
    expect((await store.consume(rec.id, "agent", "load_model", digest)).status).toBe("used");
    store.close();
  });

  it("expires pending approvals, and approved ones after a fresh TTL", async () => {
    const { store, rec, clock } = await setup();
    clock.advance(600_000);
    await store.approve(rec.id, "operator");
    clock.advance(600_000); // past the original expiry, within the TTL restarted on approval
    expect((await store.get(rec.id))!.status).toBe("approved");
    clock.advance(300_000);
    expect((await store.get(rec.id))!.status).toBe("expired");
    expect(
      await codeOf(async () => await store.consume(rec.id, "agent", "load_model", digest)),
    ).toBe("approval_expired");

    const late = await setup();
    late.clock.advance(900_000);
    expect(await codeOf(async () => await late.store.approve(late.rec.id, "operator"))).toBe(
      "approval_expired",
    );
    expect(await late.store.list({ status: "expired" })).toHaveLength(1);
    store.close();
    late.store.close();
  });

  it("records denials with their reason, and decisions are final", async () => {
    const { store, rec } = await setup();
    await store.deny(rec.id, "operator", "too big for today");
    expect(await store.get(rec.id)).toMatchObject({
      status: "denied",
      reason: "too big for today",
    });
    expect(
      await codeOf(async () => await store.consume(rec.id, "agent", "load_model", digest)),
    ).toBe("approval_denied");
    expect(await codeOf(async () => await store.approve(rec.id, "operator2"))).toBe(
      "approval_already_decided",
    );
    store.close();
  });

  it("finds the open approval for the same call", async () => {
    const { store, rec } = await setup();
    expect((await store.findOpen("agent", "load_model", digest))!.id).toBe(rec.id);
    expect(await store.findOpen("agent", "load_model", "0".repeat(64))).toBeUndefined();
    store.close();
  });

  it("keeps the policy version and rule a request was made under; finds it open only under that version", async () => {
    const { store, rec } = await setup();
    const v1 = await store.create({
      principal: "agent",
      tool: "load_model",
      args_digest: digest,
      args_preview: args,
      ttl_s: 900,
      policy_version: "pv_1",
      rule: "every load_model call",
    });
    expect(await store.get(v1.id)).toMatchObject({
      policy_version: "pv_1",
      rule: "every load_model call",
    });
    // `rec` has no version (made before versions were): it counts under any.
    expect(rec.policy_version).toBeNull();
    await store.approve(rec.id, "operator");
    expect((await store.findOpen("agent", "load_model", digest, "pv_2"))!.id).toBe(rec.id);
    store.close();
    const { store: other } = await setup();
    const only = await other.create({
      principal: "agent",
      tool: "load_model",
      args_digest: "1".repeat(64),
      args_preview: args,
      ttl_s: 900,
      policy_version: "pv_1",
    });
    expect((await other.findOpen("agent", "load_model", "1".repeat(64), "pv_1"))!.id).toBe(only.id);
    expect(await other.findOpen("agent", "load_model", "1".repeat(64), "pv_2")).toBeUndefined();
    other.close();
  });

  it("survives reopening the file, and a second handle sees decisions at once", async () => {
    const { store, rec, file, clock } = await setup();
    const cli = new SqliteApprovalStore(file, { clock: clock.now }); // the CLI, concurrently
    await cli.approve(rec.id, "operator");
    expect((await store.get(rec.id))!.status).toBe("approved");
    store.close();
    cli.close();
    const reopened = new SqliteApprovalStore(file, { clock: clock.now });
    expect(await reopened.get(rec.id)).toMatchObject({ status: "approved", args_preview: args });
    expect((await reopened.consume(rec.id, "agent", "load_model", digest)).status).toBe("used");
    reopened.close();
  });
});

// Issue 23, item 1: pending approvals cannot be pushed out of sight, a principal's pending ones
// are capped, and decided ones are pruned after a configured time.
describe("SqliteApprovalStore: paging, the pending cap, pruning", () => {
  const request = (principal: string, n: number, extra: { max_pending?: number } = {}) => ({
    principal,
    tool: "get_job",
    args_digest: `d${n}`,
    args_preview: { n },
    ttl_s: 900,
    ...extra,
  });

  it("lists every pending approval first (soonest to expire first), then the rest newest first", async () => {
    const clock = new FakeClock();
    const store = new SqliteApprovalStore(tmp.file(`p-${Math.random()}.db`), { clock: clock.now });
    const victim = await store.create(request("victim", 0));
    const decided = await store.create(request("victim", 1));
    await store.deny(decided.id, "operator");
    for (let i = 0; i < 250; i++) {
      clock.advance(10);
      await store.create(request("agent", i + 2));
    }
    const page = await store.page({ limit: 100 });
    expect(page.pending_total).toBe(251);
    expect(page.history_total).toBe(1);
    expect(page.items[0].id).toBe(victim.id);
    expect(page.items.every((a) => a.status === "pending")).toBe(true);
    // The last page holds the rest of the pending ones, then the history.
    const last = await store.page({ limit: 100, offset: 200 });
    expect(last.items).toHaveLength(52);
    expect(last.items.at(-1)!.id).toBe(decided.id);
    expect((await store.list({ status: "denied" })).map((a) => a.id)).toEqual([decided.id]);
    store.close();
  });

  it("reads one page through an index, never the whole table", () => {
    const store = new SqliteApprovalStore(tmp.file(`q-${Math.random()}.db`));
    const db = (store as any).db;
    const plan = (sql: string) =>
      (db.prepare(`EXPLAIN QUERY PLAN ${sql}`).all({ now: 0, limit: 1, offset: 0 }) as any[])
        .map((r) => r.detail)
        .join("; ");
    expect(
      plan(
        "SELECT * FROM approvals WHERE status = 'pending' AND expires_ms > @now ORDER BY expires_ms ASC, rowid ASC LIMIT @limit OFFSET @offset",
      ),
    ).toMatch(/USING INDEX approvals_open/);
    store.close();
  });

  it("refuses a principal's request over max_pending with approval_limit, and keeps the older ones", async () => {
    const clock = new FakeClock();
    const store = new SqliteApprovalStore(tmp.file(`c-${Math.random()}.db`), { clock: clock.now });
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
    expect(err?.details).toMatchObject({ pending: 3, limit: 3, retry_after_ms: 900_000 });
    expect((await store.list({ status: "pending" })).map((a) => a.id)).toEqual(
      first.map((a) => a.id),
    );
    // Another principal is not affected, and a decision frees a place.
    expect((await store.create(request("other", 0, { max_pending: 3 }))).status).toBe("pending");
    await store.deny(first[0].id, "operator");
    expect((await store.create(request("agent", 4, { max_pending: 3 }))).status).toBe("pending");
    store.close();
  });

  it("does not count expired requests against the cap: once they expire, new ones are taken", async () => {
    const clock = new FakeClock();
    const store = new SqliteApprovalStore(tmp.file(`x-${Math.random()}.db`), { clock: clock.now });
    for (let i = 0; i < 3; i++) store.create(request("agent", i, { max_pending: 3 }));
    clock.advance(900_000); // all three expire now (ttl_s 900)
    expect(await store.list({ status: "expired" })).toHaveLength(3);
    const next = await store.create(request("agent", 3, { max_pending: 3 }));
    expect(next.status).toBe("pending");
    store.close();
  });

  it("prunes approvals keep_decided_s after they are over, and never an open one", async () => {
    const clock = new FakeClock();
    const file = tmp.file(`k-${Math.random()}.db`);
    const store = new SqliteApprovalStore(file, { clock: clock.now, keepDecidedS: 3600 });
    const denied = await store.create(request("agent", 0));
    await store.deny(denied.id, "operator");
    const open = await store.create(request("agent", 1));
    clock.advance(900_000 + 3_600_000 - 1);
    expect(await store.prune()).toBe(0);
    clock.advance(2);
    expect(await store.prune()).toBe(2); // the denied one, and the pending one that expired an hour ago
    expect(await store.get(denied.id)).toBeUndefined();
    expect(await store.get(open.id)).toBeUndefined();
    const fresh = await store.create(request("agent", 2));
    expect(await store.prune()).toBe(0);
    expect((await store.get(fresh.id))?.status).toBe("pending");
    store.close();
    // Without keepDecidedS (the read-only CLI) nothing is deleted.
    const reader = new SqliteApprovalStore(file, { clock: () => clock.now() + 10 * 86_400_000 });
    expect(await reader.prune()).toBe(0);
    expect((await reader.get(fresh.id))?.status).toBe("expired");
    reader.close();
  });
});
