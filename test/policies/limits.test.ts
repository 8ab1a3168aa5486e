import Database from "better-sqlite3";
import { afterAll, describe, expect, it } from "vitest";
import { parsePolicyConfig } from "../../policies/config.js";
import { PolicyError } from "../../policies/errors.js";
import { SqliteBudgetLedger } from "../../policies/limits/budget.js";
import { ConcurrencyLimiter } from "../../policies/limits/concurrency.js";
import { RateLimiter } from "../../policies/limits/rate.js";
import { FakeClock, flush, tempDir } from "./helpers.js";
import { TOOL_POLICIES } from "../../tools/registry.js";

const limits = (over: Record<string, unknown> = {}) =>
  parsePolicyConfig({ limits: over }, TOOL_POLICIES).limits;

async function codeOf(p: Promise<unknown>): Promise<string | undefined> {
  try {
    await p;
    return undefined;
  } catch (e) {
    return (e as PolicyError).code;
  }
}

describe("ConcurrencyLimiter", () => {
  it("refuses the 17th waiter at once when the queue bound is 16", async () => {
    const lim = new ConcurrencyLimiter(
      limits({ per_tool_concurrency: { run_benchmark: 1 }, queue_bound: { run_benchmark: 16 } }),
    );
    const first = await lim.acquire("run_benchmark", undefined);
    const waiters = Array.from({ length: 16 }, () => lim.acquire("run_benchmark", undefined));
    const rejected = lim.acquire("run_benchmark", undefined);
    await expect(rejected).rejects.toMatchObject({ code: "busy" });
    const err = (await rejected.catch((e: unknown) => e)) as PolicyError;
    expect(err.details.retry_after_ms).toBeGreaterThan(0);
    // Everyone queued still gets a turn, in order.
    first();
    for (const w of waiters) (await w)();
    await flush(); // p-limit frees a slot one tick after release
    // All slots and queue places are free again: one runs at once and 16 more may wait.
    const again = await lim.acquire("run_benchmark", undefined);
    const queued = Array.from({ length: 16 }, () => lim.acquire("run_benchmark", undefined));
    await expect(lim.acquire("run_benchmark", undefined)).rejects.toMatchObject({ code: "busy" });
    again();
    for (const w of queued) (await w)();
  });

  it("runs up to the per-tool concurrency at once", async () => {
    const lim = new ConcurrencyLimiter(limits({ per_tool_concurrency: { run_inference: 3 } }));
    const held = await Promise.all([1, 2, 3].map(() => lim.acquire("run_inference", undefined)));
    let fourth = false;
    const p = lim.acquire("run_inference", undefined).then((r) => ((fourth = true), r));
    await flush();
    expect(fourth).toBe(false);
    held[0]!();
    (await p)();
    expect(fourth).toBe(true);
    held.slice(1).forEach((r) => r());
  });

  it("lets a cancelled waiter leave the queue without taking a slot", async () => {
    const lim = new ConcurrencyLimiter(
      limits({ per_tool_concurrency: { load_model: 1 }, queue_bound: { load_model: 1 } }),
    );
    const first = await lim.acquire("load_model", undefined);
    const ac = new AbortController();
    const waiting = lim.acquire("load_model", undefined, ac.signal);
    ac.abort();
    expect(await codeOf(waiting)).toBe("cancelled");
    // The cancelled waiter no longer counts against the bound.
    const next = lim.acquire("load_model", undefined);
    first();
    (await next)();
  });

  it("shares a device among shared tools and gives exclusive tools the device alone", async () => {
    const lim = new ConcurrencyLimiter(limits());
    const inf1 = await lim.acquire("run_inference", "tpu");
    // "tpu" and "tpu:0" are one lane, held by both shared calls at once.
    const inf2 = await lim.acquire("run_inference", "tpu:0");

    let loaded = false;
    const load = lim.acquire("load_model", "tpu").then((r) => ((loaded = true), r));
    // A shared call after a queued exclusive one waits its turn (no writer starvation).
    let inf3Got = false;
    const inf3 = lim.acquire("run_inference", "tpu").then((r) => ((inf3Got = true), r));
    await flush();
    expect(loaded).toBe(false);
    expect(inf3Got).toBe(false);

    inf1();
    await flush();
    expect(loaded).toBe(false);
    inf2();
    const releaseLoad = await load;
    await flush();
    expect(inf3Got).toBe(false);
    releaseLoad();
    (await inf3)();
  });

  it("keeps devices apart and lets read tools bypass device lanes", async () => {
    const lim = new ConcurrencyLimiter(limits());
    const bench = await lim.acquire("run_benchmark", "tpu:0");
    const otherDevice = await lim.acquire("load_model", "tpu:1");
    const status = await lim.acquire("get_runtime_status", "tpu:0");
    expect(lim.deviceMode("get_runtime_status")).toBe("none");
    [bench, otherDevice, status].forEach((r) => r());
  });

  it("refuses at once when the device queue is full", async () => {
    const lim = new ConcurrencyLimiter(
      limits({ device_queue_bound: 1, per_tool_concurrency: { check_model: 4 } }),
    );
    const holder = await lim.acquire("check_model", "cpu");
    const queued = lim.acquire("check_model", "cpu");
    await flush();
    const refused = await lim.acquire("check_model", "cpu").catch((e: PolicyError) => e);
    expect(refused).toBeInstanceOf(PolicyError);
    expect((refused as PolicyError).code).toBe("busy");
    expect((refused as PolicyError).details.device).toBe("cpu:0");
    // The refused call gave its tool slot back: of the 4 check_model slots, the holder and the
    // queued call hold two, so two more calls on other devices get theirs at once.
    let got = 0;
    const more = ["tpu:1", "tpu:2"].map((d) =>
      lim.acquire("check_model", d).then((r) => (got++, r)),
    );
    await flush();
    expect(got).toBe(2);
    for (const m of more) (await m)();
    holder();
    (await queued)();
  });
});

