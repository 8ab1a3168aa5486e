// Repeated refusals: which aggregate (the rule in policies/audit_refusals.ts), that a window's
// first refusal is written at once and its repeats as one chained aggregate when it ends (by
// time, by its timer, or at close), and the bound on what a flood adds to the trail.
import { afterAll, describe, expect, it } from "vitest";
import { SqliteAuditTrail } from "../../server/stores/audit/sqlite.js";
import { type AuditRecord } from "../../policies/audit.js";
import { loadOrCreateAuditKey } from "../../policies/audit_key.js";
import { RefusalWindows, repeatKey } from "../../policies/audit_refusals.js";
import { captureLogger, FakeClock, tempDir } from "./helpers.js";

const tmp = tempDir();
afterAll(() => tmp.cleanup());

const D1 = "a".repeat(64);
const D2 = "b".repeat(64);

function refusal(code: string, extra: Partial<AuditRecord> = {}): AuditRecord {
  return {
    time: new Date().toISOString(),
    principal: "reader",
    tool: "check_model",
    args_digest: D1,
    outcome: "denied",
    code,
    reason: code,
    ...extra,
  };
}

function store(opts: { windowMs?: number; clock?: FakeClock } = {}) {
  const file = tmp.file(`ref-${Math.random().toString(36).slice(2)}.db`);
  const { key } = loadOrCreateAuditKey(tmp.file(`${Math.random().toString(36).slice(2)}.key`));
  const log = new SqliteAuditTrail(file, {
    key,
    keyCreated: true,
    logger: captureLogger(),
    refusalWindowMs: opts.windowMs ?? 60_000,
    now: opts.clock?.now,
  });
  return { log, file, key };
}

/** The refusals the trail accounts for: 1 per record, `count` per aggregate. */
const accounted = (rows: AuditRecord[], code: string) =>
  rows
    .filter((r) => r.outcome === "denied" && r.code === code)
    .reduce((n, r) => n + (r.count ?? 1), 0);

describe("the aggregation rule", () => {
  it("counts rate_limited per principal, whatever the call", () => {
    expect(repeatKey(refusal("rate_limited"))).toBe(
      repeatKey(refusal("rate_limited", { tool: "load_model", args_digest: D2 })),
    );
    expect(repeatKey(refusal("rate_limited", { principal: "agent" }))).not.toBe(
      repeatKey(refusal("rate_limited")),
    );
  });

  it("counts insufficient_scope per principal and tool (which tool was tried is recorded)", () => {
    const k = repeatKey(refusal("insufficient_scope", { args_digest: null }));
    expect(k).not.toBeNull();
    expect(repeatKey(refusal("insufficient_scope", { args_digest: D2 }))).toBe(k);
    expect(repeatKey(refusal("insufficient_scope", { tool: "load_model" }))).not.toBe(k);
  });

  it("counts another refusal only when the same call repeats (tool and digest)", () => {
    const k = repeatKey(refusal("invalid_argument"));
    expect(k).not.toBeNull();
    expect(repeatKey(refusal("invalid_argument", { args_digest: D2 }))).not.toBe(k);
    expect(repeatKey(refusal("invalid_argument", { tool: "run_inference" }))).not.toBe(k);
    expect(repeatKey(refusal("busy"))).not.toBe(k);
  });

  it("takes the key a caller outside the gate names (failed sign-ins per address)", () => {
    const bad = (principal: string) =>
      refusal("invalid_token", { principal, tool: "http", args_digest: null });
    expect(repeatKey(bad("addr:10.0.0.1"))).toBeNull();
    expect(repeatKey(bad("addr:10.0.0.1"), "principal")).toBe(
      repeatKey({ ...bad("addr:10.0.0.1"), tool: "console" }, "principal"),
    );
    expect(repeatKey(bad("addr:10.0.0.1"), "call")).toBeNull(); // no digest to compare
    expect(
      repeatKey({ ...bad("addr:10.0.0.1"), outcome: "approval_granted" }, "principal"),
    ).toBeNull();
  });

  it("records decisions, approval refusals and refusals without a digest one by one", () => {
    for (const r of [
      refusal("approval_required", { outcome: "approval_requested" }),
      refusal("approval_pending"),
      refusal("approval_limit"),
      refusal("approval_self_grant"),
      refusal("invalid_argument", { args_digest: null }),
      { ...refusal("x"), outcome: "executed" as const, code: undefined },
      { ...refusal("x"), outcome: "failed" as const, code: "timeout" },
      { ...refusal("x"), outcome: "allowed" as const, code: undefined },
    ])
      expect(repeatKey(r)).toBeNull();
  });
});

