// The server's stores built as a replica builds them (server/app/storage.ts openServerStores on a
// shared backend from openSharedBackend), for two replicas on one database: a job started through
// A is read and cancelled through B and A aborts it; a report put through A is listed through B;
// a worker's drain asked through A is applied by B's poller, which publishes what it did for A to
// read, and `tpu-mcp workers drain|list|undrain` act on that shared channel; a restart of A marks
// only A's previous jobs interrupted; close() leaves the pool open.
import { createHash } from "node:crypto";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  openServerStores,
  openSharedBackend,
  type SharedBackend,
} from "../../server/app/storage.js";
import { parseConfig, type ServerConfig } from "../../server/config/config.js";
import { watchControl } from "../../server/control/channel.js";
import { drainHandler } from "../../server/control/drain.js";
import { runWorkersCommand } from "../../server/cli/workers.js";
import type { Runtime, WorkerStatus } from "../../runtime/types.js";
import { readCatalog } from "../../runtime/catalog.js";
import { estimateFor, type EstimatedWork } from "../../tools/support/estimate.js";
import type { ToolContext } from "../../tools/types.js";
import { SqliteReports } from "../../tools/stores/reports.js";
import type { Reports } from "../../tools/stores/reports.js";
import { scaled, slowdown } from "../helpers/calibrate.js";
import { startPostgres, type TestPostgres } from "../helpers/postgres.js";
import { ROOT } from "../helpers/server.js";
import { waitFor as waitUntil } from "../helpers/wait.js";

/** Until `fn` answers a value, within this file's deadline. */
const waitFor = <T>(what: string, fn: () => T | undefined | Promise<T | undefined>) =>
  waitUntil(what, fn, scaled(30_000));

const logger = pino({ level: "silent" });
const LEASE_S = 3 * slowdown();

let db: TestPostgres;
let config: ServerConfig;
let a: SharedBackend;
let b: SharedBackend;

const untilAbort = (signal: AbortSignal) =>
  new Promise<Record<string, unknown>>((_, reject) =>
    signal.addEventListener("abort", () => reject(signal.reason)),
  );

/** A worker as a pool reports it (what the poller publishes and `workers list` prints). */
const worker = (name: string): WorkerStatus =>
  ({
    name,
    device: "cpu",
    state: "ready",
    draining: false,
    in_flight: 0,
    restarts: 0,
    models: [],
    lost_models: [],
  }) as unknown as WorkerStatus;

beforeAll(async () => {
  db = await startPostgres();
  config = parseConfig(
    { storage: { postgres: { url: db.url, job_lease_s: LEASE_S } } },
    { root: ROOT },
  );
  // Two replicas: each its own pool, migrated and keyed as a serving replica opens it.
  a = (await openSharedBackend(config, logger, { id: "host-a:8080", storage: "postgres" }))!;
  b = (await openSharedBackend(config, logger, { id: "host-b:8080", storage: "postgres" }))!;
});

afterAll(async () => {
  await a?.close();
  await b?.close();
  await db?.stop();
});

