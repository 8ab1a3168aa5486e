// Jobs with owners and leases on a real PostgreSQL: a job is cancelled from another replica, a
// replica killed with SIGKILL (a real process) has its job marked interrupted only once its lease
// expired, and a restarted replica marks only its own jobs.
import { spawn, type ChildProcess } from "node:child_process";
import { createInterface } from "node:readline";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PgJobs } from "../../server/app/postgres/jobs.js";
import { openPool, type PgPool } from "../../server/stores/pg/pool.js";
import { migrate } from "../../server/app/postgres/schema.js";
import { scaled, slowdown } from "../helpers/calibrate.js";
import { startPostgres, type TestPostgres } from "../helpers/postgres.js";
import { ROOT } from "../helpers/server.js";
import { waitFor as waitUntil } from "../helpers/wait.js";

/** Until `fn` answers a value, within this file's deadline. */
const waitFor = <T>(what: string, fn: () => T | undefined | Promise<T | undefined>) =>
  waitUntil(what, fn, scaled(60_000));

let db: TestPostgres;
let pools: PgPool[] = [];
let child: ChildProcess | undefined;
const LEASE_S = 3 * slowdown();

const untilAbort = (signal: AbortSignal) =>
  new Promise<Record<string, unknown>>((_, reject) =>
    signal.addEventListener("abort", () => reject(signal.reason)),
  );

beforeAll(async () => {
  db = await startPostgres();
  pools = ["b", "c", "b2"].map((n) => openPool(db.url, { max: 4, application: `tpu-mcp-${n}` }));
  await migrate(pools[0]!);
});

afterAll(async () => {
  if (child && child.exitCode === null) child.kill("SIGKILL");
  await Promise.all(pools.map((p) => p.end()));
  await db?.stop();
});

describe("jobs across replicas", () => {
  it("a job started on B is read and cancelled through C; B aborts it", async () => {
    const b = await PgJobs.open(pools[0]!, "b", { leaseS: LEASE_S });
    const c = await PgJobs.open(pools[1]!, "c", { leaseS: LEASE_S });
    try {
      const job = await b.start("run_benchmark", "alice", untilAbort);
      expect(await c.get(job.job_id, "alice")).toMatchObject({ status: "running", owner: "b" });
      expect(await c.get(job.job_id, "bob")).toBeUndefined();
      await c.cancel(job.job_id, "alice");
      await b.settled(job.job_id);
      expect((await c.get(job.job_id, "alice"))!.status).toBe("cancelled");
    } finally {
      await b.close();
      await c.close();
    }
  });

  it("progress, the operator's list and an operator's cancel work from any replica", async () => {
    const b = await PgJobs.open(pools[0]!, "b", { leaseS: LEASE_S });
    const c = await PgJobs.open(pools[1]!, "c", { leaseS: LEASE_S });
    try {
      let step!: (p: number, total?: number, message?: string) => void;
      const job = await b.start("run_benchmark", "alice", (signal, progress) => {
        step = progress;
        return untilAbort(signal);
      });
      expect(job).toMatchObject({
        status: "running",
        progress: null,
        created_at: expect.any(String),
      });
      step(2, 5, "config 2 of 5");
      const seen = await waitFor("the progress on C", async () => {
        const r = await c.get(job.job_id, "alice");
        return r?.progress === 2 ? r : undefined;
      });
      expect(seen).toMatchObject({ total: 5, message: "config 2 of 5" });
      expect((await c.listAll()).map((j) => j.job_id)).toContain(job.job_id);
      expect(b.running()).toBe(1);
      expect(c.running()).toBe(0);
      await c.cancelAny(job.job_id);
      await b.tick();
      await b.settled(job.job_id);
      expect((await c.get(job.job_id, "alice"))!.status).toBe("cancelled");
      // A job that throws ends failed with the tools' redacted error.
      const failed = await c.start("load_model", "alice", async () => {
        throw new Error("boom at /secret/path/model.bin");
      });
      await c.settled(failed.job_id);
      const f = await b.get(failed.job_id, "alice");
      expect(f!.status).toBe("failed");
      expect(f!.error!.message).not.toContain("/secret/path");
    } finally {
      await b.close();
      await c.close();
    }
  });

  it("kill -9 of a replica: its job is interrupted only after its lease expires; a restart marks only its own", async () => {
    const c = await PgJobs.open(pools[1]!, "c", { leaseS: LEASE_S });
    const b = await PgJobs.open(pools[0]!, "b", { leaseS: LEASE_S });
    try {
      // Replica A: a real process, killed with SIGKILL while its job runs.
      child = spawn(
        process.execPath,
        ["--import", "tsx", "test/postgres/replica_jobs.ts", db.url, "a", String(LEASE_S)],
        { cwd: ROOT, stdio: ["ignore", "pipe", "inherit"] },
      );
      const first = await new Promise<string>((resolve, reject) => {
        createInterface({ input: child!.stdout! }).once("line", resolve);
        child!.once("exit", (code) => reject(new Error(`replica a exited ${code}`)));
      });
      const aJob = first.trim();
      expect(await c.get(aJob, "alice")).toMatchObject({ status: "running", owner: "a" });
      const bJob = await b.start("load_model", "alice", untilAbort);
      const cJob = await c.start("load_model", "alice", untilAbort);

      child.kill("SIGKILL");
      await new Promise((r) => child!.once("exit", r));
      // Right after the kill its lease still holds: nobody marks the job.
      expect(await c.reapExpired()).not.toContain(aJob);
      expect((await c.get(aJob, "alice"))!.status).toBe("running");

      // B restarts: only B's own job from before is interrupted, not A's nor C's.
      const b2 = await PgJobs.open(pools[2]!, "b", { leaseS: LEASE_S });
      try {
        expect((await c.get(bJob.job_id, "alice"))!.status).toBe("interrupted");
        expect((await c.get(aJob, "alice"))!.status).toBe("running");
        expect((await c.get(cJob.job_id, "alice"))!.status).toBe("running");

        // Once A's lease expires, C's renewal marks it interrupted; C's own job keeps running.
        const row = await waitFor("a's job to be interrupted", async () => {
          await c.tick();
          const r = await pools[1]!.query(
            "SELECT status, lease_until_ms, updated_ms FROM jobs WHERE job_id = $1",
            [aJob],
          );
          return r.rows[0].status === "interrupted" ? r.rows[0] : undefined;
        });
        expect(Number(row.updated_ms)).toBeGreaterThanOrEqual(Number(row.lease_until_ms));
        expect((await c.get(aJob, "alice"))!.error).toMatchObject({ code: "worker_died" });
        expect((await c.get(cJob.job_id, "alice"))!.status).toBe("running");
      } finally {
        await b2.close();
      }
    } finally {
      await b.close();
      await c.close();
    }
  });
});
