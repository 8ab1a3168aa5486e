// Benchmarks that say how sure they are (issue 22): one built-in model benchmarked through MCP on
// the host as it is, then under a real load — CPU-burning child processes started here and killed
// by their PIDs — with each configuration's MAD, p50 interval, host load and verdict side by side.
// The detailed result goes to bench/results/stability.json (bench/reference/ keeps a copy).
import { spawn, type ChildProcess } from "node:child_process";
import { mkdirSync, writeFileSync } from "node:fs";
import { cpus, loadavg } from "node:os";
import { join } from "node:path";
import { EXTEND_FACTOR } from "../tools/run_benchmark.js";
import { ROOT, startStdio } from "./lib/procs.js";
import { section, type SectionResult } from "./lib/report.js";

export interface StabilityBenchOptions {
  config: string;
  model: string;
  seqLen: number;
  batchSizes: number[];
  iterations: number;
  /** CPU burners per CPU while loaded. */
  burnersPerCpu: number;
  /** Longest wait for the 1-minute load average to pass the CPU count once the burners run. */
  rampS: number;
  say: (msg: string) => void;
}

interface Side {
  label: string;
  loadavg_before: number;
  configs: {
    batch: number;
    p50_ms: number;
    mad_ms: number;
    p50_ci_ms: [number, number];
    ci_pct_of_p50: number;
    iterations: number;
    iterations_requested: number;
    stable: boolean;
    reason: string | null;
    loadavg_1m: number | null;
    steal_pct: number | null;
    /** The loaded side against the quiet one (compare's verdict on p50). */
    vs_quiet?: { p50_ratio: number; p50_ratio_ci: [number, number] | null; difference: string };
  }[];
}

/** Child processes that spin on a CPU each until killed (by PID, in `stop`). */
function startBurners(n: number): ChildProcess[] {
  return Array.from({ length: n }, () =>
    spawn(process.execPath, ["-e", "for (;;) {}"], { stdio: "ignore" }),
  );
}

function stopBurners(kids: ChildProcess[]) {
  for (const k of kids) if (k.pid && k.exitCode === null) process.kill(k.pid, "SIGKILL");
}

function vsQuiet(cmp: any, batch: number): Pick<Side["configs"][number], "vs_quiet"> {
  const r = cmp?.ratios?.find((x: any) => x.batch === batch);
  return r
    ? {
        vs_quiet: {
          p50_ratio: r.p50_ratio,
          p50_ratio_ci: r.p50_ratio_ci,
          difference: r.difference,
        },
      }
    : {};
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export async function runStability(o: StabilityBenchOptions): Promise<SectionResult> {
  const sec = section("stability");
  const args = {
    model: o.model,
    batch_sizes: o.batchSizes,
    seq_lens: [o.seqLen],
    iterations: o.iterations,
    warmup: 3,
  };
  const server = await startStdio(o.config);
  const sides: Side[] = [];
  let burners: ChildProcess[] = [];
  try {
    await server.call("load_model", { model: o.model });
    const measure = async (label: string, baseline?: string) => {
      const before = loadavg()[0];
      o.say(`stability: ${label} (1-min load ${before.toFixed(2)})…`);
      let r = await server.call("run_benchmark", {
        ...args,
        ...(baseline ? { baseline_id: baseline } : {}),
      });
      // Past the server's soft deadline the answer is a job: follow it to its report.
      while (r.job_id && !r.configs) {
        await sleep(1000);
        const j = await server.call("get_job", { job_id: r.job_id });
        if (j.status === "succeeded") r = j.result;
        else if (j.status !== "running")
          throw new Error(`benchmark job ${j.status}: ${JSON.stringify(j.error)}`);
      }
      sides.push({
        label,
        loadavg_before: before,
        configs: r.configs.map((c: any) => {
          const st = c.stability;
          return {
            batch: c.batch,
            p50_ms: c.latency_ms.p50,
            mad_ms: st.mad_ms,
            p50_ci_ms: st.p50_ci_ms,
            ci_pct_of_p50: (100 * (st.p50_ci_ms[1] - st.p50_ci_ms[0])) / c.latency_ms.p50,
            iterations: c.iterations,
            iterations_requested: st.iterations_requested,
            stable: st.stable,
            reason: st.reason,
            loadavg_1m: st.loadavg_1m,
            steal_pct: st.steal_pct,
            ...vsQuiet(r.comparison, c.batch),
          };
        }),
      });
      return r.report_id as string | undefined;
    };
    const quietId = await measure("quiet");
    burners = startBurners(o.burnersPerCpu * cpus().length);
    o.say(
      `stability: ${burners.length} CPU burners (pids ${burners.map((b) => b.pid).join(", ")})`,
    );
    const t0 = performance.now();
    while (loadavg()[0] <= cpus().length && performance.now() - t0 < o.rampS * 1000)
      await sleep(1000);
    await measure("loaded", quietId);
  } finally {
    stopBurners(burners);
    await server.close();
  }
  const [quiet, loaded] = sides;
  for (const q of quiet.configs) {
    const l = loaded.configs.find((x) => x.batch === q.batch)!;
    const cell = (c: typeof q) =>
      `p50 ${c.p50_ms.toFixed(2)} ms, MAD ${c.mad_ms.toFixed(2)}, CI ${c.p50_ci_ms.map((v) => v.toFixed(2)).join("–")} (${c.ci_pct_of_p50.toFixed(1)} %), ${c.iterations}/${c.iterations_requested} it, ${c.stable ? "stable" : `unstable: ${c.reason}`}`;
    sec.row(`b${q.batch} quiet`, q.stable ? "stable" : "UNSTABLE", cell(q));
    sec.row(`b${q.batch} loaded`, l.stable ? "stable" : "UNSTABLE", cell(l));
    if (l.vs_quiet) {
      const v = l.vs_quiet;
      sec.row(
        `b${q.batch} loaded vs quiet`,
        v.difference,
        `p50 ×${v.p50_ratio.toFixed(2)}` +
          (v.p50_ratio_ci ? ` (${v.p50_ratio_ci.map((x) => x.toFixed(2)).join("–")})` : ""),
      );
    }
    for (const [side, c] of [
      ["quiet", q],
      ["loaded", l],
    ] as const) {
      sec.fig(`b${q.batch}.${side}.p50_ms`, c.p50_ms);
      sec.fig(`b${q.batch}.${side}.mad_ms`, c.mad_ms);
      sec.fig(`b${q.batch}.${side}.ci_pct_of_p50`, c.ci_pct_of_p50);
      sec.fig(`b${q.batch}.${side}.stable`, c.stable ? 1 : 0);
    }
  }
  sec.note(
    `stability: ${o.model} seq ${o.seqLen}, ${o.iterations} iterations asked (an unstable configuration runs up to ${EXTEND_FACTOR}×); loaded = ${burners.length} CPU burners`,
  );
  const detail = {
    command: "BENCH_ONLY=stability npm run bench",
    date: new Date().toISOString(),
    machine: { cpus: cpus().length, cpu_model: cpus()[0]?.model },
    request: args,
    burners: burners.length,
    sides,
  };
  const dir = join(ROOT, "bench", "results");
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, "stability.json"), JSON.stringify(detail, null, 2) + "\n");
  return sec.result();
}
