// The budget as ONE cap across replicas, on a real PostgreSQL: three replicas (three pools, each
// its own connections, as three processes would hold) admitting for one principal; a running
// call's use beyond its estimate held against the other replicas' admissions; a replica killed
// with SIGKILL (a real process) whose holds run out with their lease; and the same race admitting
// on a stale read, which goes over the cap.
import { spawn, type ChildProcess } from "node:child_process";
import { createInterface } from "node:readline";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parsePolicyConfig } from "../../policies/config.js";
import type { CostEstimate } from "../../policies/estimate.js";
import { PolicyError } from "../../policies/errors.js";
import { BudgetLines, type CapStop } from "../../policies/gate/budget_lines.js";
import type { AdmitOutcome, BudgetLine } from "../../policies/limits/budget.js";
import type { Principal } from "../../policies/scopes.js";
import { toolPolicyMap } from "../../policies/tool_policy.js";
import { PgBudget, storedKey } from "../../server/app/postgres/budget.js";
import { TOOL_POLICIES } from "../../tools/registry.js";
import { openPool, type PgPool } from "../../server/stores/pg/pool.js";
import { migrate } from "../../server/app/postgres/schema.js";
import { scaled, slowdown } from "../helpers/calibrate.js";
import { startPostgres, type TestPostgres } from "../helpers/postgres.js";
import { ROOT } from "../helpers/server.js";
import { waitFor as waitUntil } from "../helpers/wait.js";
import { FakeClock } from "../policies/helpers.js";

/** Until `fn` answers a value, within this file's deadline. */
const waitFor = <T>(what: string, fn: () => T | undefined | Promise<T | undefined>) =>
  waitUntil(what, fn, scaled(60_000));

let db: TestPostgres;
let replicas: PgPool[];
let child: ChildProcess | undefined;
const NAMES = ["a", "b", "c"];
const opened: PgBudget[] = [];

beforeAll(async () => {
  db = await startPostgres();
  replicas = NAMES.map((n) => openPool(db.url, { max: 8, application: `tpu-mcp-${n}` }));
  await migrate(replicas[0]!);
});

afterAll(async () => {
  if (child && child.exitCode === null) child.kill("SIGKILL");
  for (const b of opened) b.close();
  await Promise.all((replicas ?? []).map((p) => p.end()));
  await db?.stop();
});

/** Each replica's ledger (renewing only when a test says so: renewMs far away). */
async function ledgers(limitS: number, leaseS = 600): Promise<PgBudget[]> {
  const out = await Promise.all(
    replicas.map((p, i) =>
      PgBudget.open(p, { limitS, windowS: 3600, replica: NAMES[i]!, leaseS, renewMs: 3_600_000 }),
    ),
  );
  opened.push(...out);
  return out;
}

/** 8 agents on each replica, each admitting 1 s calls until refused; what was charged. */
async function race(
  principal: string,
  limitS: number,
  admit: (b: PgBudget, lines: BudgetLine[]) => Promise<AdmitOutcome>,
): Promise<{ admitted: number; charged: number }> {
  const budgets = await ledgers(limitS);
  let admitted = 0;
  const agent = async (b: PgBudget) => {
    for (;;) {
      const r = await admit(b, [{ key: principal, need: 1 }]);
      if (!r.ok) return;
      admitted++;
      await r.hold.settle([{ key: principal, amount: 1, tool: "run_inference" }]);
    }
  };
  await Promise.all(budgets.flatMap((b) => Array.from({ length: 8 }, () => agent(b))));
  return { admitted, charged: await budgets[0]!.charged(principal) };
}