describe("RateLimiter", () => {
  it("allows a burst of the per-minute allowance, then refills continuously", async () => {
    const clock = new FakeClock();
    const rl = new RateLimiter(60, clock.now);
    for (let i = 0; i < 60; i++) expect((await rl.take("agent")).ok).toBe(true);
    const d = await rl.take("agent");
    expect(d).toEqual({ ok: false, retry_after_ms: 1000 });
    expect((await rl.take("other")).ok).toBe(true);
    clock.advance(999);
    expect((await rl.take("agent")).ok).toBe(false);
    clock.advance(1);
    expect((await rl.take("agent")).ok).toBe(true);
    clock.advance(3_600_000);
    const full = await rl.take("agent");
    expect(full).toEqual({ ok: true, remaining: 59 });
  });
});

describe("SqliteBudgetLedger", () => {
  const tmp = tempDir();
  afterAll(() => tmp.cleanup());

  it("refuses when the estimate exceeds what is left, and says when budget frees up", async () => {
    const clock = new FakeClock();
    const b = new SqliteBudgetLedger(":memory:", {
      device_seconds_per_window: 100,
      window_s: 60,
      clock: clock.now,
    });
    expect((await b.check("a", 100)).ok).toBe(true);
    b.charge("a", 30);
    clock.advance(10_000);
    b.charge("a", 50);
    const c = await b.check("a", 40);
    expect(c).toMatchObject({ ok: false, used_s: 80, remaining_s: 20, limit_s: 100, window_s: 60 });
    // The first charge (30 s) leaves the window 50 s from now; then 50 + 40 fits.
    expect(c.retry_after_ms).toBe(50_001);
    expect((await b.check("b", 40)).ok).toBe(true);
    clock.advance(50_001);
    expect(await b.check("a", 40)).toMatchObject({ ok: true, used_s: 50 });
    b.close();
  });

  it("counts in-flight reservations and refuses what can never fit", async () => {
    const b = new SqliteBudgetLedger(":memory:", {
      device_seconds_per_window: 100,
      window_s: 60,
      clock: () => 0,
    });
    expect((await b.check("a", 30, 80)).ok).toBe(false);
    const never = await b.check("a", 101);
    expect(never.ok).toBe(false);
    expect(never.retry_after_ms).toBeUndefined();
    b.close();
  });

  it("admits in one step: of calls admitted at once that each fit alone, only those that fit together hold", async () => {
    const b = new SqliteBudgetLedger(":memory:", {
      device_seconds_per_window: 10,
      window_s: 60,
      clock: () => 0,
    });
    const line = { key: "a", need: 6 };
    const got = await Promise.all([b.admit([line]), b.admit([line]), b.admit([line])]);
    expect(got.map((g) => g.ok)).toEqual([true, false, false]);
    const refused = got[1];
    if (refused.ok) throw new Error("unreachable");
    expect(refused.check).toMatchObject({ reserved_s: 6, remaining_s: 4 });
    // Given back, the hold makes room; settled, it is the charge (the window counts it).
    if (got[0].ok) await got[0].hold.settle([{ key: "a", amount: 2 }]);
    expect(await b.standing("a")).toMatchObject({ charged_s: 2, reserved_s: 0 });
    expect((await b.admit([line])).ok).toBe(true);
    b.close();
  });

  it("writes the charges of one turn in one commit, counted by checks at once", async () => {
    const path = tmp.file("budget-batch.db");
    const b = new SqliteBudgetLedger(path, { device_seconds_per_window: 100, window_s: 3600 });
    const probe = new Database(path, { readonly: true });
    const rows = () =>
      (probe.prepare("SELECT COUNT(*) AS n FROM budget_charges").get() as { n: number }).n;
    const version = () => probe.pragma("data_version", { simple: true }) as number;
    const v0 = version();
    for (let i = 0; i < 50; i++) b.charge("a", 1, "run_inference");
    // Enforced before any row is written…
    expect(await b.check("a", 51)).toMatchObject({ ok: false, used_s: 50 });
    expect(rows()).toBe(0);
    await new Promise((r) => setImmediate(r));
    // …and written together after the turn.
    expect(rows()).toBe(50);
    expect(version() - v0).toBe(1);
    probe.close();
    b.close();
  });

  it("survives reopening the file", async () => {
    const clock = new FakeClock();
    const path = tmp.file("budget.db");
    const b1 = new SqliteBudgetLedger(path, {
      device_seconds_per_window: 100,
      window_s: 3600,
      clock: clock.now,
    });
    b1.charge("a", 90, "run_benchmark");
    b1.close();
    const b2 = new SqliteBudgetLedger(path, {
      device_seconds_per_window: 100,
      window_s: 3600,
      clock: clock.now,
    });
    expect(await b2.check("a", 20)).toMatchObject({ ok: false, used_s: 90, remaining_s: 10 });
    b2.close();
  });
});
