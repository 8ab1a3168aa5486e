// Issue 22, item 1: a budget is a cap, not a reservation. Eight concurrent benchmarks of one
// principal whose real cost is about three times their estimate: the gate admits what the
// budget holds on the estimates, meters each running call, and stops it when its device time
// reaches its estimate plus what is left of the budget; the worker ends the grid at the next
// iteration and the partial report comes back marked `stopped: "budget"` and charged. A job
// ends with its partial result the same way, and call_timeout_s stops a benchmark with its
// partial report marked `stopped: "timeout"`.
//
// A real HTTP server and worker, real SDK clients (test/helpers/budget_cap.ts has the scenario:
// a worker test knob gives every benchmark iteration a floor of device time, and the store of
// measured calls says the same work took so little that its estimate, the worst case of its
// stability extension included, is UNDER times less than that floor, so the real cost is at least
// UNDER × the estimate; extending an unstable series only adds to it).
// Assertions are on outcomes and on the seconds the budget charged (policy.db), with one stop
// latency (STOP_LATENCY_S, docs/policies-and-approvals.md) as the tolerance, never on wall times.
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  BENCH,
  charges,
  DEVICE_WAIT_S,
  EST,
  LIMIT,
  N,
  startCapServer,
  TIMEOUT,
  TIMEOUT_BATCH,
  TOKENS,
} from "../helpers/budget_cap.js";
import { scaled, slowdown } from "../helpers/calibrate.js";
import { connectHttp, errorOf, type HttpServerProc } from "../helpers/server.js";
import { auditRows, cleanupTemp, recordFigure, tempDir, until } from "../hardening/helpers.js";
import { call } from "./scenario.js";

/**
 * The stop latency the budget is held to: from the moment a call's line runs out to the moment
 * its work has ended and is charged (the gate's timer, the cancel on the pipe, the worker's next
 * iteration check, the partial report back). Measured at 0.03–0.75 s on the shared 2-core
 * development VM under heavy load (the figures this test records); the target is 1 s on a
 * quiet machine, and each of those steps takes machine time, so it scales with the slowdown.
 */
const STOP_LATENCY_S = slowdown();

const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);

