// Small calls: mnist-cnn batch 1 (784 values in as JSON numbers, 10 out), where what the server
// adds is most of the call. Side by side in one run:
//  - latency: MCP stdio, MCP HTTP and the direct forward in Python, interleaved call by call in
//    rotating order; "added" = MCP p50 (p99) minus direct p50 (p99);
//  - throughput: 32 concurrent callers over stdio, then over HTTP (the bench config raises the
//    rate limit and budget so neither throttles), against the direct forward's own rate (batch-1
//    forwards back to back in one Python thread). Every call passes the gate and is audited.
import { cpuMs, DirectPython, workerPid, type McpServer } from "./lib/procs.js";
import { section, type SectionResult } from "./lib/report.js";
import { fmt, summarize, withCallers } from "./lib/stats.js";
import { availableParallelism } from "node:os";

const cpus = availableParallelism();

export interface SmallOptions {
  stdio: McpServer; // mnist-cnn loaded
  http: McpServer; // mnist-cnn loaded
  /** The previous commit's stdio server (BENCH_BASELINE), mnist-cnn loaded: a fourth side. */
  baseline?: McpServer;
  catalog: string;
  model: string;
  calls: number;
  warmup: number;
  callers: number;
  throughputCalls: number;
  rounds: number;
}

const ALL_SIDES = ["stdio", "http", "direct", "baseline"] as const;
type Side = (typeof ALL_SIDES)[number];

