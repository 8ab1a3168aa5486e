// The server-side stores on a real PostgreSQL, written through one replica and read through
// another: benchmark reports and measured calls (estimates learn from every replica's), the
// workers' control channel (one desired state for one fleet) and stored outputs (exact tensors,
// the principal's own, one bound in bytes with the oldest evicted first, a time to live).
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import type { CallRecord } from "../../policies/estimate.js";
import { PgControlChannel } from "../../server/app/postgres/control.js";
import { openPool, type PgPool } from "../../server/stores/pg/pool.js";
import { PgReports } from "../../server/app/postgres/reports.js";
import { openPgLimits, openPgServerStores } from "../../server/app/postgres/limits.js";
import { PgOutputs } from "../../server/app/postgres/outputs.js";
import type { TensorData } from "../../runtime/types.js";
import { parseConfig } from "../../server/config/config.js";
import { ROOT } from "../helpers/server.js";
import { migrate } from "../../server/app/postgres/schema.js";
import { startPostgres, type TestPostgres } from "../helpers/postgres.js";
import { scaled } from "../helpers/calibrate.js";
import { waitFor } from "../helpers/wait.js";

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
      const t: TensorData = { dtype: "uint8", shape: [3], data: Buffer.from([1, 2, 3]) };
      const out = await sa!.outputs.put("alice", "tiny", [t]);
      expect((await sb!.outputs.get(out.id, "alice"))?.tensors).toEqual([t]);
    } finally {
      a!.close();
      b!.close();
      await sa!.close();
      await sb!.close();
    }
  });
});

