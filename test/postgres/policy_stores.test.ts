// The policy stores on a real PostgreSQL, with three pools standing for three replicas racing:
// an approval is decided once and used once, the per-principal pending cap holds, a passkey's
// counter never goes back, an enrolment code is used once, an alert fires once per window, the
// console's sessions are shared (and their cap holds), and a change made through one replica is
// heard by the others' subscribers (LISTEN/NOTIFY), the console's live list among them.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SqliteAuditTrail } from "../../server/stores/audit/sqlite.js";
import { parsePolicyConfig } from "../../policies/config.js";
import { Gate, type ElicitPrompt } from "../../policies/gate/gate.js";
import { SqliteBudgetLedger } from "../../policies/limits/budget.js";
import { ConcurrencyLimiter } from "../../policies/limits/concurrency.js";
import { RateLimiter } from "../../policies/limits/rate.js";
import { TOOL_POLICIES } from "../../tools/registry.js";
import { captureLogger, tempDir } from "../policies/helpers.js";
import type { AlertRecord } from "../../policies/alerts/store.js";
import type { ApprovalEvent, CreateApprovalRequest } from "../../policies/approval_record.js";
import type { PolicyError } from "../../policies/errors.js";
import type { Principal } from "../../policies/scopes.js";
import { ApprovalFeed, type FeedEvent } from "../../server/app/approval_feed.js";
import { csrfOf, sessionKey } from "../../server/app/console_sessions.js";
import { openPgPolicyStores, type PgPolicyStores } from "../../server/app/postgres/policy.js";
import { openPool, type PgPool } from "../../server/stores/pg/pool.js";
import { migrate } from "../../server/app/postgres/schema.js";
import { scaled } from "../helpers/calibrate.js";
import { startPostgres, type TestPostgres } from "../helpers/postgres.js";
import { waitFor as waitUntil } from "../helpers/wait.js";

/** Until `fn` answers a value, within this file's deadline. */
const waitFor = <T>(what: string, fn: () => T | undefined | Promise<T | undefined>) =>
  waitUntil(what, fn, scaled(20_000), 25);

let db: TestPostgres;
let pools: PgPool[] = [];
let stores: PgPolicyStores[] = [];
const NAMES = ["a", "b", "c"];

beforeAll(async () => {
  db = await startPostgres();
  pools = NAMES.map((n) => openPool(db.url, { max: 8, application: `tpu-mcp-${n}` }));
  await migrate(pools[0]!);
  stores = pools.map((p, i) => openPgPolicyStores(p, { replica: NAMES[i]!, keepDecidedS: 3600 }));
});

afterAll(async () => {
  await Promise.all(stores.map((s) => s.close()));
  await Promise.all(pools.map((p) => p.end()));
  await db?.stop();
});

const req = (over: Partial<CreateApprovalRequest> = {}): CreateApprovalRequest => ({
  principal: "alice",
  tool: "run_benchmark",
  args_digest: "d1",
  args_preview: { model: "tiny-gpt2" },
  estimate: null,
  assurance: "token",
  ttl_s: 600,
  ...over,
});

/** Each promise's outcome: the value, or the PolicyError's code. */
const settle = <T>(ps: Promise<T>[]) =>
  Promise.all(
    ps.map((p) =>
      p.then(
        (v) => ({ ok: true as const, v }),
        (e: PolicyError) => ({ ok: false as const, code: e.code ?? String(e) }),
      ),
    ),
  );