describe("admission across replicas", () => {
  it("24 agents on 3 replicas against one 10 s budget: charged ≤ the limit", async () => {
    const { admitted, charged } = await race("alice", 10, (b, l) => b.admit(l));
    expect(admitted).toBe(10);
    expect(charged).toBeLessThanOrEqual(10);
  });

  it("admitting on a stale read (no lock, no transaction) breaks the cap: what the lock prevents", async () => {
    const { charged } = await race("mallory", 10, (b, l) => b.admitOnStaleRead(l));
    expect(charged).toBeGreaterThan(10 + 1);
  });

  it("24 concurrent admissions held (not yet settled) on 3 replicas: at most the limit is held", async () => {
    const budgets = await ledgers(10);
    const got = await Promise.all(
      Array.from({ length: 24 }, (_, i) => budgets[i % 3]!.admit([{ key: "carol", need: 1 }])),
    );
    expect(got.filter((g) => g.ok)).toHaveLength(10);
    const refused = got.find((g) => !g.ok);
    expect(refused).toMatchObject({
      ok: false,
      index: 0,
      check: { reserved_s: 10, remaining_s: 0 },
    });
    expect((await budgets[1]!.standing("carol")).reserved_s).toBe(10);
    for (const g of got) if (g.ok) await g.hold.release();
    expect((await budgets[2]!.standing("carol")).reserved_s).toBe(0);
  });

  it("a call's lines are held all or none; the read allowance and money lines are lines of their own", async () => {
    const [a, b] = await ledgers(10);
    const read = "dave\u0000read";
    const money = "dave\u0000money";
    const full = await a!.admit([{ key: read, need: 3, limitS: 3 }]);
    expect(full.ok).toBe(true);
    // The budget has room, the read allowance has none: nothing is held on either.
    const refused = await b!.admit([
      { key: "dave", need: 2 },
      { key: read, need: 1, limitS: 3 },
    ]);
    expect(refused).toMatchObject({ ok: false, index: 1 });
    expect((await a!.standing("dave")).reserved_s).toBe(0);
    // A money line (micro-units) counts apart from device-seconds, and so does a principal whose
    // name looks like an escaped suffix.
    expect((await b!.admit([{ key: money, need: 5e6, limitS: 5e6 }])).ok).toBe(true);
    expect((await b!.check(money, 1, 0, 5e6)).ok).toBe(false);
    expect((await b!.check("dave", 10)).ok).toBe(true);
    expect((await b!.check("dave\\0read", 10)).ok).toBe(true);
    expect(storedKey("dave\\0read")).not.toBe(storedKey(read));
  });

  it("a refusal says when enough of the window's charges leave it", async () => {
    const [a] = await ledgers(10);
    await a!.charge("erin", 6, "run_benchmark");
    await a!.charge("erin", 3, "run_benchmark");
    const c = await a!.check("erin", 2);
    expect(c).toMatchObject({ ok: false, used_s: 9, remaining_s: 1 });
    expect(c.retry_after_ms).toBeGreaterThan(3_500_000);
    expect((await a!.check("erin", 11)).retry_after_ms).toBeUndefined();
  });
});

describe("running calls' use beyond their estimates", () => {
  it("is held against the other replicas' admissions as soon as its work runs, read live, with no renewal; never twice on its own", async () => {
    const [a, b] = await ledgers(10);
    const got = await a!.admit([{ key: "frank", need: 0.2 }]);
    if (!got.ok) throw new Error("not admitted");
    // Admitted, its work not started: its estimate is held, nothing more.
    expect((await b!.check("frank", 0)).reserved_s).toBe(0.2);
    await got.hold.started!();
    const waitS = scaled(1_000) / 1000;
    await new Promise((r) => setTimeout(r, waitS * 1000));
    // B reads A's overrun from A's hold (its start, the database's clock): no renewal ran.
    const seen = await b!.check("frank", 0);
    expect(seen.reserved_s).toBeGreaterThanOrEqual(waitS - 0.01);
    const standing = await b!.standing("frank");
    expect(standing.reserved_s).toBe(0.2);
    expect(standing.others).toHaveLength(1);
    expect(standing.others![0]!.elapsedMs).toBeGreaterThanOrEqual(waitS * 1000 - 10);
    // A counts its own overrun from its meter (extraHeldS), not from its row.
    expect((await a!.check("frank", 0)).reserved_s).toBe(0.2);
    expect((await a!.standing("frank")).others).toEqual([]);
    await got.hold.settle([{ key: "frank", amount: 2 }]);
    expect(await b!.standing("frank")).toMatchObject({ charged_s: 2, reserved_s: 0, others: [] });
  });
});

