// 6. Pool: what a second worker buys, and what the remote path costs. At the runtime level
// (WorkerPool straight to the workers), rounds interleaved so both sides share the machine's
// state:
//  - throughput: 16 callers, batch 1, MiniLM, against a pool of 1 local worker × 1 thread and a
//    pool of 2 local workers × 1 thread holding 2 replicas (routing: power of two choices);
//  - latency: one caller, batch 1, MiniLM, local worker (pipe) against a remote worker
//    (`tpu_worker serve`, mutual TLS on 127.0.0.1, token), both 1 thread.
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { WorkerPool, type WorkerEntry } from "../runtime/pool/index.js";
import { makeCerts, startServe, type ServeProc } from "../test/helpers/fleet.js";
import { quietLogger } from "./concurrency.js";
import { MODEL, PYTHON, ROOT, sentences } from "./lib/procs.js";
import { section, type SectionResult } from "./lib/report.js";
import { fmt, summarize, withCallers } from "./lib/stats.js";

export interface PoolBenchOptions {
  catalog: string;
  callers: number;
  perRound: number;
  rounds: number;
  latencyCalls: number;
}

function pool(catalog: string, entries: WorkerEntry[]): WorkerPool {
  return new WorkerPool({
    entries,
    base: {
      repoRoot: ROOT,
      pythonPath: PYTHON,
      catalogPath: catalog,
      startMode: "lazy",
      logger: quietLogger,
    },
    // The bench measures routing, not refusals: every caller may be in flight at once.
    maxInFlightPerReplica: 64,
  });
}

export async function runPool(o: PoolBenchOptions): Promise<SectionResult> {
  const s = section("pool");
  const texts = sentences(64, 23);
  const one = pool(o.catalog, [{ name: "a0", device: "cpu", threads: 1 }]);
  const two = pool(o.catalog, [
    { name: "b0", device: "cpu", threads: 1 },
    { name: "b1", device: "cpu", threads: 1 },
  ]);
  const certs = makeCerts(mkdtempSync(join(tmpdir(), "tpu-mcp-bench-certs-")));
  let serve: ServeProc | undefined;
  let remote: WorkerPool | undefined;
  try {
    serve = await startServe(certs, ["--threads", "1", "--catalog", o.catalog]);
    remote = pool(o.catalog, [
      {
        name: "r0",
        connect: `127.0.0.1:${serve.port}`,
        tls: { ca: certs.ca, cert: certs.clientCert, key: certs.clientKey },
        token_file: certs.token,
      },
    ]);
    await Promise.all([one.start(), two.start(), remote.start()]);
    await Promise.all([
      one.call("load", { model: MODEL }),
      two.call("load", { model: MODEL, replicas: 2 }),
      remote.call("load", { model: MODEL }),
    ]);

    // Throughput, 1 vs 2 workers, rounds alternating.
    const infer = (p: WorkerPool) => async (i: number) =>
      void (await p.call("infer", { model: MODEL, texts: [texts[i % texts.length]] }));
    const acc = { one: { s: 0, n: 0 }, two: { s: 0, n: 0 } };
    const sides = { one, two } as const;
    for (const k of ["one", "two"] as const)
      await withCallers(o.callers, o.callers * 2, infer(sides[k]));
    for (let r = 0; r < o.rounds; r++) {
      for (const k of r % 2 ? (["two", "one"] as const) : (["one", "two"] as const)) {
        const t0 = performance.now();
        await withCallers(o.callers, o.perRound, infer(sides[k]));
        acc[k].s += (performance.now() - t0) / 1000;
        acc[k].n += o.perRound;
      }
    }
    const rps = { one: acc.one.n / acc.one.s, two: acc.two.n / acc.two.s };
    const spread = two
      .workers()
      .map((w) => `${w.name} ${w.calls}`)
      .join(", ");
    s.row("1 worker × 1 thread", fmt.rate(rps.one), `${o.callers} callers, batch 1`);
    s.row("2 workers × 1 thread", fmt.rate(rps.two), `calls per worker: ${spread}`);
    s.row(
      "2 / 1 workers",
      `${fmt.x(rps.two / rps.one)} throughput`,
      "expected ≥ 1.6× on 2 idle cores",
    );
    s.fig("one_rps", rps.one);
    s.fig("two_rps", rps.two);
    s.fig("throughput_ratio", rps.two / rps.one);

    // Latency, local pipe vs remote TLS, one caller, calls alternating.
    const lat = { local: [] as number[], remote: [] as number[] };
    const pools = { local: one, remote } as const;
    for (let i = 0; i < o.latencyCalls + 10; i++) {
      for (const k of i % 2 ? (["remote", "local"] as const) : (["local", "remote"] as const)) {
        const t0 = performance.now();
        await pools[k].call("infer", { model: MODEL, texts: [texts[i % texts.length]] });
        if (i >= 10) lat[k].push(performance.now() - t0);
      }
    }
    const L = summarize(lat.local);
    const R = summarize(lat.remote);
    s.row("local pipe, batch 1", fmt.ms(L.p50), `p99 ${fmt.ms(L.p99)}, n=${L.n}`);
    s.row("remote TLS loopback, batch 1", fmt.ms(R.p50), `p99 ${fmt.ms(R.p99)}, n=${R.n}`);
    s.row("remote / local p50", fmt.x(R.p50 / L.p50), "expected ≤ 1.2×");
    s.fig("local_p50_ms", L.p50);
    s.fig("remote_p50_ms", R.p50);
    s.fig("remote_latency_ratio_p50", R.p50 / L.p50);
    s.note(
      `pool: ${o.rounds} rounds of ${o.perRound} requests per side, alternating; latency ${o.latencyCalls} calls per side, alternating. ` +
        "Each worker batches dynamically inside itself. On a shared machine both ratios move with the other load.",
    );
  } finally {
    await Promise.allSettled([one.close(), two.close(), remote?.close()]);
    await serve?.stop();
  }
  return s.result();
}