describe("approvals across replicas", () => {
  it("requested through A, decided once though B and C race, used once though all three race", async () => {
    const [a, b, c] = stores.map((s) => s.approvals);
    const rec = await a!.create(req());
    const decided = await settle([
      b!.approve(rec.id, "ops-1"),
      c!.deny(rec.id, "ops-2", "no"),
      b!.approve(rec.id, "ops-3"),
      c!.approve(rec.id, "ops-4"),
    ]);
    expect(decided.filter((d) => d.ok)).toHaveLength(1);
    expect(decided.filter((d) => !d.ok).map((d) => !d.ok && d.code)).toEqual(
      Array(3).fill("approval_already_decided"),
    );
    const winner = decided.findIndex((d) => d.ok);
    const now = await a!.get(rec.id);
    expect(now!.decided_by).toBe(`ops-${winner + 1}`);
    if (now!.status !== "approved") {
      // Denied won: nothing to use, and every replica says so.
      await expect(c!.consume(rec.id, "alice", "run_benchmark", "d1")).rejects.toMatchObject({
        code: "approval_denied",
      });
      return;
    }
    const used = await settle(
      [a, b, c, a, b, c].map((s) => s!.consume(rec.id, "alice", "run_benchmark", "d1")),
    );
    expect(used.filter((u) => u.ok)).toHaveLength(1);
    expect(new Set(used.filter((u) => !u.ok).map((u) => !u.ok && u.code))).toEqual(
      new Set(["approval_used"]),
    );
    expect((await c!.get(rec.id))!.status).toBe("used");
  });

  it("approved through B: used once though A, B and C race, and only for this exact call", async () => {
    // The decision's race above may go to a deny; this one is approved, so the use races always.
    const [a, b, c] = stores.map((s) => s.approvals);
    const rec = await a!.create(req({ args_digest: "d2" }));
    expect((await b!.approve(rec.id, "ops")).status).toBe("approved");
    await expect(a!.consume(rec.id, "alice", "run_benchmark", "other")).rejects.toMatchObject({
      code: "approval_mismatch",
    });
    await expect(a!.consume(rec.id, "bob", "run_benchmark", "d2")).rejects.toMatchObject({
      code: "approval_not_found",
    });
    const used = await settle(
      Array.from({ length: 9 }, (_, i) =>
        [a, b, c][i % 3]!.consume(rec.id, "alice", "run_benchmark", "d2"),
      ),
    );
    expect(used.filter((u) => u.ok)).toHaveLength(1);
    // Given back only to the call that used it (issue 43 row 10): not for another principal or
    // another digest, which leave it used.
    expect(await c!.restoreUsed(rec.id, "bob", "run_benchmark", "d2")).toBeUndefined();
    expect(await c!.restoreUsed(rec.id, "alice", "run_benchmark", "other")).toBeUndefined();
    expect((await a!.get(rec.id))!.status).toBe("used");
    // Given back after an interrupted call (reconcile), then used again, once.
    expect((await c!.restoreUsed(rec.id, "alice", "run_benchmark", "d2"))!.status).toBe("approved");
    expect(await c!.restoreUsed(rec.id, "alice", "run_benchmark", "d2")).toBeUndefined();
    // Still bound once given back: another principal or digest is refused, and uses nothing.
    await expect(b!.consume(rec.id, "bob", "run_benchmark", "d2")).rejects.toMatchObject({
      code: "approval_not_found",
    });
    await expect(b!.consume(rec.id, "alice", "run_benchmark", "other")).rejects.toMatchObject({
      code: "approval_mismatch",
    });
    expect((await b!.consume(rec.id, "alice", "run_benchmark", "d2")).status).toBe("used");
  });

  it("keeps the policy version and rule; an open request is found only under its version", async () => {
    const [a, b] = stores.map((s) => s.approvals);
    const rec = await a!.create(
      req({ args_digest: "d5", policy_version: "pv_1", rule: "every run_benchmark call" }),
    );
    expect(await b!.get(rec.id)).toMatchObject({
      policy_version: "pv_1",
      rule: "every run_benchmark call",
    });
    expect((await b!.findOpen("alice", "run_benchmark", "d5", "pv_1"))!.id).toBe(rec.id);
    expect(await b!.findOpen("alice", "run_benchmark", "d5", "pv_2")).toBeUndefined();
    // One from before versions (null) counts under any.
    const old = await a!.create(req({ args_digest: "d6" }));
    expect(old.policy_version).toBeNull();
    expect((await b!.findOpen("alice", "run_benchmark", "d6", "pv_2"))!.id).toBe(old.id);
  });

  it("the requester cannot decide its own; an expired one is neither decided nor used", async () => {
    const [a, b] = stores.map((s) => s.approvals);
    const rec = await a!.create(req({ args_digest: "d3", ttl_s: 0.2 }));
    await expect(b!.approve(rec.id, "alice")).rejects.toMatchObject({
      code: "approval_self_grant",
    });
    await waitFor("expiry", async () =>
      (await b!.get(rec.id))!.status === "expired" ? true : undefined,
    );
    await expect(b!.approve(rec.id, "ops")).rejects.toMatchObject({ code: "approval_expired" });
    await expect(b!.approve("apr_" + "0".repeat(32), "ops")).rejects.toMatchObject({
      code: "approval_not_found",
    });
  });

  it("the pending cap per principal holds when 3 replicas × 8 requests race for it", async () => {
    const cap = 3;
    const tries = await settle(
      Array.from({ length: 24 }, (_, i) =>
        stores[i % 3]!.approvals.create(
          req({ principal: "carol", args_digest: `cap-${i}`, max_pending: cap }),
        ),
      ),
    );
    expect(tries.filter((t) => t.ok)).toHaveLength(cap);
    expect(new Set(tries.filter((t) => !t.ok).map((t) => !t.ok && t.code))).toEqual(
      new Set(["approval_limit"]),
    );
    const page = await stores[1]!.approvals.page({ status: "pending", limit: 100 });
    expect(page.items.filter((r) => r.principal === "carol")).toHaveLength(cap);
  });

  it("lists pending first (soonest to expire first), then history newest first, one snapshot", async () => {
    const s = stores[2]!.approvals;
    const late = await s.create(req({ principal: "dave", args_digest: "l1", ttl_s: 900 }));
    const soon = await s.create(req({ principal: "dave", args_digest: "l2", ttl_s: 300 }));
    const page = await stores[0]!.approvals.page({ limit: 500 });
    const pending = page.items.filter((r) => r.status === "pending");
    expect(page.items.slice(0, pending.length)).toEqual(pending);
    const ids = pending.map((r) => r.id);
    expect(ids.indexOf(soon.id)).toBeLessThan(ids.indexOf(late.id));
    expect(page.pending_total).toBe(pending.length);
    expect(page.history_total).toBe(page.items.length - pending.length);
    expect((await s.findOpen("dave", "run_benchmark", "l2"))!.id).toBe(soon.id);
  });

  it("a change made through one replica is heard by the others' subscribers and feeds", async () => {
    const [a, b, c] = stores.map((s) => s.approvals);
    await Promise.all([b!.listening(), c!.listening()]);
    const heard: ApprovalEvent[] = [];
    const off = b!.subscribe((e) => heard.push(e));
    try {
      const markBefore = c!.changeMark();
      const rec = await a!.create(req({ principal: "erin", args_digest: "n1" }));
      await waitFor("B hears the request", () =>
        heard.find((e) => e.type === "created" && e.record.id === rec.id),
      );
      await a!.approve(rec.id, "ops");
      const decided = await waitFor("B hears the decision", () =>
        heard.find((e) => e.type === "decided" && e.record.id === rec.id),
      );
      expect(decided.record).toMatchObject({ status: "approved", decided_by: "ops" });
      await waitFor("C's change mark moves", () =>
        c!.changeMark() !== markBefore ? true : undefined,
      );
      // The replica that made the change hears it once, from itself, not again from the database.
      const own: ApprovalEvent[] = [];
      const offOwn = a!.subscribe((e) => own.push(e));
      await a!.listening();
      await a!.consume(rec.id, "erin", "run_benchmark", "n1");
      await waitFor("B hears the use", () =>
        heard.find((e) => e.type === "used" && e.record.id === rec.id),
      );
      offOwn();
      expect(own.filter((e) => e.record.id === rec.id).map((e) => e.type)).toEqual(["used"]);
    } finally {
      off();
    }
  });

  it("the console's live list on C announces a request and a decision made through A, without polling", async () => {
    const [a, , c] = stores.map((s) => s.approvals);
    await c!.listening();
    // Polling never within the test: only the notification can tell C's feed.
    const feed = new ApprovalFeed(c!, { pollMs: 3_600_000 });
    const fed: FeedEvent[] = [];
    const off = feed.on((e) => fed.push(e));
    try {
      const rec = await a!.create(req({ principal: "frank", args_digest: "f1" }));
      await waitFor("C's feed announces the request", () =>
        fed.find((e) => e.type === "created" && e.record.id === rec.id),
      );
      await a!.deny(rec.id, "ops", "not today");
      const decided = await waitFor("C's feed announces the decision", () =>
        fed.find((e) => e.type === "decided" && e.record.id === rec.id),
      );
      expect(decided.record).toMatchObject({ status: "denied", reason: "not today" });
    } finally {
      off();
      feed.close();
    }
  });

  it("a replica whose LISTEN connection was cut listens again, and hears what follows", async () => {
    const [a, b] = stores.map((s) => s.approvals);
    await b!.listening();
    const listeners = () =>
      pools[0]!
        .query(
          "SELECT pid FROM pg_stat_activity WHERE application_name = 'tpu-mcp-b' AND query LIKE 'LISTEN%'",
        )
        .then((r) => r.rows.map((x) => Number(x.pid)));
    const [before] = await listeners();
    expect(before).toBeDefined();
    const mark = b!.changeMark();
    await pools[0]!.query("SELECT pg_terminate_backend($1)", [before]);
    // Listening again moves the mark: whatever was sent while it was away is unknown.
    await waitFor("B listens again", async () => {
      const now = await listeners();
      return now.length === 1 && now[0] !== before && b!.changeMark() !== mark ? true : undefined;
    });
    const heard: ApprovalEvent[] = [];
    const off = b!.subscribe((e) => heard.push(e));
    try {
      const rec = await a!.create(req({ principal: "erin", args_digest: "n2" }));
      await waitFor("B hears the request", () => heard.find((e) => e.record.id === rec.id));
    } finally {
      off();
    }
  });
});

