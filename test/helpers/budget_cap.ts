// The budget-cap scenario (issue 22), shared by test/e2e/budget_cap.test.ts and
// `BENCH_ONLY=budget npm run bench`: a real HTTP server whose worker runs benchmark iterations
// that cost at least UNDER times what the estimate says, at the two lowest levels there are and
// never by the gate. The worker runs with the test knob TPU_WORKER_CPU_DEVICE_WAIT_S (every CPU
// synchronize() waits DEVICE_WAIT_S, as a host waits for a slower device: two per benchmark
// iteration, so each costs at least 2 × DEVICE_WAIT_S whatever the host's load), and the
// estimator's history store holds a report that claims 2 × DEVICE_WAIT_S / UNDER per forward at
// the benchmarked shape.
import { chmodSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import Database from "better-sqlite3";
import { hashToken } from "../../policies/config.js";
import {
  connectHttp,
  errorOf,
  startHttpServer,
  writeConfig,
  type HttpServerProc,
} from "./server.js";

/** How much cheaper the planted history says a benchmark iteration is than its floor. */
export const UNDER = 2.5;
/** What each synchronize() of the worker waits (the test knob): two per iteration. */
export const DEVICE_WAIT_S = 0.05;
export const BATCH = 1;
export const WARMUP = 1;
/** Iterations per benchmark: at least (WARMUP + N) × 2 × DEVICE_WAIT_S = 4.1 s of real work. */
export const N = 40;
const PLANTED_MS = ((2 * DEVICE_WAIT_S) / UNDER) * 1000;
/** The estimate with history: (warmup + iterations + the fp32 reference) × the planted mean. */
export const EST = Math.round((WARMUP + N + 1) * PLANTED_MS) / 1000;
/** Three estimates and a half: three calls of eight admitted, half an estimate to share. */
export const LIMIT = Math.round(3.5 * EST * 1000) / 1000;
/** Past any budget stop of the eight (at most 1.5 × EST), short of the real work (≥ 2.4 × EST). */
export const TIMEOUT = Math.round(2 * EST * 1000) / 1000;
/** The benchmark every principal runs. */
export const BENCH = { model: "mnist-cnn", batch_sizes: [BATCH], iterations: N, warmup: WARMUP };

const SCOPES = ["models:read", "benchmark:run", "jobs:read"];
/** Principals with a budget of LIMIT each (budgets are per principal). */
export const TOKENS = {
  runner: "runner-token-0123456789ab",
  slow: "slow-token-0123456789abcd",
};
const ADMIN = "admin-token-0123456789abc";

/** A report in the history store whose forward at the benchmarked shape takes `meanMs`. */
function plantHistory(dataDir: string, meanMs: number): void {
  mkdirSync(dataDir, { recursive: true, mode: 0o700 });
  const db = new Database(join(dataDir, "reports.db"));
  try {
    db.exec(`CREATE TABLE IF NOT EXISTS benchmark_reports (
      id TEXT PRIMARY KEY, principal TEXT NOT NULL, model TEXT NOT NULL, device TEXT NOT NULL,
      created_at TEXT NOT NULL, report TEXT NOT NULL)`);
    const lat = { p50: meanMs, p90: meanMs, p99: meanMs, mean: meanMs, min: meanMs, max: meanMs };
    const config = { batch: BATCH, seq_len: null, dtype: "float32", mode: "eager" };
    const report = {
      model: "mnist-cnn",
      scenario: "single-stream",
      work: "forward",
      cancelled: false,
      configs: [{ ...config, work: "forward", latency_ms: lat, error: null }],
      manifest: { device_kind: "cpu" },
    };
    db.prepare("INSERT INTO benchmark_reports VALUES (?, ?, ?, ?, ?, ?)").run(
      "bench_00000000000000000022",
      "someone",
      "mnist-cnn",
      "cpu",
      new Date(Date.now() - 60_000).toISOString(),
      JSON.stringify(report),
    );
  } finally {
    db.close();
  }
  chmodSync(join(dataDir, "reports.db"), 0o600);
}

/** Every charge on a budget line, seconds, oldest first. */
export function charges(dataDir: string, line: string): number[] {
  const db = new Database(join(dataDir, "policy.db"), { readonly: true, fileMustExist: true });
  try {
    return (
      db
        .prepare("SELECT seconds FROM budget_charges WHERE principal = ? ORDER BY id")
        .all(line) as { seconds: number }[]
    ).map((r) => r.seconds);
  } finally {
    db.close();
  }
}

/**
 * Starts the server in `dir` (its data dir `dir/data`) with the planted history, the knob and a
 * budget of LIMIT per principal (TIMEOUT for run_benchmark), loads mnist-cnn and runs one
 * benchmark as an admin: benchmarks of a loaded model measure it in place (no temporary copy to
 * build and free), and the first benchmark of a worker imports what every benchmark needs (a
 * one-time step of seconds that checks no stop). Its shape (batch 64) is never the nearest
 * history of batch 1 or 2.
 */
export async function startCapServer(dir: string): Promise<HttpServerProc> {
  const dataDir = join(dir, "data");
  plantHistory(dataDir, PLANTED_MS);
  const config = writeConfig(
    {
      policy: {
        tokens: [
          ...Object.entries(TOKENS).map(([id, token]) => ({
            id,
            token_sha256: hashToken(token),
            scopes: SCOPES,
          })),
          { id: "admin", token_sha256: hashToken(ADMIN), scopes: ["admin"] },
        ],
        limits: {
          rate_limit: { per_principal_per_minute: 6000 },
          soft_deadline_s: 0,
          call_timeout_s: { run_benchmark: TIMEOUT },
          budget: { device_seconds_per_window: LIMIT, window_s: 3600 },
        },
        approvals: { rules: [], elicitation: false },
      },
    },
    dir,
  );
  // The server hands its environment to the worker; the knob is set only while it starts.
  const before = process.env.TPU_WORKER_CPU_DEVICE_WAIT_S;
  process.env.TPU_WORKER_CPU_DEVICE_WAIT_S = String(DEVICE_WAIT_S);
  let server: HttpServerProc;
  try {
    server = await startHttpServer(config);
  } finally {
    if (before === undefined) delete process.env.TPU_WORKER_CPU_DEVICE_WAIT_S;
    else process.env.TPU_WORKER_CPU_DEVICE_WAIT_S = before;
  }
  const admin = await connectHttp(server.url, ADMIN);
  try {
    for (const [tool, args] of [
      ["load_model", { model: "mnist-cnn" }],
      ["run_benchmark", { model: "mnist-cnn", batch_sizes: [64], iterations: 1, warmup: 0 }],
    ] as const) {
      const r = await admin.client.callTool({ name: tool, arguments: args });
      if (r.isError) throw new Error(`${tool}: ${JSON.stringify(errorOf(r))}`);
    }
  } finally {
    await admin.close();
  }
  return server;
}
