// Issue 43 row 5, the budget across replicas, on a real PostgreSQL: 9 benchmark calls admitted
// over 3 replicas (three pools, each its own ledger renewing every second as a serving replica's
// does, and the gate's budget lines on it) all run past their estimates at once. Each call's
// work runs until its meter stops it and is charged as the gate charges it (its device time to
// the moment the stop was decided, policies/gate/supervise.ts). The other replicas' overruns
// reach every meter live, not once a second, so the line ends at most 1 s over its budget.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parsePolicyConfig } from "../../policies/config.js";
import type { CostEstimate } from "../../policies/estimate.js";
import { BudgetLines, type CapStop } from "../../policies/gate/budget_lines.js";
import type { Principal } from "../../policies/scopes.js";
import { toolPolicyMap } from "../../policies/tool_policy.js";
import { PgBudget } from "../../server/app/postgres/budget.js";
import { openPool, type PgPool } from "../../server/stores/pg/pool.js";
import { migrate } from "../../server/app/postgres/schema.js";
import { TOOL_POLICIES } from "../../tools/registry.js";
import { scaled } from "../helpers/calibrate.js";
import { startPostgres, type TestPostgres } from "../helpers/postgres.js";

let db: TestPostgres;
let pools: PgPool[];
const ledgers: PgBudget[] = [];

beforeAll(async () => {
  db = await startPostgres();
  pools = ["a", "b", "c"].map((n) => openPool(db.url, { max: 8, application: `tpu-mcp-${n}` }));
  await migrate(pools[0]!);
});

afterAll(async () => {
  for (const l of ledgers) l.close();
  await Promise.all((pools ?? []).map((p) => p.end()));
  await db?.stop();
});

const est = (device_seconds: number): CostEstimate => ({
  device_seconds,
  memory_bytes: 1e6,
  compile_s: 0,
  weight_bytes: 0,
  fits: true,
});

describe("row 5: the budget across replicas", () => {
  it("9 concurrent benchmarks over 3 replicas, all overrunning: charged at most the budget + 1 s", async () => {
    const limitS = 12;
    const estimateS = 1;
    const config = parsePolicyConfig(
      { approvals: { rules: [] }, limits: { budget: { device_seconds_per_window: limitS } } },
      TOOL_POLICIES,
    );
    const lines = await Promise.all(
      ["a", "b", "c"].map(async (replica, i) => {
        // Renewing every second, as a serving replica does (the meters look again then too).
        const ledger = await PgBudget.open(pools[i]!, { limitS, windowS: 3600, replica });
        ledgers.push(ledger);
        return new BudgetLines(config.limits, ledger, Date.now, toolPolicyMap(TOOL_POLICIES));
      }),
    );
    const ivy: Principal = { id: "ivy", scopes: ["benchmark:run"], via: "token" };
    // Every call is admitted first (9 s of 12 held), then all start, as the gate starts them.
    const onReplica = Array.from({ length: 9 }, (_, i) => lines[i % 3]!);
    const held = await Promise.all(onReplica.map((l) => l.admit(ivy, "run_benchmark", est(1))));
    // Far past what the budget allows: only a stop ends one.
    const workMs = scaled(60_000);
    const charged = await Promise.all(
      onReplica.map(async (l, i) => {
        await held[i]!.started();
        const started = Date.now();
        const stop = await new Promise<CapStop | null>((resolve) => {
          const timer = setTimeout(() => resolve(null), workMs);
          const metered = l.meter("ivy", "run_benchmark", est(estimateS), (cap) => {
            clearTimeout(timer);
            metered?.end();
            resolve(cap);
          });
        });
        // Charged as the gate charges a stopped call: to the moment its stop was decided.
        const seconds = stop ? stop.usedS : (Date.now() - started) / 1000;
        await held[i]!.settle(seconds);
        return { stopped: stop !== null, seconds };
      }),
    );
    expect(charged.every((c) => c.stopped)).toBe(true);
    // Every call ran past its estimate: the line was overrun by all 9 at once.
    expect(charged.every((c) => c.seconds > estimateS)).toBe(true);
    const total = Number(
      (
        await pools[0]!.query(
          "SELECT SUM(seconds) AS s FROM budget_charges WHERE principal = 'ivy'",
        )
      ).rows[0].s,
    );
    expect(total).toBeGreaterThan(limitS - 1);
    expect(total).toBeLessThanOrEqual(limitS + 1);
  });
});