export async function runSmall(o: SmallOptions): Promise<SectionResult> {
  const s = section("small");
  const values = Array.from({ length: 784 }, (_, i) => ((i * 37) % 255) / 255);
  const args = {
    model: o.model,
    tensors: [{ dtype: "float32", shape: [1, 1, 28, 28], data: values }],
  };
  const direct = await DirectPython.start(o.catalog, o.model);
  try {
    const timed = async (fn: () => Promise<unknown>) => {
      const t0 = performance.now();
      await fn();
      return performance.now() - t0;
    };
    const SIDES = ALL_SIDES.filter((x) => x !== "baseline" || o.baseline);
    const run: Record<Side, () => Promise<number>> = {
      stdio: () => timed(() => o.stdio.call("run_inference", args)),
      http: () => timed(() => o.http.call("run_inference", args)),
      direct: async () => (await direct.inferTensor([1, 1, 28, 28], values, 1))[0],
      baseline: () => timed(() => o.baseline!.call("run_inference", args)),
    };
    const ms: Record<Side, number[]> = { stdio: [], http: [], direct: [], baseline: [] };
    for (let i = 0; i < o.warmup + o.calls; i++) {
      for (let k = 0; k < SIDES.length; k++) {
        const side = SIDES[(i + k) % SIDES.length];
        const v = await run[side]();
        if (i >= o.warmup) ms[side].push(v);
      }
    }
    const sum = {
      stdio: summarize(ms.stdio),
      http: summarize(ms.http),
      direct: summarize(ms.direct),
      baseline: summarize(ms.baseline),
    };
    s.row(
      "direct forward p50 / p99",
      `${fmt.ms(sum.direct.p50)} / ${fmt.ms(sum.direct.p99)}`,
      `n=${sum.direct.n}`,
    );
    const measured = o.baseline
      ? (["stdio", "http", "baseline"] as const)
      : (["stdio", "http"] as const);
    for (const side of measured) {
      const a50 = sum[side].p50 - sum.direct.p50;
      const a99 = sum[side].p99 - sum.direct.p99;
      s.row(
        `${side}: MCP p50 / p99`,
        `${fmt.ms(sum[side].p50)} / ${fmt.ms(sum[side].p99)}`,
        `n=${sum[side].n}`,
      );
      s.row(`${side}: added p50 / p99`, `${fmt.ms(a50)} / ${fmt.ms(a99)}`, "MCP minus direct");
      s.fig(`${side}.p50_ms`, sum[side].p50);
      s.fig(`${side}.p99_ms`, sum[side].p99);
      s.fig(`${side}.added_p50_ms`, a50);
      s.fig(`${side}.added_p99_ms`, a99);
    }
    s.fig("direct.p50_ms", sum.direct.p50);
    s.fig("direct.p99_ms", sum.direct.p99);

    // Throughput. The direct side: batch-1 forwards back to back, timed inside Python.
    const directRuns = await direct.inferTensor([1, 1, 28, 28], values, o.throughputCalls);
    const directRate = 1000 / (directRuns.reduce((a, b) => a + b, 0) / directRuns.length);
    s.row("direct: batch-1 forwards per second", fmt.rate(directRate), "one Python thread");
    s.fig("direct.calls_per_s", directRate);
    const rates: Record<"stdio" | "http" | "baseline", number[]> = {
      stdio: [],
      http: [],
      baseline: [],
    };
    // Where the CPU of a call goes during the rounds: the client (this process: the SDK's own
    // client), the server and its worker. On 2 cores their sum per call bounds the rate.
    type Cpu = { client: number; server: number; worker: number };
    const cpu: Record<"stdio" | "http" | "baseline", Cpu> = {
      stdio: { client: 0, server: 0, worker: 0 },
      http: { client: 0, server: 0, worker: 0 },
      baseline: { client: 0, server: 0, worker: 0 },
    };
    const workers: Partial<Record<Side, number>> = {};
    for (const side of measured) workers[side] = await workerPid(o[side]!);
    for (let r = 0; r < o.rounds; r++) {
      const order = r % 2 ? [...measured].reverse() : measured;
      for (const side of order) {
        const pids = [o[side]!.pid, workers[side]!] as const;
        const c0 = [cpuMs("self"), cpuMs(pids[0]), cpuMs(pids[1])];
        const t0 = performance.now();
        await withCallers(o.callers, o.throughputCalls, async () => {
          await o[side]!.call("run_inference", args);
        });
        rates[side].push(o.throughputCalls / ((performance.now() - t0) / 1000));
        const perCall = (i: number, now: number) => ((now - c0[i]) * 1000) / o.throughputCalls;
        cpu[side].client += perCall(0, cpuMs("self")) / o.rounds;
        cpu[side].server += perCall(1, cpuMs(pids[0])) / o.rounds;
        cpu[side].worker += perCall(2, cpuMs(pids[1])) / o.rounds;
      }
    }
    for (const side of measured) {
      const best = Math.max(...rates[side]);
      const med = summarize(rates[side]).p50;
      s.row(
        `${side}: ${o.callers} callers, calls per second`,
        fmt.rate(med),
        `median of ${o.rounds} rounds of ${o.throughputCalls} (best ${best.toFixed(0)}); ${fmt.x(med / directRate)} the direct rate`,
      );
      s.fig(`${side}.calls_per_s`, med);
      s.fig(`${side}.vs_direct_rate`, med / directRate);
      const c = cpu[side];
      const sum = c.client + c.server + c.worker;
      s.row(
        `${side}: CPU per call, client / server / worker`,
        `${c.client.toFixed(0)} / ${c.server.toFixed(0)} / ${c.worker.toFixed(0)} µs`,
        `sum ${sum.toFixed(0)} µs: at most ${fmt.rate((cpus * 1e6) / sum)} on ${cpus} cores; the direct forward alone is ${(1e6 / directRate) | 0} µs`,
      );
      s.fig(`${side}.cpu_us_client`, c.client);
      s.fig(`${side}.cpu_us_server`, c.server);
      s.fig(`${side}.cpu_us_worker`, c.worker);
    }
  } finally {
    await direct.close();
  }
  s.note(
    `small: ${o.model} batch 1, ${o.calls} calls per side interleaved; throughput with ${o.callers} concurrent callers, stdio and HTTP rounds alternating; rate limit and budget raised by the bench config.`,
  );
  return s.result();
}