describe("refusal windows", () => {
  it("writes the first refusal at once and the repeats as one aggregate when the window ends", async () => {
    const clock = new FakeClock();
    const { log } = store({ clock });
    const first = await log.appendRefusal(refusal("rate_limited"));
    expect(first?.seq).toBeGreaterThan(0);
    for (let i = 0; i < 5; i++) {
      clock.advance(1_000);
      expect(
        await log.appendRefusal(
          refusal("rate_limited", {
            tool: i % 2 ? "load_model" : "check_model",
            time: new Date(clock.ms).toISOString(),
          }),
        ),
      ).toBeNull();
    }
    expect(log.pendingRefusals()).toBe(5);
    expect((await log.tail(10)).filter((r) => r.code === "rate_limited")).toHaveLength(1);

    // The window ends: the next refusal (a new window) writes the aggregate first.
    clock.advance(60_000);
    const next = await log.appendRefusal(refusal("rate_limited"));
    expect(next).not.toBeNull();
    const rows = (await log.tail(10)).filter((r) => r.code === "rate_limited");
    expect(rows).toHaveLength(3);
    expect(rows[1]).toMatchObject({
      principal: "reader",
      outcome: "denied",
      tool: "*",
      args_digest: null,
      count: 5,
      first_seq: first!.seq,
      tools: { check_model: 3, load_model: 2 },
    });
    expect(rows[1].since! < rows[1].until!).toBe(true);
    expect(rows[2].seq).toBe(next!.seq);
    log.close();
  });

  it("writes an aggregate when its window ends with no further refusal (the timer)", async () => {
    const { log } = store({ windowMs: 50 });
    log.appendRefusal(refusal("insufficient_scope"));
    log.appendRefusal(refusal("insufficient_scope"));
    log.appendRefusal(refusal("insufficient_scope"));
    for (let i = 0; i < 100 && log.pendingRefusals() > 0; i++)
      await new Promise((r) => setTimeout(r, 20));
    expect(log.pendingRefusals()).toBe(0);
    const rows = (await log.tail(10)).filter((r) => r.code === "insufficient_scope");
    expect(rows.map((r) => r.count)).toEqual([undefined, 2]);
    expect((await log.verify()).ok).toBe(true);
    log.close();
  });

  it("writes every open window's count at close, chained like every record", async () => {
    const { file, key } = store();
    const log = new SqliteAuditTrail(file, { key, refusalWindowMs: 60_000 });
    log.appendRefusal(refusal("rate_limited"));
    log.appendRefusal(refusal("rate_limited"));
    log.appendRefusal(refusal("unknown_model"));
    log.appendRefusal(refusal("unknown_model"));
    log.appendRefusal(refusal("unknown_model"));
    log.close();
    const reopened = new SqliteAuditTrail(file, { key });
    const rows = await reopened.tail(20);
    expect(accounted(rows, "rate_limited")).toBe(2);
    expect(accounted(rows, "unknown_model")).toBe(3);
    expect(rows.find((r) => r.code === "unknown_model" && r.count)).toMatchObject({
      count: 2,
      args_digest: D1,
      tool: "check_model",
    });
    expect(await reopened.verify()).toMatchObject({ ok: true });
    reopened.close();
  });

  it("records every refusal when the window is 0", async () => {
    const { log } = store({ windowMs: 0 });
    for (let i = 0; i < 3; i++)
      expect(await log.appendRefusal(refusal("rate_limited"))).not.toBeNull();
    expect((await log.tail(10)).filter((r) => r.code === "rate_limited")).toHaveLength(3);
    log.close();
  });

  it("records refusals one by one again once too many windows are open (memory)", () => {
    const written: AuditRecord[] = [];
    let full = 0;
    const w = new RefusalWindows(
      (r) => (written.push(r), { ...r, seq: written.length, prev_hash: "", hash: "" }),
      { windowMs: 60_000, maxOpen: 2, onFull: () => full++ },
    );
    for (const p of ["a", "b", "c", "c"]) w.record(refusal("rate_limited", { principal: p }));
    expect(written.map((r) => r.principal)).toEqual(["a", "b", "c", "c"]);
    expect(full).toBe(2);
    w.close();
  });

  it("bounds a flood: 30,000 refusals of one principal over three windows add 6 records", async () => {
    const clock = new FakeClock();
    const { log } = store({ clock });
    const before = (await log.head()).seq;
    for (let i = 0; i < 30_000; i++) {
      if (i > 0 && i % 10_000 === 0) clock.advance(60_000);
      clock.advance(1);
      log.appendRefusal(refusal("rate_limited", { args_digest: i.toString(16).padStart(64, "0") }));
    }
    log.flushRefusals();
    expect((await log.head()).seq - before).toBe(6);
    expect(accounted(await log.tail(10), "rate_limited")).toBe(30_000);
    expect((await log.verify()).ok).toBe(true);
    log.close();
  });
});
