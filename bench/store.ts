// The shared store's cost per call (issue 30), side by side in one run: what a call's budget
// admission and settlement add with SQLite (the default: the ledger's in-memory window, its
// charge written in a batch per event-loop turn) and with Postgres (one transaction under the
// principal's advisory lock to reserve, one to settle; server/app/postgres/budget.ts), and one
// audit append on each, and a stored output's put and read back (tpu://outputs/…) in memory and
// in Postgres at two sizes. Then admissions per second with 8 callers on 1 and on 3 replicas of
// the store (pools of their own, as three processes would hold) against one principal. Postgres is a
// fresh local cluster on 127.0.0.1 (test/helpers/postgres.ts), so this is the floor of a real
// deployment's cost, which adds the network's round trips.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { SqliteAuditTrail } from "../server/stores/audit/sqlite.js";
import { SqliteBudgetLedger } from "../policies/limits/budget.js";
import { openStoreDb } from "../policies/sqlite.js";
import { openPool, type PgPool } from "../server/stores/pg/pool.js";
import { migrate } from "../server/app/postgres/schema.js";
import { PgAuditTrail } from "../server/stores/audit/postgres.js";
import { PgBudget } from "../server/app/postgres/budget.js";
import { PgOutputs } from "../server/app/postgres/outputs.js";
import { MemoryOutputs, type Outputs } from "../tools/stores/outputs.js";
import type { TensorData } from "../runtime/types.js";
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

/**
 * A summarised answer's stored output: its put (run_inference) and its read back (resources/read)
 * of one float32 tensor of `elements`, `n` times, in memory (SQLite's) and in Postgres (one
 * replica writing, another reading, the bound far above what is written).
 */
async function outputCost(
  pools: PgPool[],
  elements: number,
  n: number,
): Promise<{ memory: Summary; pg: Summary }> {
  const tensor: TensorData[] = [
    {
      dtype: "float32",
      shape: [elements],
      data: Buffer.from(Float32Array.from({ length: elements }, (_, i) => Math.sin(i)).buffer),
    },
  ];
  const bound = 512 * 1024 * 1024;
  const putRead = (w: Outputs, r: Outputs) => async () => {
    const o = await w.put("alice", "bench", tensor);
    if (!(await r.get(o.id, "alice"))) throw new Error("the stored output was not read back");
  };
  const mem = new MemoryOutputs(bound);
  const [a, b] = [0, 1].map((i) => new PgOutputs(pools[i]!, { maxBytes: bound, replica: `r${i}` }));
  const memory = summarize(await timed(n, putRead(mem, mem)));
  const pg = summarize(await timed(n, putRead(a!, b!)));
  await pools[0]!.query("TRUNCATE stored_outputs CASCADE");
  return { memory, pg };
}

export async function runStore(opts: { calls: number }): Promise<SectionResult> {
  const s = section("store");
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-bench-store-"));
  const pg = await startPostgres();
  const pools = [0, 1, 2].map(() => openPool(pg.url, { max: 8 }));
  const db = openStoreDb(join(dir, "policy.db"));
  try {
    await migrate(pools[0]!);
    const audit = new SqliteAuditTrail(db, {});
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

    // A stored output (the smallest a default config summarises, and a large one).
    for (const [label, elements, calls] of [
      ["16 KiB", 4097, Math.min(n, 300)],
      ["4 MiB", 1 << 20, Math.min(n, 40)],
    ] as const) {
      const out = await outputCost(pools, elements, calls);
      s.row(
        `stored output ${label} put + read, memory`,
        `p50 ${fmt.ms(out.memory.p50)}`,
        `p99 ${fmt.ms(out.memory.p99)} (${calls} outputs)`,
      );
      s.row(
        `stored output ${label} put + read, Postgres`,
        `p50 ${fmt.ms(out.pg.p50)}`,
        `p99 ${fmt.ms(out.pg.p99)}; put through one replica, read through another`,
      );
      const key = label.replace(" ", "").toLowerCase();
      s.fig(`pg_output_${key}_p50_ms`, out.pg.p50);
      s.fig(`pg_output_${key}_p99_ms`, out.pg.p99);
    }

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