describe("stored outputs across replicas", () => {
  /** `n` bytes of one uint8 tensor, filled with `fill`. */
  const blob = (n: number, fill: number): TensorData[] => [
    { dtype: "uint8", shape: [n], data: Buffer.alloc(n, fill) },
  ];
  const rows = async () =>
    (
      await replicas[0]!.query(
        `SELECT o.id, (SELECT count(*) FROM stored_output_tensors t WHERE t.output_id = o.id) AS n
         FROM stored_outputs o ORDER BY o.seq`,
      )
    ).rows as { id: string; n: string }[];
  const live = async (store: PgOutputs, ids: string[]) =>
    (await Promise.all(ids.map((id) => store.get(id, "alice")))).map((o) => o !== undefined);
  const opened = (maxBytes: number, opts: { ttlMs?: number } = {}) =>
    replicas.map((p, i) => new PgOutputs(p, { maxBytes, replica: ["a", "b"][i]!, ...opts }));

  beforeEach(async () => {
    await replicas[0]!.query("TRUNCATE stored_outputs CASCADE");
  });

  it("tensors put through A are read through B exactly (dtype, shape, bytes, order), by their principal only", async () => {
    const [a, b] = opened(1 << 20);
    // A view into a larger buffer: only its own bytes are the tensor's.
    const backing = Buffer.from(Array.from({ length: 64 }, (_, i) => (i * 37) % 256));
    const f32 = new Float32Array([1.5, -0, Number.NaN, 3.4028234663852886e38, -1e-45, 7]);
    const tensors: TensorData[] = [
      { dtype: "float32", shape: [2, 3], data: Buffer.from(f32.buffer) },
      { dtype: "int64", shape: [2], data: Buffer.from(new BigInt64Array([-1n, 2n ** 62n]).buffer) },
      { dtype: "bfloat16", shape: [], data: backing.subarray(10, 12) },
      { dtype: "bool", shape: [0, 4], data: Buffer.alloc(0) },
      { dtype: "uint8", shape: [4, 1, 2], data: backing.subarray(40, 48) },
    ];
    const put = await a!.put("alice", "tiny", tensors);
    expect(put.bytes).toBe(24 + 16 + 2 + 0 + 8);
    const got = await b!.get(put.id, "alice");
    expect(got).toMatchObject({ id: put.id, principal: "alice", model: "tiny", bytes: put.bytes });
    expect(got!.tensors.map((t) => ({ dtype: t.dtype, shape: t.shape }))).toEqual(
      tensors.map((t) => ({ dtype: t.dtype, shape: t.shape })),
    );
    got!.tensors.forEach((t, i) =>
      expect(t.data.equals(tensors[i]!.data), `tensor ${i}`).toBe(true),
    );
    expect(await b!.list("alice")).toEqual([
      {
        id: put.id,
        principal: "alice",
        model: "tiny",
        bytes: put.bytes,
        created_at: put.created_at,
        tensors: tensors.map((t) => ({ dtype: t.dtype, shape: t.shape })),
      },
    ]);
    // Another principal finds nothing, as with an id that never existed.
    expect(await b!.get(put.id, "bob")).toBeUndefined();
    expect(await a!.get(put.id, "bob")).toBeUndefined();
    expect(await b!.list("bob")).toEqual([]);
    expect(await b!.bytes()).toBe(put.bytes);
  });

  it("one bound in bytes across replicas: a put through B evicts the oldest, A's included, until it fits", async () => {
    const [a, b] = opened(300);
    const o1 = await a!.put("alice", "m", blob(100, 1));
    const o2 = await b!.put("alice", "m", blob(100, 2));
    const o3 = await a!.put("alice", "m", blob(100, 3));
    expect(await b!.bytes()).toBe(300);
    expect(await live(b!, [o1.id, o2.id, o3.id])).toEqual([true, true, true]);
    // 150 more: o1 and o2 (the oldest) make room, o3 stays.
    const o4 = await b!.put("alice", "m", blob(150, 4));
    expect(await live(a!, [o1.id, o2.id, o3.id, o4.id])).toEqual([false, false, true, true]);
    expect(await a!.bytes()).toBe(250);
    // Their tensors went with them.
    expect(await rows()).toEqual([
      { id: o3.id, n: "1" },
      { id: o4.id, n: "1" },
    ]);
    // Larger than the whole bound: named, not kept, and nothing evicted for it.
    const huge = await a!.put("alice", "m", blob(301, 5));
    expect(await b!.get(huge.id, "alice")).toBeUndefined();
    expect(await live(b!, [o3.id, o4.id])).toEqual([true, true]);
  });

  it("24 puts raced from two replicas keep the bound: three outputs stay", async () => {
    const [a, b] = opened(300);
    const puts = await Promise.all(
      Array.from({ length: 24 }, (_, i) => [a, b][i % 2]!.put("alice", "m", blob(100, i))),
    );
    expect(puts.every((p) => p.bytes === 100)).toBe(true);
    const kept = await rows();
    expect(kept).toHaveLength(3);
    expect(await a!.bytes()).toBe(300);
  });

  it("two replicas' puts that need the same room are serialized: the second counts the first", async () => {
    const [a, b] = opened(300);
    const o1 = await a!.put("alice", "m", blob(100, 1));
    const o2 = await b!.put("alice", "m", blob(100, 2));
    // An open transaction holds o1's row: both puts below must delete it to fit, so both wait
    // at their eviction, each having written its own output. Released, they go one at a time:
    // the second sees the first committed and evicts o2 for it. (Each counting only the rows
    // committed before both started would keep o2, A's and B's: 400 bytes.)
    const holder = await replicas[0]!.connect();
    try {
      await holder.query("BEGIN");
      await holder.query("SELECT 1 FROM stored_outputs WHERE id = $1 FOR UPDATE", [o1.id]);
      const racing = [a!.put("alice", "m", blob(150, 3)), b!.put("alice", "m", blob(150, 4))];
      await waitFor(
        "both puts waiting",
        async () => {
          const r = await holder.query(
            `SELECT count(*) AS n FROM pg_stat_activity
             WHERE wait_event_type = 'Lock' AND application_name IN ('tpu-mcp-a', 'tpu-mcp-b')`,
          );
          return Number(r.rows[0].n) === 2 ? true : undefined;
        },
        scaled(20_000),
        20,
      );
      await holder.query("COMMIT");
      const [p3, p4] = await Promise.all(racing);
      expect(await a!.bytes()).toBe(300);
      expect(await live(b!, [o1.id, o2.id, p3!.id, p4!.id])).toEqual([false, false, true, true]);
    } finally {
      await holder.query("ROLLBACK").catch(() => {});
      holder.release();
    }
  });

  it("an expired output is read by no replica and pruned by the next put, without counting against the bound", async () => {
    const [expiring] = opened(300, { ttlMs: 0 });
    const [a, b] = opened(300);
    const k1 = await a!.put("alice", "m", blob(100, 1));
    const old = await expiring!.put("alice", "m", blob(100, 9));
    // Expired on the database's clock and still in the table: no replica reads, lists or counts it.
    expect((await rows()).map((r) => r.id)).toEqual([k1.id, old.id]);
    expect(await b!.get(old.id, "alice")).toBeUndefined();
    expect((await b!.list("alice")).map((o) => o.id)).toEqual([k1.id]);
    expect(await b!.bytes()).toBe(100);
    // The next put, through another replica, deletes it with its tensors.
    const k2 = await b!.put("alice", "m", blob(100, 2));
    expect(await rows()).toEqual([
      { id: k1.id, n: "1" },
      { id: k2.id, n: "1" },
    ]);
    // So a third fills the bound exactly and none of the live ones is evicted.
    const k3 = await a!.put("alice", "m", blob(100, 3));
    expect(await live(b!, [k1.id, k2.id, k3.id])).toEqual([true, true, true]);
  });
});
