// The budget-cap scenario (issue 22), shared by test/e2e/budget_cap.test.ts and
// `BENCH_ONLY=budget npm run bench`: a real HTTP server whose worker runs benchmark iterations
// that cost at least UNDER times what the estimate says, at the two lowest levels there are and
// never by the gate. The worker runs with the test knob TPU_WORKER_CPU_DEVICE_WAIT_S (every CPU
// synchronize() waits DEVICE_WAIT_S, as a host waits for a slower device: two per benchmark
// iteration, so each costs at least 2 × DEVICE_WAIT_S whatever the host's load), and the store
// of measured calls, which estimates read first (policies/estimate.ts, fromCalls), holds a call
// of the scenario's exact work that took so little that, with the worst case of its stability
// extension (EXTEND_FACTOR × its iterations, priced from a planted pass latency of the knob's
// floor), it is estimated at EST = FLOOR_S / UNDER. An unstable series is extended past its N
// iterations (stability.py): that only adds to the real cost, and every stop here comes before
// the N asked are done, so the reports are partial whatever the host's load.
import { closeSync, mkdirSync, openSync } from "node:fs";
import { join } from "node:path";
import Database from "better-sqlite3";
import { hashToken } from "../../policies/config.js";
import { estimateCost, workOf, type EstimateInput } from "../../policies/estimate.js";
import { SqliteReports } from "../../tools/stores/reports.js";
import { slowdown } from "./calibrate.js";
import {
  connectHttp,
  errorOf,
  startHttpServer,
  writeConfig,
  type HttpServerProc,
} from "./server.js";

/** How much cheaper the planted measurement says a benchmark is than its floor. */
export const UNDER = 2.5;
/**
 * What each synchronize() of the worker waits (the test knob): two per iteration. Scaled with
 * the machine's slowdown, and every figure below with it: the call timeout must leave the
 * set-up's warm-up (a worker's first benchmark imports for seconds, more on a loaded machine)
 * the time it needs, and stay a fixed multiple of the estimate.
 */
export const DEVICE_WAIT_S = Math.round(0.05 * slowdown() * 1000) / 1000;
export const BATCH = 1;
/** The timeout case's batch: its own work, so its call is never a repeat of the others'. */
export const TIMEOUT_BATCH = 2;
export const WARMUP = 1;
/** The set-up's warm-up batch: its report is history too, but never the nearest to a case's. */
const WARM_BATCH = 16;
/** Iterations per benchmark. */
export const N = 80;
/** The least a benchmark's requested window costs: (WARMUP + N) × 2 waits (8.1 s on a quiet machine). */
export const FLOOR_S = Math.round((WARMUP + N) * 2 * DEVICE_WAIT_S * 1000) / 1000;
/** The estimate: what the planted measured call of the same work took, FLOOR_S / UNDER. */
export const EST = Math.round((FLOOR_S / UNDER) * 1000) / 1000;
/** Three estimates and a half: three calls of eight admitted, half an estimate to share. */
export const LIMIT = Math.round(3.5 * EST * 1000) / 1000;
/**
 * Past the timeout case's estimate (EST) and its own budget stop (LIMIT), short of its real
 * work (≥ FLOOR_S = 2.5 × EST), and long enough for the set-up's warm-up benchmark.
 */
export const TIMEOUT = Math.round(2 * EST * 1000) / 1000;
/** The benchmark every principal runs. */
export const BENCH = { model: "mnist-cnn", batch_sizes: [BATCH], iterations: N, warmup: WARMUP };

const SCOPES = ["models:read", "benchmark:run", "jobs:read"];
/** Principals with a budget of LIMIT each (budgets are per principal). */
export const TOKENS = {
  runner: "runner-token-0123456789ab",
  slow: "slow-token-0123456789abcd",
};
export const ADMIN = "admin-token-0123456789abc";
/** The warm-up's benchmark runs on a line of its own: on a loaded machine the load's charge left
 * admin's line too little for the benchmark's estimate (26.8 s used, 43.9 s asked of 61.9 s). */
const WARMUP_TOKEN = "warmup-token-0123456789abc";

/** What the money twin (budget_cap_money.test.ts) changes in the scenario's server. */
export interface CapServerOptions {
  /** Replaces limits.budget (device_seconds_per_window: LIMIT). */
  budget?: Record<string, unknown>;
  pricing?: Record<string, unknown>;
  /** Principals beside the scenario's, with its scopes. */
  tokens?: Record<string, string>;
  /** Replaces the approvals section (no rules, no elicitation). */
  approvals?: Record<string, unknown>;
}

/** A pass's latency the planted report says (the knob's floor of two waits), ms. */
const PASS_MS = 2 * DEVICE_WAIT_S * 1000;

/**
 * Keeps, through the server's own store, a benchmark report of one pass at batch 1 taking
 * PASS_MS (the latency history estimates price a pass from; the set-up's warm-up measures batch
 * WARM_BATCH, farther from the cases' batches than this one), and one measured call of BENCH's
 * exact work at each batch: the work as run_benchmark's estimate sees it (its defaults resolved;
 * a tensor model's sequence is 1), taking what makes the next call of that work, with the worst
 * case of its extension, estimated at `estimate` (the estimator itself says how much of it the
 * extension is).
 */
