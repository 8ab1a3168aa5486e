// The shared store's cost, side by side in one run (issue 30), on one deployment of three tpu-mcp
// replicas on one Postgres (test/helpers/replicas.ts) and one server on SQLite beside it, all with
// the same policy and mnist-cnn loaded:
// - a budget admission and settlement, one after another, on SQLite and on the deployment's
//   Postgres (bench/store.ts admissionCost): what the shared store adds to the gate's admission;
// - a whole call (run_inference of mnist-cnn: admitted, run, charged and audited), one after
//   another, through the SQLite server and through replica A directly, in alternating blocks so
//   the drift of a shared machine hits both: what the shared store adds to a call as a client sees;
// - calls per second through HAProxy with 1 and with 3 replicas on the shared store: two load
//   balancers with the shipped config, one spreading over the three replicas and one whose three
//   servers are all replica A, in alternating rounds of C modern-era clients (stateless: any
//   replica serves any call) calling run_inference as fast as answered.
// On one machine the replicas share its cores: the 3 ÷ 1 ratio says what a second and third
// process buy there, not what three machines would. Nothing here is asserted.
import { connectModernHttp } from "../test/helpers/modern.js";
import { startDeployment, startHaproxy } from "../test/helpers/replicas.js";
import { DEMO_POLICY, DEMO_TOKENS, startHttpServer, writeConfig } from "../test/helpers/server.js";
import { openPool } from "../server/stores/pg/pool.js";
import { section, type SectionResult } from "./lib/report.js";
import { fmt, summarize } from "./lib/stats.js";
import { admissionCost } from "./store.js";

const POLICY = {
  ...DEMO_POLICY,
  limits: {
    ...DEMO_POLICY.limits,
    rate_limit: { per_principal_per_minute: 1_000_000 },
    queue_bound: { run_inference: 256 },
    // A budget no call reaches: the cost of admission, not of a refusal.
    budget: { device_seconds_per_window: 1e9, window_s: 3600 },
  },
  approvals: { rules: [] },
};

/** A distinct mnist-cnn input per call. */
const input = (i: number) => ({
  model: "mnist-cnn",
  tensors: [
    { dtype: "float32", shape: [1, 1, 28, 28], data: Array(784).fill(((i % 997) + 1) / 1000) },
  ],
});

type Client = Awaited<ReturnType<typeof connectModernHttp>>["client"];

async function infer(c: Client, i: number): Promise<void> {
  const r = await c.callTool({ name: "run_inference", arguments: input(i) });
  if (r.isError) throw new Error(`run_inference failed: ${JSON.stringify(r.content)}`);
}

async function load(url: string): Promise<void> {
  const c = await connectModernHttp(url, DEMO_TOKENS.agent);
  try {
    const r = await c.client.callTool({ name: "load_model", arguments: { model: "mnist-cnn" } });
    if (r.isError) throw new Error(`load_model failed: ${JSON.stringify(r.content)}`);
  } finally {
    await c.close();
  }
}

/** C clients, `per` calls each, through `url`: calls per second of the whole round. */
async function round(url: string, callers: number, per: number): Promise<number> {
  const clients = await Promise.all(
    Array.from({ length: callers }, () => connectModernHttp(url, DEMO_TOKENS.agent)),
  );
  try {
    const t = performance.now();
    await Promise.all(
      clients.map(async (c, k) => {
        for (let i = 0; i < per; i++) await infer(c.client, k * 100_000 + i);
      }),
    );
    return (callers * per) / ((performance.now() - t) / 1000);
  } finally {
    await Promise.all(clients.map((c) => c.close()));
  }
}

