// Calls per second through HAProxy with 1 and with 3 tpu-mcp replicas on one Postgres, side by
// side in one run (issue 30): one deployment of three replicas (test/helpers/replicas.ts) and two
// load balancers with the shipped config, one spreading over the three replicas and one whose
// three servers are all replica A. Rounds alternate between the two, so the drift of a shared
// machine hits both; each round is C modern-era clients (stateless: any replica serves any call)
// calling list_models (the gate, its audit record, a worker's status) as fast as answered. On
// one machine the replicas share its cores: the ratio says what a second and third process buy
// there, not what three machines would.
import { connectModernHttp } from "../test/helpers/modern.js";
import { startDeployment, startHaproxy } from "../test/helpers/replicas.js";
import { DEMO_POLICY, DEMO_TOKENS } from "../test/helpers/server.js";
import { section, type SectionResult } from "./lib/report.js";
import { fmt, summarize } from "./lib/stats.js";

/**
 * Where the replicas keep their state. "sqlite" until the server serves on Postgres: each replica
 * its own store, so the figure is the processes' and the load balancer's, without the shared one.
 */
const STORAGE = "sqlite" as "postgres" | "sqlite";

const POLICY = {
  ...DEMO_POLICY,
  limits: { ...DEMO_POLICY.limits, rate_limit: { per_principal_per_minute: 1_000_000 } },
  approvals: { rules: [] },
};

/** C clients, `per` calls each, through `url`: calls per second of the whole round. */
async function round(url: string, callers: number, per: number): Promise<number> {
  const clients = await Promise.all(
    Array.from({ length: callers }, () => connectModernHttp(url, DEMO_TOKENS.agent)),
  );
  try {
    const t = performance.now();
    await Promise.all(
      clients.map(async (c) => {
        for (let i = 0; i < per; i++) {
          const r = await c.client.callTool({ name: "list_models", arguments: {} });
          if (r.isError) throw new Error(`list_models failed: ${JSON.stringify(r.content)}`);
        }
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
}): Promise<SectionResult> {
  const s = section("replicas");
  const d = await startDeployment({ policy: POLICY, storage: STORAGE });
  const a = d.replicas[0]!;
  const one = await startHaproxy([a.port, a.port, a.port]);
  try {
    // Warm every replica and its worker (first calls import and open connections).
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
      "1 replica behind HAProxy",
      `${r1.toFixed(0)} calls/s`,
      `median of ${opts.rounds} rounds, ${opts.callers} modern clients × ${opts.per} list_models`,
    );
    s.row(
      "3 replicas behind HAProxy",
      `${r3.toFixed(0)} calls/s`,
      `the same rounds, interleaved; store: ${STORAGE === "postgres" ? "one Postgres" : "each replica its own SQLite"}`,
    );
    s.row(
      "3 replicas ÷ 1",
      fmt.x(r3 / r1),
      "one machine: the replicas share its cores (a machine each would not)",
    );
    s.fig("calls_per_s_1", r1);
    s.fig("calls_per_s_3", r3);
    s.fig("ratio_3_over_1", r3 / r1);
  } finally {
    await one.stop();
    await d.stop();
  }
  return s.result();
}
