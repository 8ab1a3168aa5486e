// 2. Concurrency: 32 callers, each sending batch-1 requests back to back, against the same
// embedding model with dynamic batching on and off. Measured at two levels, rounds interleaved
// (on, off, on, off, ...):
//  - worker: WorkerRuntime straight to the worker, the batcher alone (off = `load` with
//    `batching: false` on a second catalog entry for the same weights);
//  - mcp: the same 32 callers through one `tpu-mcp stdio` session, where the policy gate's
//    per-tool concurrency (run_inference: 16 by default) also shapes what the worker sees.
import { WorkerRuntime } from "../runtime/client.js";
import { MODEL, MODEL_NOBATCH, PYTHON, ROOT, sentences, type McpServer } from "./lib/procs.js";
import { section, type SectionResult } from "./lib/report.js";
import { fmt, summarize, withCallers } from "./lib/stats.js";
import { workerThreads } from "../server/app/build_runtime.js";

export interface ConcurrencyOptions {
  catalog: string;
  mcp: McpServer; // both MODEL and MODEL_NOBATCH loaded
  callers: number;
  /** Requests per round per mode; rounds alternate on/off. */
  perRound: number;
  rounds: number;
}

interface Round {
  seconds: number;
  latencies: number[];
}

async function round(
  callers: number,
  total: number,
  call: (i: number) => Promise<void>,
): Promise<Round> {
  const latencies: number[] = [];
  const t0 = performance.now();
  await withCallers(callers, total, async (i) => {
    const a = performance.now();
    await call(i);
    latencies.push(performance.now() - a);
  });
  return { seconds: (performance.now() - t0) / 1000, latencies };
}

async function compare(
  s: ReturnType<typeof section>,
  level: string,
  o: ConcurrencyOptions,
  call: (model: string, texts: string[]) => Promise<number | undefined>,
) {
  const pool = sentences(64, 11);
  const modes = { on: MODEL, off: MODEL_NOBATCH } as const;
  const acc = { on: { s: 0, n: 0, lat: [] as number[] }, off: { s: 0, n: 0, lat: [] as number[] } };
  // Requests per forward as the worker reports it (`batched_with`), where the level exposes it.
  const batched = { on: [] as number[], off: [] as number[] };
  // A short warm-up per mode so first-touch costs land in neither.
  for (const m of ["on", "off"] as const)
    await round(o.callers, o.callers, async (i) => void (await call(modes[m], [pool[i % 64]])));
  for (let r = 0; r < o.rounds; r++) {
    const order = r % 2 ? (["off", "on"] as const) : (["on", "off"] as const);
    for (const m of order) {
      const res = await round(o.callers, o.perRound, async (i) => {
        const b = await call(modes[m], [pool[i % 64]]);
        if (b !== undefined) batched[m].push(b);
      });
      acc[m].s += res.seconds;
      acc[m].n += res.latencies.length;
      acc[m].lat.push(...res.latencies);
    }
  }
  const tput = { on: acc.on.n / acc.on.s, off: acc.off.n / acc.off.s };
  const lat = { on: summarize(acc.on.lat), off: summarize(acc.off.lat) };
  for (const m of ["on", "off"] as const) {
    const mean = batched[m].length
      ? batched[m].reduce((a, b) => a + b, 0) / batched[m].length
      : NaN;
    const bw = Number.isFinite(mean)
      ? `, requests per forward ${mean.toFixed(1)} (max ${Math.max(...batched[m])})`
      : "";
    s.row(
      `${level}: batching ${m}`,
      fmt.rate(tput[m]),
      `p50 ${fmt.ms(lat[m].p50)}, p99 ${fmt.ms(lat[m].p99)}, n=${lat[m].n}${bw}`,
    );
    if (Number.isFinite(mean)) s.fig(`${level}.${m}_requests_per_forward`, mean);
    s.fig(`${level}.${m}_rps`, tput[m]);
    s.fig(`${level}.${m}_p50_ms`, lat[m].p50);
    s.fig(`${level}.${m}_p99_ms`, lat[m].p99);
  }
  const tr = tput.on / tput.off;
  const pr = lat.on.p99 / lat.off.p99;
  s.row(`${level}: on / off`, `${fmt.x(tr)} throughput`, `${fmt.x(pr)} p99 (≤ 1 is better)`);
  s.fig(`${level}.throughput_ratio`, tr);
  s.fig(`${level}.p99_ratio`, pr);
}

export async function runConcurrency(o: ConcurrencyOptions): Promise<SectionResult> {
  const s = section("concurrency");
  const rt = new WorkerRuntime({
    repoRoot: ROOT,
    pythonPath: PYTHON,
    catalogPath: o.catalog,
    device: "cpu",
    startMode: "eager",
    // The thread count the server gives its worker (server/app/build_runtime.ts), as on the MCP sides.
    extraArgs: ["--threads", String(workerThreads(0))],
    logger: quietLogger,
  });
  try {
    await rt.start();
    await rt.call("load", { model: MODEL });
    // The worker's own switch; the twin entry's catalog also says max_wait_ms 0.
    const off = await rt.call<any>("load", { model: MODEL_NOBATCH, batching: false });
    if (off.result.batching?.enabled !== false)
      throw new Error("worker did not switch batching off");
    await compare(s, "worker", o, async (model, texts) => {
      const r = await rt.call<{ batched_with?: number }>("infer", { model, texts });
      return r.result.batched_with;
    });
  } finally {
    await rt.close();
  }
  await compare(s, "mcp-stdio", o, async (model, texts) => {
    await o.mcp.call("run_inference", { model, texts });
    return undefined; // run_inference does not expose batched_with
  });
  s.note(
    `${o.callers} callers × batch 1, ${o.rounds} rounds of ${o.perRound} requests per mode, modes alternating; ` +
      `the MCP level is capped by the gate's run_inference concurrency (policy default 32).`,
  );
  return s.result();
}

const noop = () => {};
export const quietLogger = { debug: noop, info: noop, warn: noop, error: noop };