describe("a budget is a cap: running calls are stopped when it runs out, with their partial results", () => {
  const dir = tempDir("tpu-mcp-budget-cap-");
  const dataDir = join(dir, "data");
  let server: HttpServerProc;
  const bench = BENCH;

  beforeAll(async () => {
    recordFigure("budget_cap_setup", { EST, LIMIT, TIMEOUT, DEVICE_WAIT_S, N });
    server = await startCapServer(dir);
  }, scaled(180_000));

  afterAll(async () => {
    await server?.stop();
    cleanupTemp();
  });

  it(
    "stops a benchmark at call_timeout_s with its partial report marked stopped: timeout",
    async () => {
      const c = await connectHttp(server.url, TOKENS.slow);
      try {
        // Its own work (another batch), planted at EST like the others: admitted within the
        // budget, its real work (≥ 2.5 × EST) runs past the timeout (2 × EST) well before the
        // budget would stop it (3.5 × EST).
        const r = await call(c.client, "run_benchmark", { ...bench, batch_sizes: [TIMEOUT_BATCH] });
        expect(r.isError, JSON.stringify(r).slice(0, 500)).toBeFalsy();
        expect(r.structuredContent.stopped).toBe("timeout");
        expect(r.structuredContent.cancelled).toBe(false);
        expect(r.structuredContent.configs.length).toBe(1);
        for (const cfg of r.structuredContent.configs) expect(cfg.iterations).toBeLessThan(N);
        const ended = await until(() => {
          const ch = charges(dataDir, "slow");
          return ch.length === 1 && ch;
        }, scaled(30_000));
        // What the worker measured beside what was charged: a slow stop shows where it was spent.
        const cfg = r.structuredContent.configs[0];
        recordFigure("budget_cap_timeout", {
          timeout_s: TIMEOUT,
          charged_s: ended[0],
          iterations: cfg?.iterations,
          measured_s: cfg?.measured_s,
        });
        expect(ended[0]).toBeLessThanOrEqual(TIMEOUT + STOP_LATENCY_S);
        const failed = await until(
          () =>
            auditRows(dataDir).find(
              (a) => a.principal === "slow" && a.tool === "run_benchmark" && a.outcome === "failed",
            ),
          scaled(10_000),
        );
        expect(failed.code).toBe("timeout");
        // Admitted on the planted estimate, as the eight below are.
        const allowed = auditRows(dataDir).find(
          (a) => a.principal === "slow" && a.tool === "run_benchmark" && a.outcome === "allowed",
        );
        expect(allowed?.estimate.device_seconds).toBeCloseTo(EST, 2);
      } finally {
        await c.close();
      }
    },
    scaled(300_000),
  );

  it(
    "holds 8 concurrent under-estimated benchmarks to the budget plus one stop latency, returning their partial reports",
    async () => {
      const clients = await Promise.all(
        Array.from({ length: 8 }, () => connectHttp(server.url, TOKENS.runner)),
      );
      try {
        // The first is a job (wait: false): it holds the device first, and ends by the budget.
        const started = await call(clients[0].client, "run_benchmark", { ...bench, wait: false });
        expect(started.isError, JSON.stringify(started)).toBeFalsy();
        const jobId = started.structuredContent.job_id as string;
        const answers = await Promise.all(
          clients.slice(1).map((c) => call(c.client, "run_benchmark", bench)),
        );
        const job = await until(async () => {
          const j = (await call(clients[0].client, "get_job", { job_id: jobId })).structuredContent;
          return j.status !== "running" && j;
        }, scaled(120_000));

        // Admitted on their estimates (the measured call planted says 1 / UNDER of the floor)...
        const allowed = auditRows(dataDir).filter(
          (r) => r.principal === "runner" && r.tool === "run_benchmark" && r.outcome === "allowed",
        );
        expect(allowed.length).toBeGreaterThanOrEqual(2);
        expect(allowed.length).toBeLessThanOrEqual(3);
        for (const a of allowed) expect(a.estimate.device_seconds).toBeCloseTo(EST, 2);
        // ...the others refused before they ran.
        const refused = answers.filter((a) => a.isError);
        expect(refused.length).toBe(8 - allowed.length);
        for (const r of refused) expect(errorOf(r)?.code).toBe("budget_exceeded");

        // The job ended with its partial result, marked stopped by the budget.
        expect(job.status, JSON.stringify(job)).toBe("succeeded");
        expect(job.result.stopped).toBe("budget");
        expect(job.result.cancelled).toBe(false);
        expect(job.result.configs.length).toBe(1);
        expect(job.result.configs[0].iterations).toBeLessThan(N);
        expect(job.result.configs[0].latency_ms.p50).toBeGreaterThan(0);
        // The admitted wait:true calls answered with partial reports, also marked stopped.
        const reports = answers.filter((a) => !a.isError).map((a) => a.structuredContent);
        expect(reports.length).toBe(allowed.length - 1);
        for (const r of reports) {
          expect(r.stopped).toBe("budget");
          expect(r.report_id).toMatch(/^bench_/);
          for (const c of r.configs) expect(c.iterations).toBeLessThan(N);
        }

        // Charged what they used: one charge per admitted call, and all of them together within
        // the budget plus one stop latency (uncapped, they would have used about UNDER × each).
        const ended = await until(() => {
          const c = charges(dataDir, "runner");
          return c.length === allowed.length && c;
        }, scaled(30_000));
        const used = sum(ended);
        recordFigure("budget_cap_8_concurrent", {
          limit_s: LIMIT,
          charged_s: Math.round(used * 1000) / 1000,
          overrun_s: Math.round((used - LIMIT) * 1000) / 1000,
          estimate_s: EST,
          charges_s: ended,
        });
        expect(used).toBeLessThanOrEqual(LIMIT + STOP_LATENCY_S);
        // Stopped calls are recorded as such, with what they used.
        const failed = auditRows(dataDir).filter(
          (r) => r.principal === "runner" && r.tool === "run_benchmark" && r.outcome === "failed",
        );
        expect(failed.filter((r) => r.code === "budget_exceeded").length).toBeGreaterThanOrEqual(
          allowed.length,
        );
      } finally {
        await Promise.all(clients.map((c) => c.close()));
      }
    },
    scaled(300_000),
  );
});
