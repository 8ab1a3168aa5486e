// `npm run bench` (Ray part, scripts/bench-ray.sh): calls/s through 2 Ray-placed workers against
// 2 locally spawned workers — same model (MiniLM, batch 1), same load (16 callers), both servers
// up at once and measured in alternating rounds (local, ray, local, ray, ...) in this one run;
// the figure is the ratio of the medians. Target: ≥ 0.9 (a Ray worker is a remote worker on
// loopback, TLS + token; Ray only placed it). Runs only in a loopback-only network namespace.
// BENCH_QUICK=1 cuts the sample counts (a smoke run, not figures to quote).
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { cpus, loadavg } from "node:os";
import { join } from "node:path";
import { startRayCluster } from "../test/helpers/fleet.js";
import { writeConfig } from "../test/helpers/server.js";
import {
  MODEL,
  PYTHON,
  ROOT,
  sentences,
  startStdio,
  tempDir,
  type McpServer,
} from "./lib/procs.js";
import { median, withCallers } from "./lib/stats.js";

const quick = process.env.BENCH_QUICK === "1";
const CALLERS = 16;
const PER_ROUND = quick ? 96 : 480;
const ROUNDS = quick ? 2 : 4;
const say = (s: string) => process.stderr.write(`[bench:ray] ${s}\n`);

const limits = {
  limits: {
    rate_limit: { per_principal_per_minute: 100_000_000 },
    budget: { device_seconds_per_window: 1e9, window_s: 3600 },
    queue_bound: { run_inference: 256 },
  },
};

async function readyWorkers(s: McpServer, prefix: string, n: number): Promise<void> {
  const until = Date.now() + 300_000;
  for (;;) {
    const st = await s.client.callTool({ name: "get_runtime_status", arguments: {} });
    const ws = ((st.structuredContent as any)?.workers ?? []) as Array<{
      name: string;
      state: string;
    }>;
    if (ws.filter((w) => w.name.startsWith(prefix) && w.state === "ready").length >= n) return;
    if (Date.now() > until) throw new Error(`${prefix}* workers not ready`);
    await new Promise((r) => setTimeout(r, 500));
  }
}

async function round(s: McpServer, texts: string[]): Promise<number> {
  const t0 = performance.now();
  await withCallers(CALLERS, PER_ROUND, async (i) => {
    await s.call("run_inference", { model: MODEL, texts: [texts[i % texts.length]] });
  });
  return PER_ROUND / ((performance.now() - t0) / 1000);
}

async function main(): Promise<void> {
  const dir = tempDir();
  const cluster = await startRayCluster(join(dir, "cluster"), PYTHON);
  const c = cluster.info;
  const servers: McpServer[] = [];
  try {
    const local = await startStdio(
      writeConfig(
        {
          log_level: "warn",
          runtime: {
            python: PYTHON,
            catalog: c.catalog,
            device: "cpu",
            workers: [
              { name: "w0", device: "cpu", threads: 1 },
              { name: "w1", device: "cpu", threads: 1 },
            ],
          },
          policy: limits,
        },
        mkdtempIn(dir, "local"),
      ),
    );
    servers.push(local);
    const ray = await startStdio(
      writeConfig(
        {
          log_level: "warn",
          runtime: {
            python: PYTHON,
            catalog: c.catalog,
            device: "cpu",
            ray: {
              address: c.address,
              token_file: c.ray_token_file,
              placement: { mode: "per-chip", count: 2 },
              actor: { catalog: c.catalog, device: "cpu", threads: 1 },
              channel: { client_ca: c.ca, token_file: c.token_file },
              client: { cert: c.cert, key: c.key },
            },
          },
          policy: limits,
        },
        mkdtempIn(dir, "ray"),
      ),
    );
    servers.push(ray);
    await readyWorkers(local, "w", 2);
    await readyWorkers(ray, "ray-", 2);
    for (const s of [local, ray]) await s.call("load_model", { model: MODEL, replicas: 2 });
    const texts = sentences(64);
    for (const s of [local, ray])
      await withCallers(
        CALLERS,
        64,
        async (i) => void (await s.call("run_inference", { model: MODEL, texts: [texts[i % 64]] })),
      );
    const rates: Record<"local" | "ray", number[]> = { local: [], ray: [] };
    for (let r = 0; r < ROUNDS; r++) {
      rates.local.push(await round(local, texts));
      rates.ray.push(await round(ray, texts));
      say(
        `round ${r + 1}/${ROUNDS}: local ${rates.local.at(-1)!.toFixed(1)} calls/s, ray ${rates.ray.at(-1)!.toFixed(1)} calls/s`,
      );
    }
    const ratio = median(rates.ray) / median(rates.local);
    const result = {
      command: "npm run bench (scripts/bench-ray.sh)",
      quick,
      callers: CALLERS,
      calls_per_round: PER_ROUND,
      rounds: ROUNDS,
      model: MODEL,
      local_calls_per_s: rates.local,
      ray_calls_per_s: rates.ray,
      ray_vs_local: ratio,
      target: "ray_vs_local >= 0.9",
      pass: ratio >= 0.9,
      machine: { cpus: cpus().length, loadavg_1m: loadavg()[0] },
    };
    mkdirSync(join(ROOT, "bench", "results"), { recursive: true });
    writeFileSync(
      join(ROOT, "bench", "results", "ray-latest.json"),
      JSON.stringify(result, null, 2) + "\n",
    );
    process.stdout.write(
      `Ray fleet vs local pool (2 workers × 1 thread, ${MODEL} batch 1, ${CALLERS} callers, medians of ${ROUNDS} rounds)\n` +
        `  local: ${median(rates.local).toFixed(1)} calls/s   ray: ${median(rates.ray).toFixed(1)} calls/s   ` +
        `ray_vs_local = ${ratio.toFixed(3)} (target ≥ 0.9: ${ratio >= 0.9 ? "PASS" : "FAIL"}); load avg ${loadavg()[0].toFixed(2)}\n`,
    );
  } finally {
    for (const s of servers) await s.close().catch(() => undefined);
    const code = await cluster.stop();
    if (code !== 0) say(`cluster.py exited ${code}: Ray processes may be left`);
    rmSync(dir, { recursive: true, force: true });
  }
}

function mkdtempIn(dir: string, name: string): string {
  const d = join(dir, name);
  mkdirSync(d, { recursive: true });
  return d;
}

await main();