describe("the gate on a replica", () => {
  const tmp = tempDir();
  afterAll(() => tmp.cleanup());

  it("the 2025-era approval wait on B ends when the approval is decided through A", async () => {
    const config = parsePolicyConfig(
      {
        approvals: {
          rules: [{ tool: "load_model", assurance: "client_form" }],
          elicitation_timeout_s: 3600,
        },
      },
      TOOL_POLICIES,
    );
    // Replica B's gate: the shared approvals; its audit and budget are beside the point here.
    const file = tmp.file("gate-b.db");
    const logger = captureLogger();
    const gate = new Gate({
      config,
      tools: TOOL_POLICIES,
      approvals: stores[1]!.approvals,
      audit: new SqliteAuditTrail(file, { logger }),
      limiter: new ConcurrencyLimiter(config.limits),
      rateLimiter: new RateLimiter(config.limits.rate_limit.per_principal_per_minute),
      budget: new SqliteBudgetLedger(file, config.limits.budget),
      logger,
    });
    await stores[1]!.approvals.listening();
    const shown: AbortSignal[] = [];
    const elicit = (_p: ElicitPrompt, signal: AbortSignal) => {
      shown.push(signal);
      return new Promise<never>(() => {}); // the user never answers in the client
    };
    const agent: Principal = { id: "gina", scopes: ["models:read", "models:load"], via: "token" };
    const call = gate.run(
      {
        principal: agent,
        tool: "load_model",
        args: { model: "tiny-gpt2" },
        estimate: { device_seconds: 1, memory_bytes: 1, compile_s: 0, weight_bytes: 0, fits: true },
        elicit,
      },
      async () => "ran",
    );
    const pending = await waitFor("the request, listed through A", async () =>
      shown.length > 0
        ? (await stores[0]!.approvals.list({ status: "pending" })).find(
            (r) => r.principal === "gina",
          )
        : undefined,
    );
    await stores[0]!.approvals.approve(pending.id, "ops");
    await expect(call).resolves.toBe("ran");
    expect(shown[0]!.aborted).toBe(true);
    expect((await stores[2]!.approvals.get(pending.id))!.status).toBe("used");
  });
});