describe("the gate's budget lines on two replicas", () => {
  const est = (device_seconds: number): CostEstimate => ({
    device_seconds,
    memory_bytes: 1e6,
    compile_s: 0,
    weight_bytes: 0,
    fits: true,
  });
  const harry: Principal = { id: "harry", scopes: ["benchmark:run"], via: "token" };

  it("a call running past its estimate on A refuses B's admission and stops B's running call, with no renewal", async () => {
    const limitS = 3 * slowdown();
    const config = parsePolicyConfig(
      { approvals: { rules: [] }, limits: { budget: { device_seconds_per_window: limitS } } },
      TOOL_POLICIES,
    );
    // No renewal runs in this test (renewMs an hour): what B sees of A it reads live.
    const [a, b] = await ledgers(limitS);
    const [onA, onB] = [a!, b!].map(
      (l) => new BudgetLines(config.limits, l, Date.now, toolPolicyMap(TOOL_POLICIES)),
    );
    // A's call: estimated 0.2 s, its work runs (as the gate starts it) until its meter stops it.
    const heldA = await onA!.admit(harry, "run_benchmark", est(0.2));
    await heldA.started();
    const stopsA: CapStop[] = [];
    const runA = onA!.meter("harry", "run_benchmark", est(0.2), (s) => stopsA.push(s))!;
    // B's call (1 s) fits now, and B's meter knows A's call runs.
    const heldB = await onB!.admit(harry, "run_benchmark", est(1));
    await heldB.started();
    const stops: CapStop[] = [];
    const runB = onB!.meter("harry", "run_benchmark", est(1), (s) => stops.push(s))!;
    await runB.armed;
    // A's overrun grows: B's next admission is refused, and B's meter stops B's call.
    await waitFor("B's admission to be refused", async () =>
      (await onB!.admit(harry, "run_benchmark", est(1)).then(
        async (r) => {
          await r.release();
          return undefined;
        },
        (e: { code?: string }) => e.code,
      )) === "budget_exceeded"
        ? true
        : undefined,
    );
    await waitFor("B's call to be stopped", async () => (stops.length > 0 ? stops : undefined));
    expect(stops[0]).toMatchObject({ readAllowance: false, limitS });
    runA.end();
    runB.end();
    await heldA.release();
    await heldB.release();
  });
  it("a call running past its estimate on this replica refuses the next admission here, with retry_after_ms", async () => {
    // Issue 43 row 9: its own overrun counts from its meter (extraHeldS) before any renewal.
    const config = parsePolicyConfig(
      { approvals: { rules: [] }, limits: { budget: { device_seconds_per_window: 100 } } },
      TOOL_POLICIES,
    );
    const [a] = await ledgers(100);
    const clock = new FakeClock();
    const lines = new BudgetLines(config.limits, a!, clock.now, toolPolicyMap(TOOL_POLICIES));
    const ivy: Principal = { id: "ivy", scopes: ["benchmark:run"], via: "token" };
    await a!.charge("ivy", 60, "run_benchmark");
    clock.advance(1_000);
    // Estimated 1 s, running 20 s: 19 s past its estimate (its stop is at 40 s, far from here).
    const held = await lines.admit(ivy, "run_benchmark", est(1));
    const stops: CapStop[] = [];
    const run = lines.meter("ivy", "run_benchmark", est(1), (s) => stops.push(s))!;
    await run.armed;
    clock.advance(20_000);
    // 60 charged + 1 held + 19 overrun + 25 needed > 100; the 60 s charge leaving frees enough.
    const e = await lines.admit(ivy, "run_benchmark", est(25)).then(
      (r) => r,
      (x: unknown) => x as PolicyError,
    );
    expect(e).toBeInstanceOf(PolicyError);
    expect((e as PolicyError).code).toBe("budget_exceeded");
    expect((e as PolicyError).details).toMatchObject({ reserved_s: 20, used_s: 80 });
    expect((e as PolicyError).details.retry_after_ms).toBeGreaterThan(0);
    expect(stops).toEqual([]);
    run.end();
    await held.release();
  });
});

describe("a replica that dies", () => {
  it("holds until its lease runs out after a kill -9, not before; a live replica's holds are renewed", async () => {
    const leaseS = 2 * slowdown();
    const [, b] = await ledgers(10);
    child = spawn(
      process.execPath,
      [
        "--import",
        "tsx",
        "test/postgres/replica_budget.ts",
        db.url,
        "z",
        String(leaseS),
        "zoe",
        "8",
      ],
      { cwd: ROOT, stdio: ["ignore", "pipe", "inherit"] },
    );
    const first = await new Promise<string>((resolve, reject) => {
      createInterface({ input: child!.stdout! }).once("line", resolve);
      child!.once("exit", (code) => reject(new Error(`replica z exited ${code}`)));
    });
    expect(first).toBe("held");
    // Alive past two leases: its renewals keep the 8 s held.
    await new Promise((r) => setTimeout(r, 2 * leaseS * 1000));
    expect(await b!.check("zoe", 4)).toMatchObject({ ok: false, reserved_s: 8 });

    child.kill("SIGKILL");
    await new Promise((r) => child!.once("exit", r));
    // Right after the kill its lease still holds: the 8 s still count.
    expect((await b!.admit([{ key: "zoe", need: 4 }])).ok).toBe(false);
    // Once it runs out, they count no longer.
    const got = await waitFor("z's hold to run out", async () => {
      const r = await b!.admit([{ key: "zoe", need: 4 }]);
      return r.ok ? r : undefined;
    });
    expect(await b!.standing("zoe")).toMatchObject({ reserved_s: 4 });
    if (got.ok) await got.hold.release();
  });

  it("a replica that starts again drops what its previous run held", async () => {
    const [a] = await ledgers(10);
    expect((await a!.admit([{ key: "gina", need: 9 }])).ok).toBe(true);
    const again = await PgBudget.open(replicas[1]!, { limitS: 10, windowS: 3600, replica: "a" });
    opened.push(again);
    expect((await again.standing("gina")).reserved_s).toBe(0);
  });
});
