// Issue 23, finding 6 (one of the smaller ones): a cancelled wait:true benchmark was recorded as
// `executed`. A benchmark stopped by a cancel returns its finished part (flagged cancelled), which
// the gate took for a finished call. Cancelled calls are recorded `failed` with code `cancelled`,
// however they were cancelled: the client's notifications/cancelled before it held a job id, or
// cancel_job on the job a wait:true call became at its soft deadline. A real HTTP server and
// worker, a real SDK client, and the trail as `tpu-mcp audit tail --json` prints it.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { hashToken } from "../../policies/config.js";
import {
  cli,
  connectHttp,
  startHttpServer,
  writeConfig,
  type HttpServerProc,
} from "../helpers/server.js";
import { call } from "../e2e/scenario.js";
import { cleanupTemp, sleep, tempDir, until } from "./helpers.js";
import { scaled } from "../helpers/calibrate.js";

const RUNNER = "runner-token-0123456789";
const SCOPES = ["models:read", "benchmark:run", "jobs:read"];
/** Long enough never to end on its own within the test. */
const LONG = { model: "mnist-cnn", duration_s: 120, warmup: 0 };

describe("a cancelled wait:true benchmark is audited as cancelled, not executed", () => {
  const dir = tempDir("tpu-mcp-cancelled-bench-");
  let config: string;
  let server: HttpServerProc;

  beforeAll(async () => {
    config = writeConfig(
      {
        policy: {
          tokens: [{ id: "runner", token_sha256: hashToken(RUNNER), scopes: SCOPES }],
          limits: { soft_deadline_s: 3, rate_limit: { per_principal_per_minute: 6000 } },
          approvals: { rules: [], elicitation: false },
        },
      },
      dir,
    );
    server = await startHttpServer(config);
  }, scaled(120_000));

  afterAll(async () => {
    await server?.stop();
    cleanupTemp();
  });

  /** The trail's run_benchmark records that end a call, oldest first (the CLI reads the store). */
  async function endings(): Promise<Array<Record<string, any>>> {
    const tail = await cli(config, "audit", "tail", "-n", "200", "--json");
    expect(tail.code, tail.stderr).toBe(0);
    return (JSON.parse(tail.stdout) as Array<Record<string, any>>).filter(
      (r) => r.tool === "run_benchmark" && (r.outcome === "executed" || r.outcome === "failed"),
    );
  }

  /** The one ending recorded after `before` endings: the runner's call, failed as cancelled. */
  async function cancelledEnding(before: number): Promise<Record<string, any>> {
    const ended = await until(async () => {
      const e = (await endings()).slice(before);
      return e.length > 0 && e;
    }, 30_000);
    expect(ended).toHaveLength(1);
    expect(ended[0]).toMatchObject({ principal: "runner", outcome: "failed", code: "cancelled" });
    return ended[0]!;
  }

  it(
    "records a benchmark the client cancels (notifications/cancelled) as failed: cancelled",
    async () => {
      const c = await connectHttp(server.url, RUNNER);
      try {
        const before = (await endings()).length;
        const abort = new AbortController();
        const running = call(c.client, "run_benchmark", LONG, { signal: abort.signal });
        // Cancelled while it runs, before the soft deadline turns it into a job.
        await sleep(1000);
        abort.abort("the user pressed stop");
        await expect(running).rejects.toThrow();
        await cancelledEnding(before);
      } finally {
        await c.close();
      }
    },
    scaled(120_000),
  );

  it(
    "records a soft-deadline job stopped with cancel_job as failed: cancelled, and keeps its finished part",
    async () => {
      const c = await connectHttp(server.url, RUNNER);
      try {
        const before = (await endings()).length;
        // wait:true (the default): past the soft deadline the answer is a job id.
        const r = await call(c.client, "run_benchmark", LONG);
        expect(r.isError, JSON.stringify(r)).toBeFalsy();
        const jobId = r.structuredContent.job_id as string;
        expect(jobId).toMatch(/^job_/);
        const cancelled = await call(c.client, "cancel_job", { job_id: jobId });
        expect(cancelled.isError, JSON.stringify(cancelled)).toBeFalsy();
        const job = await until(async () => {
          const j = (await call(c.client, "get_job", { job_id: jobId })).structuredContent;
          return j.status !== "running" && j;
        }, 60_000);
        // The job keeps what it measured before the cancel...
        expect(job.status).toBe("cancelled");
        expect(job.result?.cancelled).toBe(true);
        // ...and the trail says the call was cancelled, not executed.
        const ended = await cancelledEnding(before);
        expect(ended.reason).toMatch(/cancelled by cancel_job/);
      } finally {
        await c.close();
      }
    },
    scaled(120_000),
  );
});