describe("passkeys across replicas", () => {
  const cred = (id: string, operator = "olivia") => ({
    id,
    operator,
    public_key: new Uint8Array([1, 2, 3]),
    counter: 0,
    transports: ["internal"],
    aaguid: "00000000-0000-0000-0000-000000000000",
    rp_id: "localhost",
  });

  it("an enrolment code is used once though 3 replicas race with it, and never again", async () => {
    const [a, b, c] = stores.map((s) => s.passkeys);
    const { code } = await a!.createEnrolmentCode("olivia", 600);
    expect(await b!.peekEnrolmentCode(code)).toBe("olivia");
    const added = await settle(
      [a, b, c].map((s, i) => s!.addCredential(cred(`cred-${i}`), { code })),
    );
    expect(added.filter((x) => x.ok)).toHaveLength(1);
    const first = added.find((x) => x.ok)!;
    expect(first.ok && first.v.status).toBe("active");
    // Removed (recovery), the operator has no passkey: the spent code still opens nothing.
    expect(await c!.removeOperator("olivia")).toBe(1);
    await expect(b!.addCredential(cred("cred-again"), { code })).rejects.toThrow(
      /already used; codes are single-use/,
    );
    await expect(a!.peekEnrolmentCode(code)).rejects.toThrow(/already used/);
    await expect(a!.peekEnrolmentCode("not-a-code")).rejects.toThrow(/unknown/);
  });

  it("a signature counter never goes back: one replayed assertion passes once of 3", async () => {
    const [a, b, c] = stores.map((s) => s.passkeys);
    const { code } = await a!.createEnrolmentCode("pat", 600);
    await a!.addCredential(cred("cred-pat", "pat"), { code });
    await b!.advanceCounter("cred-pat", 1);
    const replay = await settle([a, b, c].map((s) => s!.advanceCounter("cred-pat", 5)));
    expect(replay.filter((r) => r.ok)).toHaveLength(1);
    expect(new Set(replay.filter((r) => !r.ok).map((r) => !r.ok && r.code))).toEqual(
      new Set(["passkey_refused"]),
    );
    // Racing different counters: whatever order they commit in, the stored one only rises.
    await settle(
      [7, 6, 9, 8, 10, 3].map((n, i) => [a, b, c][i % 3]!.advanceCounter("cred-pat", n)),
    );
    expect((await c!.get("cred-pat"))!.counter).toBe(10);
    await expect(a!.advanceCounter("cred-pat", 4)).rejects.toThrow(/went back \(4 after 10\)/);
    await expect(a!.advanceCounter("no-such", 4)).rejects.toThrow(/not enrolled/);
  });

  it("a second device waits for an approval by an existing passkey; activated once", async () => {
    const [a, b] = stores.map((s) => s.passkeys);
    const { code } = await a!.createEnrolmentCode("quinn", 600);
    const first = await a!.addCredential(cred("cred-q1", "quinn"), { code });
    // Another active passkey exists (pat's): a code's credential is no longer the bootstrap.
    expect(first.status).toBe("pending");
    await expect(b!.createEnrolmentCode("quinn", 600)).rejects.toThrow(/already has a passkey/);
    expect((await b!.activate("cred-q1", "cred-pat")).status).toBe("active");
    await expect(a!.activate("cred-q1", "cred-pat")).rejects.toThrow(/no passkey enrolment/);
    expect(await b!.activeCount("quinn")).toBe(1);
    expect((await a!.list("quinn")).map((c) => c.id)).toEqual(["cred-q1"]);
  });
});

