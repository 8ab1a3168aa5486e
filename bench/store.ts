// The shared store's cost per call (issue 30), side by side in one run: what a call's budget
// admission and settlement add with SQLite (the default: the ledger's in-memory window, its
// charge written in a batch per event-loop turn) and with Postgres (one transaction under the
// principal's advisory lock to reserve, one to settle; server/app/postgres/budget.ts), and one
// audit append on each. Then admissions per second with 8 callers on 1 and on 3 replicas of the
// store (pools of their own, as three processes would hold) against one principal. Postgres is a
// fresh local cluster on 127.0.0.1 (test/helpers/postgres.ts), so this is the floor of a real
// deployment's cost, which adds the network's round trips.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { SqliteAuditLog } from "../policies/audit.js";
import { SqliteBudgetLedger } from "../policies/limits/budget.js";
import { openStoreDb } from "../policies/sqlite.js";
import { openPool, type PgPool } from "../server/app/postgres/pool.js";
import { migrate } from "../server/app/postgres/schema.js";
import { PgAuditTrail } from "../server/app/postgres/audit.js";
import { PgBudget } from "../server/app/postgres/budget.js";
import { startPostgres } from "../test/helpers/postgres.js";
import { section, type SectionResult } from "./lib/report.js";
import { fmt, summarize, type Summary } from "./lib/stats.js";

const BIG = 1e12; // a budget no call reaches: the cost of admission, not of a refusal

/** One call's budget: its estimate held in one transaction, then settled as its charge in one. */
async function admitSettle(b: PgBudget): Promise<void> {
  const r = await b.admit([{ key: "alice", need: 0.01 }]);
  if (r.ok) await r.hold.settle([{ key: "alice", amount: 0.01 }]);
}

async function timed(n: number, fn: (i: number) => Promise<void> | void): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    await fn(i);
    out.push(performance.now() - t);
  }
  return out;
}

/**
 * One call's budget admission and settlement, one after another, `n` times on SQLite (a ledger
 * in a temporary policy.db) and on the Postgres behind `pool` (this process as replica `replica`):
 * the per-call cost of the shared store's admission, side by side. bench/replicas.ts runs it on
 * its deployment's database.
 */
export async function admissionCost(
  pool: PgPool,
  n: number,
  replica = "bench",
): Promise<{ sqlite: Summary; pg: Summary }> {
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-bench-admit-"));
  const db = openStoreDb(join(dir, "policy.db"));
  const ledger = new SqliteBudgetLedger(db, { device_seconds_per_window: BIG, window_s: 3600 });
  const budget = new PgBudget(pool, { limitS: BIG, windowS: 3600, replica });
  try {
    // What the gate does per call on SQLite: admit (check and hold), then settle the charge.
    const sqliteAdmitSettle = async () => {
      const got = await ledger.admit([{ key: "alice", need: 0.01 }]);
      if (got.ok) await got.hold.settle([{ key: "alice", amount: 0.01 }]);
    };
    // Warm both (prepared statements, the pool's connections).
    for (let i = 0; i < 50; i++) {
      await sqliteAdmitSettle();
      await admitSettle(budget);
    }
    const sqlite = summarize(
      await timed(n, async () => {
        await sqliteAdmitSettle();
        // The batched charge row is written in the next turn: included, as a call pays it.
        await new Promise((r) => setImmediate(r));
      }),
    );
    const pg = summarize(await timed(n, () => admitSettle(budget)));
    return { sqlite, pg };
  } finally {
    budget.close();
    ledger.close();
    if (db.open) db.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

export async function runStore(opts: { calls: number }): Promise<SectionResult> {
  const s = section("store");
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-bench-store-"));
  const pg = await startPostgres();
  const pools = [0, 1, 2].map(() => openPool(pg.url, { max: 8 }));
  const db = openStoreDb(join(dir, "policy.db"));
  try {
    await migrate(pools[0]!);
    const audit = new SqliteAuditLog(db, {});
    const chain = await PgAuditTrail.open(pools[0]!, { replica: "a", refusalWindowMs: 0 });
    const n = opts.calls;
    const { sqlite: sqliteAdmit, pg: pgAdmit } = await admissionCost(pools[0]!, n, "a");
    const record = (i: number) => ({
      time: new Date().toISOString(),
      principal: "alice",
      tool: "run_inference",
      args_digest: null,
      outcome: "executed" as const,
      duration_ms: i,
    });
    const sqliteAudit = summarize(await timed(n, (i) => void audit.append(record(i))));
    const pgAudit = summarize(await timed(n, async (i) => void (await chain.append(record(i)))));
    s.row(
      "budget admit + settle, SQLite",
      `p50 ${fmt.ms(sqliteAdmit.p50)}`,
      `p99 ${fmt.ms(sqliteAdmit.p99)} (${n} calls, one after another)`,
    );
    s.row(
      "budget admit + settle, Postgres",
      `p50 ${fmt.ms(pgAdmit.p50)}`,
      `p99 ${fmt.ms(pgAdmit.p99)}; added over SQLite p50 ${fmt.ms(pgAdmit.p50 - sqliteAdmit.p50)}, p99 ${fmt.ms(pgAdmit.p99 - sqliteAdmit.p99)}`,
    );
    s.row(
      "audit append, SQLite",
      `p50 ${fmt.ms(sqliteAudit.p50)}`,
      `p99 ${fmt.ms(sqliteAudit.p99)}`,
    );
    s.row(
      "audit append, Postgres (one locked head)",
      `p50 ${fmt.ms(pgAudit.p50)}`,
      `p99 ${fmt.ms(pgAudit.p99)}; added p50 ${fmt.ms(pgAudit.p50 - sqliteAudit.p50)}`,
    );
    s.fig("sqlite_admit_p50_ms", sqliteAdmit.p50);
    s.fig("sqlite_admit_p99_ms", sqliteAdmit.p99);
    s.fig("pg_admit_p50_ms", pgAdmit.p50);
    s.fig("pg_admit_p99_ms", pgAdmit.p99);
    s.fig("pg_added_p50_ms", pgAdmit.p50 - sqliteAdmit.p50);
    s.fig("pg_added_p99_ms", pgAdmit.p99 - sqliteAdmit.p99);
    s.fig("pg_audit_p50_ms", pgAudit.p50);

    // One principal, 8 callers: on one replica's pool, then spread over three.
    for (const replicas of [1, 3]) {
      const budgets = pools
        .slice(0, replicas)
        .map((p, i) => new PgBudget(p, { limitS: BIG, windowS: 3600, replica: `r${i}` }));
      const per = Math.ceil(n / 8);
      const t = performance.now();
      await Promise.all(
        Array.from({ length: 8 }, async (_, k) => {
          const b = budgets[k % replicas]!;
          for (let i = 0; i < per; i++) {
            await admitSettle(b);
          }
        }),
      );
      const rate = (8 * per) / ((performance.now() - t) / 1000);
      for (const b of budgets) b.close();
      s.row(
        `Postgres, 8 callers on ${replicas} replica(s)`,
        `${rate.toFixed(0)} calls/s`,
        "one principal: its advisory lock serializes admissions across replicas",
      );
      s.fig(`pg_calls_per_s_${replicas}`, rate);
    }
    audit.close();
  } finally {
    if (db.open) db.close();
    await Promise.all(pools.map((p) => p.end()));
    await pg.stop();
    rmSync(dir, { recursive: true, force: true });
  }
  return s.result();
}
