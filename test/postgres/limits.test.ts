// Rate limits and calls in flight on a real PostgreSQL, three replicas (three pools): one token
// bucket per principal whichever replica takes from it, the HTTP surface's allowances apart from
// it, and the calls a replica left behind settled by that replica alone.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PgCallsInFlight } from "../../server/app/postgres/calls.js";
import { openPool, type PgPool } from "../../server/stores/pg/pool.js";
import { PgRateLimit } from "../../server/app/postgres/rate.js";
import { migrate } from "../../server/app/postgres/schema.js";
import { startPostgres, type TestPostgres } from "../helpers/postgres.js";

let db: TestPostgres;
let replicas: PgPool[];
const NAMES = ["a", "b", "c"];

beforeAll(async () => {
  db = await startPostgres();
  replicas = NAMES.map((n) => openPool(db.url, { max: 8, application: `tpu-mcp-${n}` }));
  await migrate(replicas[0]!);
});

afterAll(async () => {
  await Promise.all((replicas ?? []).map((p) => p.end()));
  await db?.stop();
});

describe("the rate limit across replicas", () => {
  it("60 concurrent calls on 3 replicas against 30 a minute: 30 pass (plus what refilled meanwhile)", async () => {
    const rates = replicas.map((p) => new PgRateLimit(p, "principal", 30));
    const t0 = Date.now();
    const got = await Promise.all(
      Array.from({ length: 60 }, (_, i) => rates[i % 3]!.take("alice")),
    );
    // 30 a minute refills one token every 2 s: what passed can only exceed 30 by those.
    const refilled = Math.floor((Date.now() - t0) / 2000);
    const passed = got.filter((d) => d.ok).length;
    expect(passed).toBeGreaterThanOrEqual(30);
    expect(passed).toBeLessThanOrEqual(30 + refilled);
    const refused = got.find((d) => !d.ok);
    expect(refused).toMatchObject({ ok: false, retry_after_ms: expect.any(Number) });
    expect((refused as { retry_after_ms: number }).retry_after_ms).toBeGreaterThan(0);
    // Another principal has its own bucket.
    expect((await rates[1]!.take("bob")).ok).toBe(true);
  });

  it("a refund on one replica is a token on every other; the HTTP allowances are buckets of their own", async () => {
    const [a, b] = replicas.map((p) => new PgRateLimit(p, "principal", 2));
    expect((await a!.take("carol")).ok).toBe(true);
    expect((await b!.take("carol")).ok).toBe(true);
    expect((await a!.take("carol")).ok).toBe(false);
    await b!.refund("carol");
    expect((await a!.take("carol")).ok).toBe(true);
    // The same key under another scope (initialize per principal) is untouched.
    const init = new PgRateLimit(replicas[2]!, "initialize_per_principal", 2);
    expect(await init.take("carol")).toEqual({ ok: true, remaining: 1 });
  });
});

describe("calls in flight per replica", () => {
  const call = (principal: string) => ({
    principal,
    tool: "run_benchmark",
    args_digest: "d",
    args: { model: "tiny" },
    estimate: null,
  });

  it("a replica that starts again settles only what its own previous run left behind", async () => {
    const a = new PgCallsInFlight(replicas[0]!, "a", 50);
    const b = new PgCallsInFlight(replicas[1]!, "b", 50);
    const left = a.begin(call("alice"));
    await left.write();
    const running = b.begin(call("bob"));
    await running.write();
    // A's heartbeat stamps its call alive while it runs.
    await new Promise((r) => setTimeout(r, 200));
    await a.stampAlive();
    a.close(); // A is killed: its row stays
    const a2 = new PgCallsInFlight(replicas[2]!, "a");
    const found = await a2.leftBehind();
    expect(found.map((c) => c.id)).toEqual([left.id]);
    expect(found[0]!.alive_ms).toBeGreaterThan(found[0]!.started_ms);
    // B's running call is not A's to settle, and B itself does not see its live call as left.
    expect(await b.leftBehind()).toEqual([]);
    // The reconcile forgets in one transaction: rolled back, nothing is forgotten.
    await expect(
      a2.transaction(async () => {
        await a2.forget(left.id);
        throw new Error("the audit append failed");
      }),
    ).rejects.toThrow(/audit append failed/);
    expect((await a2.leftBehind()).map((c) => c.id)).toEqual([left.id]);
    await a2.transaction(() => a2.forget(left.id));
    expect(await a2.leftBehind()).toEqual([]);
    await b.end(running.id);
    const rows = await replicas[0]!.query("SELECT count(*)::int AS n FROM calls_in_flight");
    expect(rows.rows[0].n).toBe(0);
    b.close();
  });
});