describe("suspensions and alerts across replicas", () => {
  it("suspended through A is refused on B, and resumed through C for all", async () => {
    const [a, b, c] = stores.map((s) => s.suspensions);
    const now = Date.now();
    await a!.suspend({
      principal: "mallory",
      reason: "30 refusals in 60 s",
      rule: "refusals",
      since: new Date(now).toISOString(),
      until: new Date(now + 60_000).toISOString(),
    });
    expect((await b!.active("mallory", now))!.rule).toBe("refusals");
    expect(await b!.active("mallory", now + 61_000)).toBeNull();
    expect((await c!.list(now)).map((s) => s.principal)).toContain("mallory");
    expect((await c!.resume("mallory", now))!.principal).toBe("mallory");
    expect(await a!.active("mallory", now)).toBeNull();
    expect(await a!.resume("mallory", now)).toBeNull();
  });

  it("an alert fires once per rule, subject and window though 3 replicas race to fire it", async () => {
    const now = Date.now();
    const alert = (i: number, at = now): AlertRecord => ({
      id: `alert-${at}-${i}`,
      rule: "refusals",
      kind: "refusals",
      subject: "mallory",
      principal: "mallory",
      message: "30 refusals",
      fired_at: new Date(at).toISOString(),
      quiet_until: new Date(at + 60_000).toISOString(),
      action: "notify",
      details: { count: 30 },
    });
    const fired = await Promise.all(
      Array.from({ length: 9 }, (_, i) => stores[i % 3]!.alertStore.add(alert(i))),
    );
    expect(fired.filter(Boolean)).toHaveLength(1);
    expect((await stores[1]!.alertStore.recent(10)).map((a) => a.subject)).toEqual(["mallory"]);
    expect(await stores[2]!.alertStore.quiet(now)).toEqual([
      [JSON.stringify(["refusals", "mallory"]), now + 60_000],
    ]);
    // The window over, it fires again.
    expect(await stores[0]!.alertStore.add(alert(0, now + 61_000))).toBe(true);
  });
});

