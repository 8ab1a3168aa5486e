// The server-side stores on a real PostgreSQL, written through one replica and read through
// another: benchmark reports and measured calls (estimates learn from every replica's) and the
// workers' control channel (one desired state for one fleet).
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { CallRecord } from "../../policies/estimate.js";
import { PgControlChannel } from "../../server/app/postgres/control.js";
import { openPool, type PgPool } from "../../server/app/postgres/pool.js";
import { PgReports } from "../../server/app/postgres/reports.js";
import { openPgLimits, openPgServerStores } from "../../server/app/postgres/limits.js";
import { parseConfig } from "../../server/config/config.js";
import { ROOT } from "../helpers/server.js";
import { migrate } from "../../server/app/postgres/schema.js";
import { startPostgres, type TestPostgres } from "../helpers/postgres.js";

let db: TestPostgres;
let replicas: PgPool[];

beforeAll(async () => {
  db = await startPostgres();
  replicas = ["a", "b"].map((n) => openPool(db.url, { max: 4, application: `tpu-mcp-${n}` }));
  await migrate(replicas[0]!);
});

afterAll(async () => {
  await Promise.all((replicas ?? []).map((p) => p.end()));
  await db?.stop();
});

describe("reports across replicas", () => {
  it("a report stored through A is read, listed and learned from through B", async () => {
    const a = new PgReports(replicas[0]!);
    const b = new PgReports(replicas[1]!, 0);
    const stored = await a.put("alice", "tiny", "cpu", {
      work: "forward",
      configs: [{ batch: 4, seq_len: 16, latency_ms: { mean: 12.5 } }, { error: "oom" }],
    });
    expect(stored.report.report_id).toBe(stored.id);
    expect(await b.get(stored.id)).toMatchObject({ principal: "alice", model: "tiny" });
    expect((await b.list()).map((r) => r.id)).toEqual([stored.id]);
    expect(await b.history("tiny", "cpu")).toEqual([{ batch: 4, seq_len: 16, latency_ms: 12.5 }]);
  });

  it("measured calls recorded through A are in B's estimates once written", async () => {
    const a = new PgReports(replicas[0]!);
    const b = new PgReports(replicas[1]!, 0);
    const call = (seconds: number): CallRecord => ({
      kind: "inference",
      model: "tiny",
      device: "cpu",
      work: { batch: 1, seq_len: 8 },
      seconds,
      at: Date.now(),
      estimate_s: 0.5,
    });
    for (const s of [1, 2, 3, 4]) await a.recordCall(call(s));
    // A's own list has them at once, newest first, three of one work kept.
    expect((await a.calls("tiny", "cpu")).map((c) => c.seconds)).toEqual([4, 3, 2]);
    // B has read the model's calls before A wrote them: none yet.
    expect(await b.calls("tiny", "cpu")).toEqual([]);
    await a.flushCalls();
    expect((await b.calls("tiny", "cpu")).map((c) => c.seconds)).toEqual([4, 3, 2]);
    await a.close();
  });
});

describe("the control channel across replicas", () => {
  it("desired state written through A is B's; what B observes A reads", async () => {
    const a = new PgControlChannel(replicas[0]!);
    const b = new PgControlChannel(replicas[1]!);
    await a.setDrained("w1", "ops");
    expect(await b.drained()).toEqual(new Set(["w1"]));
    await b.clearDrained("w1");
    expect(await a.drained()).toEqual(new Set());
    const at = await a.setFleetTarget(3, "ops");
    expect(await b.fleetTarget()).toEqual({ count: 3, at });
    await b.publishFleet(3, { actors: 3 } as never, null);
    expect(await a.fleetObserved()).toMatchObject({
      target: 3,
      status: { actors: 3 },
      error: null,
    });
    const req = await a.requestReload("ops");
    expect(await b.reloadRequest()).toEqual({ by: "ops", at: req });
    await b.writeReloadResult(req, { ok: true });
    expect(await a.reloadResult()).toEqual({
      request_at: req,
      result: JSON.stringify({ ok: true }),
    });
    await b.publishWorkers([{ name: "w1", state: "ready" } as never]);
    expect((await a.observed()).map((o) => o.w.name)).toEqual(["w1"]);
  });
});

describe("one replica's stores from its pool and the config", () => {
  it("openPgLimits and openPgServerStores give each replica the same shared counters", async () => {
    const config = parseConfig(
      { policy: { limits: { rate_limit: { per_principal_per_minute: 2 } } } },
      { root: ROOT },
    );
    const [a, b] = await Promise.all(
      replicas.map((p, i) => openPgLimits(p, config, { replica: ["a", "b"][i]! })),
    );
    const [sa, sb] = replicas.map((p, i) =>
      openPgServerStores(p, config, { replica: ["a", "b"][i]! }),
    );
    try {
      expect((await a!.rateLimiter.take("alice")).ok).toBe(true);
      expect((await b!.rateLimiter.take("alice")).ok).toBe(true);
      expect((await a!.rateLimiter.take("alice")).ok).toBe(false);
      expect((await sb!.httpRates.initPerPrincipal.take("alice")).ok).toBe(true);
      const held = await a!.budget.admit([{ key: "alice", need: 5 }]);
      expect(held.ok).toBe(true);
      expect((await b!.budget.standing("alice")).reserved_s).toBe(5);
      const job = await sa!.jobs.start("load_model", "alice", async () => ({ loaded: true }));
      await sa!.jobs.settled(job.job_id);
      expect(await sb!.jobs.get(job.job_id, "alice")).toMatchObject({
        status: "succeeded",
        result: { loaded: true },
      });
    } finally {
      a!.close();
      b!.close();
      await sa!.close();
      await sb!.close();
    }
  });
});