describe("the server's stores on a shared backend", () => {
  it("a job started through A is read and cancelled through B; A aborts it", async () => {
    const sa = await openServerStores(config, logger, a);
    const sb = await openServerStores(config, logger, b);
    try {
      const job = await sa.jobs.start("run_benchmark", "alice", untilAbort);
      expect(await sb.jobs.get(job.job_id, "alice")).toMatchObject({
        status: "running",
        owner: "host-a:8080",
      });
      // Another principal's job is a missing one, on every replica.
      expect(await sb.jobs.get(job.job_id, "bob")).toBeUndefined();
      expect(await sb.jobs.cancel(job.job_id, "bob")).toBeUndefined();
      expect((await sb.jobs.listAll()).map((j) => j.job_id)).toContain(job.job_id);
      // B's cancel is a flag on the row: A turns it into the job's abort at its next renewal.
      await sb.jobs.cancel(job.job_id, "alice");
      await sa.jobs.settled(job.job_id);
      expect(await sb.jobs.get(job.job_id, "alice")).toMatchObject({
        status: "cancelled",
        error: { code: "cancelled" },
      });
      expect(sa.jobs.running()).toBe(0);
    } finally {
      await sa.close();
      await sb.close();
    }
  });

  it("a report put through A is listed and read through B", async () => {
    const sa = await openServerStores(config, logger, a);
    const sb = await openServerStores(config, logger, b);
    try {
      const stored = await sa.reports.put("alice", "tiny", "cpu", {
        work: "forward",
        configs: [{ batch: 2, seq_len: 8, latency_ms: { mean: 4.5 } }],
      });
      expect((await sb.reports.list()).map((r) => r.id)).toContain(stored.id);
      expect(await sb.reports.get(stored.id)).toMatchObject({
        principal: "alice",
        report: { report_id: stored.id },
      });
      expect(await sb.reports.history("tiny", "cpu")).toEqual([
        { batch: 2, seq_len: 8, latency_ms: 4.5 },
      ]);
    } finally {
      await sa.close();
      await sb.close();
    }
  });

  it("a drain asked through A is applied by B's poller, and what B did is read through A", async () => {
    const sa = await openServerStores(config, logger, a);
    const sb = await openServerStores(config, logger, b);
    // B's worker pool: two workers the poller drains and undrains as the shared state says.
    const workers = ["w1", "w2"].map(worker);
    const pool = {
      single: false,
      workers: () => workers.map((w) => ({ ...w })),
      drain: (n: string) => (workers.find((w) => w.name === n)!.draining = true),
      undrain: (n: string) => (workers.find((w) => w.name === n)!.draining = false),
    } as unknown as Runtime;
    const poller = watchControl(sb.channel, [drainHandler(pool, logger)!], logger, 100);
    try {
      await sa.channel.setDrained("w1", "ops");
      expect(await sb.channel.drained()).toEqual(new Set(["w1"]));
      const seen = await waitFor("B to publish w1 drained", async () => {
        const o = (await sa.channel.observed()).find((x) => x.w.name === "w1");
        return o?.w.draining ? o : undefined;
      });
      expect(seen.w.in_flight).toBe(0);
      expect(workers.map((w) => w.draining)).toEqual([true, false]);
      await sa.channel.clearDrained("w1");
      await waitFor("B to undrain w1", async () => (workers[0]!.draining ? undefined : true));
      const at = await sa.channel.setFleetTarget(3, "ops");
      expect(await sb.channel.fleetTarget()).toEqual({ count: 3, at });
    } finally {
      poller.close();
      await sa.close();
      await sb.close();
    }
  });

  it("tpu-mcp workers drain|list|undrain act on the shared channel that a replica's poller applies", async () => {
    const sb = await openServerStores(config, logger, b);
    const workers = ["w1"].map(worker);
    const pool = {
      single: false,
      workers: () => workers.map((w) => ({ ...w })),
      drain: (n: string) => (workers.find((w) => w.name === n)!.draining = true),
      undrain: (n: string) => (workers.find((w) => w.name === n)!.draining = false),
    } as unknown as Runtime;
    const poller = watchControl(sb.channel, [drainHandler(pool, logger)!], logger, 100);
    // The command's config: the deployment's database, and an admin token.
    const token = "ops-admin-token";
    const cliConfig = parseConfig(
      {
        storage: { postgres: { url: db.url } },
        policy: {
          tokens: [
            {
              id: "ops",
              token_sha256: createHash("sha256").update(token).digest("hex"),
              scopes: ["admin"],
            },
          ],
        },
      },
      { root: ROOT },
    );
    const out: string[] = [];
    const err: string[] = [];
    const io = {
      out: (x: string) => out.push(x),
      err: (x: string) => err.push(x),
      json: false,
      logger,
      token,
      waitMs: scaled(30_000),
    };
    try {
      expect(await runWorkersCommand(cliConfig, ["drain", "w1"], io), err.join("\n")).toBe(0);
      expect(out.at(-1)).toMatch(/w1: drained, no calls in flight/);
      expect(workers[0]!.draining).toBe(true);
      expect(await runWorkersCommand(cliConfig, ["list"], io)).toBe(0);
      expect(out.at(-1)).toMatch(/^w1 .*\(drained\)/);
      expect(await runWorkersCommand(cliConfig, ["undrain", "w1"], io)).toBe(0);
      await waitFor("B to undrain w1", async () => (workers[0]!.draining ? undefined : true));
      expect(err).toEqual([]);
    } finally {
      poller.close();
      await sb.close();
    }
  });

  it("an estimate on B learns from a call measured on A (read from the store before it estimates)", async () => {
    const sa = await openServerStores(config, logger, a);
    const sb = await openServerStores(config, logger, b);
    const catalog = readCatalog(`${ROOT}/runtime/catalog.builtin.json`);
    // What an estimate reads besides the store: the catalog, the model's size, the device.
    const ctx = (reports: Reports, onWork?: (w: EstimatedWork) => void) =>
      ({
        env: { catalog },
        reports,
        facts: { get: async () => ({ parameters: 1_000_000, weight_bytes: 4_000_000 }) },
        runtime: {
          hello: { device: { kind: "cpu" } },
          loadedModels: () => [],
          call: async () => ({ result: { device: { kind: "cpu" }, loaded: [] } }),
        },
        signal: new AbortController().signal,
        onWork,
      }) as unknown as ToolContext;
    const args = { model: "tiny-gpt2", texts: ["hello there"], max_new_tokens: 4 };
    const empty = new SqliteReports(":memory:");
    try {
      let work: EstimatedWork | undefined;
      const modelled = await estimateFor(
        { estimate: "inference" },
        args,
        ctx(empty, (w) => (work = w)),
      );
      expect(work).toBeDefined();
      // A measures this very work at 40 s (its calls are written once a second; close writes them).
      await sa.reports.recordCall({ ...work!, seconds: 40, at: Date.now() });
      // A plain check measured on A warms A's workers, not B's: B's first one is still cold.
      const check = { model: "tiny-gpt2", plain: true, batch: 1, seq_len: 8 };
      let checked: EstimatedWork | undefined;
      await estimateFor(
        { estimate: "check" },
        check,
        ctx(sa.reports, (w) => (checked = w)),
      );
      await sa.reports.recordCall({ ...checked!, seconds: 0.5, at: Date.now() });
      expect(await estimateFor({ estimate: "check" }, check, ctx(sa.reports))).not.toHaveProperty(
        "cold_start",
      );
      await sa.close();
      expect(await estimateFor({ estimate: "check" }, check, ctx(sb.reports))).toMatchObject({
        cold_start: true,
      });
      const learned = await estimateFor({ estimate: "inference" }, args, ctx(sb.reports));
      expect(modelled!.device_seconds).toBeLessThan(40);
      expect(learned!.device_seconds).toBe(40);
    } finally {
      empty.close();
      await sb.close();
    }
  });

  it("A's restart marks only A's previous jobs interrupted, and close() leaves the pool open", async () => {
    const sa = await openServerStores(config, logger, a);
    const sb = await openServerStores(config, logger, b);
    let sa2: Awaited<ReturnType<typeof openServerStores>> | undefined;
    try {
      const aJob = await sa.jobs.start("load_model", "alice", untilAbort);
      const bJob = await sb.jobs.start("load_model", "alice", untilAbort);
      // A's process is gone without closing (its renewals stop); a new run of A opens its stores.
      (sa.jobs as unknown as { timer: NodeJS.Timeout }).timer.unref();
      clearInterval((sa.jobs as unknown as { timer: NodeJS.Timeout }).timer);
      sa2 = await openServerStores(config, logger, a);
      const fresh = await sa2.jobs.start("load_model", "alice", untilAbort);
      expect(await sb.jobs.get(aJob.job_id, "alice")).toMatchObject({
        status: "interrupted",
        error: { code: "worker_died" },
      });
      expect((await sb.jobs.get(bJob.job_id, "alice"))!.status).toBe("running");
      expect((await sb.jobs.get(fresh.job_id, "alice"))!.status).toBe("running");
    } finally {
      await sa2?.close();
      await sa.close();
      await sb.close();
    }
    expect((await a.pool.query("SELECT 1 AS one")).rows[0].one).toBe(1);
  });
});