describe("console sessions across replicas", () => {
  const op: Principal = { id: "ops", scopes: ["approvals:grant"], via: "token" };
  const IDLE = 30 * 60_000;

  it("opened through A, served by B, signed out through C for all; only the id's hash is stored", async () => {
    const [a, b, c] = stores.map((s) => s.consoleSessions);
    const now = Date.now();
    const opened = await a!.open({ principal: op, endsAt: now + 3_600_000, now }, 5);
    const seen = await b!.touch(opened.id, now + 1000, IDLE);
    expect(seen).toMatchObject({ key: sessionKey(opened.id), principal: op, lastSeen: now + 1000 });
    // The CSRF token is derived from the id, so every replica computes the same one.
    expect(csrfOf(opened.id)).toBe(csrfOf(opened.id));
    const rows = await pools[0]!.query("SELECT * FROM console_sessions");
    expect(JSON.stringify(rows.rows)).not.toContain(opened.id);
    expect(JSON.stringify(rows.rows)).not.toContain(csrfOf(opened.id));
    await c!.end(opened.record.key);
    expect(await a!.touch(opened.id, now + 2000, IDLE)).toBeUndefined();
    expect(await b!.has(opened.record.key)).toBe(false);
  });

  it("idle or past its end, a session is gone everywhere", async () => {
    const [a, b] = stores.map((s) => s.consoleSessions);
    const now = Date.now();
    const idle = await a!.open({ principal: op, endsAt: now + 3_600_000, now }, 5);
    expect(await b!.touch(idle.id, now + IDLE + 1, IDLE)).toBeUndefined();
    const ended = await a!.open({ principal: op, endsAt: now + 10, now }, 5);
    expect(await b!.sweep(now + 10, IDLE)).toContain(ended.record.key);
    expect(await a!.touch(ended.id, now + 5, IDLE)).toBeUndefined();
  });

  it("the per-principal cap holds when 3 replicas sign the same operator in at once", async () => {
    const now = Date.now();
    const who: Principal = { ...op, id: "ops-cap" };
    const opened = await Promise.all(
      Array.from({ length: 9 }, (_, i) =>
        stores[i % 3]!.consoleSessions.open({ principal: who, endsAt: now + 3_600_000, now }, 2),
      ),
    );
    const left = await pools[1]!.query(
      "SELECT COUNT(*) AS n FROM console_sessions WHERE principal_id = 'ops-cap'",
    );
    expect(Number(left.rows[0].n)).toBe(2);
    expect(opened.flatMap((o) => o.signedOut)).toHaveLength(7);
  });
});