function plantCalls(dataDir: string, batches: number[], estimate: number): void {
  // Private as the server makes its stores (SQLite gives its -wal and -shm files this mode).
  mkdirSync(dataDir, { recursive: true, mode: 0o700 });
  const file = join(dataDir, "reports.db");
  closeSync(openSync(file, "a", 0o600));
  const reports = new SqliteReports(file);
  try {
    reports.put("setup", BENCH.model, "cpu", {
      model: BENCH.model,
      work: "forward",
      configs: [
        {
          batch: 1,
          seq_len: null,
          dtype: "float32",
          mode: "eager",
          work: "forward",
          latency_ms: { mean: PASS_MS, p50: PASS_MS },
          error: null,
        },
      ],
    });
    for (const batch of batches) {
      const input: EstimateInput = {
        kind: "benchmark",
        args: {
          ...BENCH,
          batch_sizes: [batch],
          modes: ["eager"],
          scenario: "single-stream",
          work: "forward",
          seq_lens: [1],
          dtypes: ["float32"],
        },
        model: {
          id: BENCH.model,
          parameters: 0,
          weight_bytes: 0,
          dtypes: ["float32"],
          default_dtype: "float32",
        },
        history: [
          {
            model: BENCH.model,
            device: "cpu",
            batch: 1,
            seq_len: 1,
            dtype: "float32",
            mode: "eager",
            mean_latency_ms: PASS_MS,
          },
        ],
      };
      const work = workOf(input);
      const at = Date.now() - 60_000;
      // Linear in the measured seconds: what a call of 1 s makes the estimate.
      const perSecond = estimateCost({
        ...input,
        calls: [{ kind: "benchmark", model: BENCH.model, device: "cpu", work, seconds: 1, at }],
      }).device_seconds;
      void reports.recordCall({
        kind: "benchmark",
        model: BENCH.model,
        device: "cpu",
        work,
        seconds: estimate / perSecond,
        at,
      });
    }
  } finally {
    reports.close();
  }
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
 * Starts the server in `dir` (its data dir `dir/data`) with the planted calls (EST for both
 * cases' work), the knob and a budget of LIMIT per principal (TIMEOUT for run_benchmark), loads
 * mnist-cnn and runs one benchmark as an admin: benchmarks of a loaded model measure it in place
 * (no temporary copy to build and free), and the first benchmark of a worker imports what every
 * benchmark needs (a one-time step of seconds that checks no stop). The warm-up is an offline
 * run, another class of work than the scenario's single-stream ones: its measured call and its
 * report never stand for theirs, and it priced nothing from measured calls, so it says nothing
 * of the host's drift either (policies/estimate.ts). One iteration asked (at most 4 once
 * extended) keeps it far within TIMEOUT.
 */
export async function startCapServer(
  dir: string,
  opts: CapServerOptions = {},
): Promise<HttpServerProc> {
  const dataDir = join(dir, "data");
  plantCalls(dataDir, [BATCH, TIMEOUT_BATCH], EST);
  const config = writeConfig(
    {
      policy: {
        tokens: [
          ...Object.entries({ ...TOKENS, ...opts.tokens }).map(([id, token]) => ({
            id,
            token_sha256: hashToken(token),
            scopes: SCOPES,
          })),
          { id: "admin", token_sha256: hashToken(ADMIN), scopes: ["admin"] },
          { id: "warmup", token_sha256: hashToken(WARMUP_TOKEN), scopes: ["admin"] },
        ],
        limits: {
          rate_limit: { per_principal_per_minute: 6000 },
          soft_deadline_s: 0,
          call_timeout_s: { run_benchmark: TIMEOUT },
          budget: opts.budget ?? { device_seconds_per_window: LIMIT, window_s: 3600 },
        },
        approvals: opts.approvals ?? { rules: [], elicitation: false },
        ...(opts.pricing ? { pricing: opts.pricing } : {}),
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
  // A set-up that fails stops the server it started: no test owns it yet.
  try {
    await warmUp(server);
  } catch (e) {
    await server.stop();
    throw e;
  }
  return server;
}

/** Loads the model (as admin) and runs one offline benchmark (as warmup), so no case pays the first call. */
async function warmUp(server: HttpServerProc): Promise<void> {
  const admin = await connectHttp(server.url, ADMIN);
  const warm = await connectHttp(server.url, WARMUP_TOKEN);
  try {
    for (const [tool, args] of [
      ["load_model", { model: "mnist-cnn" }],
      [
        "run_benchmark",
        {
          model: BENCH.model,
          scenario: "offline",
          batch_sizes: [WARM_BATCH],
          iterations: 1,
          warmup: 0,
        },
      ],
    ] as const) {
      const by = tool === "load_model" ? admin : warm;
      const r = await by.client.callTool({ name: tool, arguments: args });
      // A warm-up stopped by the scenario's limits would leave the one-time step to a case.
      const stopped = (r.structuredContent as { stopped?: string } | undefined)?.stopped;
      if (r.isError || stopped)
        throw new Error(`${tool}: ${JSON.stringify(errorOf(r) ?? { stopped })}`);
    }
  } finally {
    await warm.close();
    await admin.close();
  }
}