export async function runReplicas(opts: {
  rounds: number;
  callers: number;
  per: number;
  /** Serial calls per server for the per-call latency, and admissions per store. */
  calls: number;
}): Promise<SectionResult> {
  const s = section("replicas");
  const d = await startDeployment({ policy: POLICY });
  const a = d.replicas[0]!;
  const one = await startHaproxy([a.port, a.port, a.port]);
  const lite = await startHttpServer(writeConfig({ policy: POLICY })).catch(async (e) => {
    await one.stop();
    await d.stop();
    throw e;
  });
  const pool = openPool(d.db!.url, { max: 2, application: "bench-replicas" });
  try {
    await Promise.all([...d.replicas.map((r) => load(r.url)), load(lite.url)]);

    // 1. Admission + settlement alone.
    const admit = await admissionCost(pool, opts.calls);
    s.row(
      "budget admit + settle, SQLite",
      `p50 ${fmt.ms(admit.sqlite.p50)}`,
      `p99 ${fmt.ms(admit.sqlite.p99)} (${opts.calls} one after another)`,
    );
    s.row(
      "budget admit + settle, Postgres",
      `p50 ${fmt.ms(admit.pg.p50)}`,
      `p99 ${fmt.ms(admit.pg.p99)}; added p50 ${fmt.ms(admit.pg.p50 - admit.sqlite.p50)}, p99 ${fmt.ms(admit.pg.p99 - admit.sqlite.p99)}`,
    );

    // 2. A whole call, SQLite server against replica A, in alternating blocks of 10.
    const [onLite, onPg] = await Promise.all(
      [lite.url, a.url].map((u) => connectModernHttp(u, DEMO_TOKENS.agent)),
    );
    const lat: Record<"sqlite" | "pg", number[]> = { sqlite: [], pg: [] };
    try {
      for (let i = 0; i < 5; i++) {
        await infer(onLite!.client, 900_000 + i);
        await infer(onPg!.client, 900_000 + i);
      }
      for (let b = 0; b * 10 < opts.calls; b++) {
        const order = b % 2 === 0 ? (["sqlite", "pg"] as const) : (["pg", "sqlite"] as const);
        for (const k of order)
          for (let i = 0; i < 10; i++) {
            const t = performance.now();
            await infer((k === "sqlite" ? onLite : onPg)!.client, b * 10 + i);
            lat[k].push(performance.now() - t);
          }
      }
    } finally {
      await Promise.all([onLite!.close(), onPg!.close()]);
    }
    const callLite = summarize(lat.sqlite);
    const callPg = summarize(lat.pg);
    s.row(
      "run_inference call, SQLite server",
      `p50 ${fmt.ms(callLite.p50)}`,
      `p99 ${fmt.ms(callLite.p99)} (${callLite.n} one after another, direct)`,
    );
    s.row(
      "run_inference call, replica on Postgres",
      `p50 ${fmt.ms(callPg.p50)}`,
      `p99 ${fmt.ms(callPg.p99)}; added p50 ${fmt.ms(callPg.p50 - callLite.p50)}, p99 ${fmt.ms(callPg.p99 - callLite.p99)}`,
    );
    s.row(
      "Postgres ÷ SQLite, per call",
      `p50 ${fmt.x(callPg.p50 / callLite.p50)}`,
      `p99 ${fmt.x(callPg.p99 / callLite.p99)}; admission alone p50 ${fmt.x(admit.pg.p50 / admit.sqlite.p50)}`,
    );

    // 3. Calls per second through HAProxy, 1 and 3 replicas on the shared store.
    await round(d.url, opts.callers, 3);
    await round(one.url, opts.callers, 1);
    const rates: Record<1 | 3, number[]> = { 1: [], 3: [] };
    for (let i = 0; i < opts.rounds; i++) {
      // Alternating which goes first, so neither always follows the other's tail.
      const order: (1 | 3)[] = i % 2 === 0 ? [1, 3] : [3, 1];
      for (const n of order)
        rates[n].push(await round(n === 1 ? one.url : d.url, opts.callers, opts.per));
    }
    const r1 = summarize(rates[1]).p50;
    const r3 = summarize(rates[3]).p50;
    s.row(
      "1 replica behind HAProxy, Postgres",
      `${r1.toFixed(0)} calls/s`,
      `median of ${opts.rounds} rounds, ${opts.callers} modern clients × ${opts.per} run_inference`,
    );
    s.row(
      "3 replicas behind HAProxy, Postgres",
      `${r3.toFixed(0)} calls/s`,
      "the same rounds, interleaved; one Postgres",
    );
    s.row(
      "3 replicas ÷ 1",
      fmt.x(r3 / r1),
      "one machine: the replicas share its cores (a machine each would not)",
    );
    s.fig("admit_sqlite_p50_ms", admit.sqlite.p50);
    s.fig("admit_sqlite_p99_ms", admit.sqlite.p99);
    s.fig("admit_pg_p50_ms", admit.pg.p50);
    s.fig("admit_pg_p99_ms", admit.pg.p99);
    s.fig("call_sqlite_p50_ms", callLite.p50);
    s.fig("call_sqlite_p99_ms", callLite.p99);
    s.fig("call_pg_p50_ms", callPg.p50);
    s.fig("call_pg_p99_ms", callPg.p99);
    s.fig("call_ratio_p50", callPg.p50 / callLite.p50);
    s.fig("calls_per_s_1", r1);
    s.fig("calls_per_s_3", r3);
    s.fig("ratio_3_over_1", r3 / r1);
  } finally {
    await pool.end();
    await lite.stop();
    await one.stop();
    await d.stop();
  }
  return s.result();
}
