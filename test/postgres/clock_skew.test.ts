// Issue 43 row 7, clock skew between replicas, on a real PostgreSQL: a replica whose clock is
// off the database's by more than storage.postgres.max_clock_skew_ms refuses to start
// (openSharedBackend, as `tpu-mcp http` opens it) and says how much, which way and to sync with
// NTP; one within the bound starts, and a request state it seals expires by the database's
// clock, not its own, when another replica opens it. A replica's clock is faked as everywhere
// else: the Clock it is given (policies/clock.ts).
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import type { Clock } from "../../policies/clock.js";
import type { GateContext } from "../../policies/gate/context.js";
import { RequestStateError, RequestStateSealer } from "../../policies/request_state.js";
import { createPolicyServices } from "../../server/app/build_policies.js";
import { ClockSkewError } from "../../server/app/postgres/db_clock.js";
import { openPool } from "../../server/stores/pg/pool.js";
import { openSharedBackend, type SharedBackend } from "../../server/app/storage.js";
import { parseConfig, type ServerConfig } from "../../server/config/config.js";
import { scaled } from "../helpers/calibrate.js";
import { startPostgres, type TestPostgres } from "../helpers/postgres.js";
import { ROOT } from "../helpers/server.js";

const logger = pino({ level: "silent" });
const HOUR = 3_600_000;
let db: TestPostgres;
const opened: SharedBackend[] = [];

/** The config every replica reads; `max` is its skew bound. */
const configOf = (max?: number): ServerConfig =>
  parseConfig(
    { storage: { postgres: { url: db.url, ...(max ? { max_clock_skew_ms: max } : {}) } } },
    { root: ROOT },
  );

const skewed =
  (ms: number): Clock =>
  () =>
    Date.now() + ms;

async function open(name: string, clock: Clock, max?: number): Promise<SharedBackend> {
  const b = (await openSharedBackend(
    configOf(max),
    logger,
    { id: name, storage: "postgres" },
    clock,
  ))!;
  opened.push(b);
  return b;
}

beforeAll(async () => {
  db = await startPostgres();
});

afterAll(async () => {
  for (const b of opened) await b.close();
  await db?.stop();
});

describe("row 7: a replica's clock off the database's", () => {
  it("an hour ahead: the replica refuses to start and says how much, which way, and to sync with NTP", async () => {
    const refused = await open("ahead:8080", skewed(HOUR)).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(refused).toBeInstanceOf(ClockSkewError);
    const msg = (refused as Error).message;
    // The skew is measured against a query's midpoint: under load it reads a little either side.
    expect(msg).toMatch(/this machine's clock is 3(599|600)\.\d s ahead of the database's/);
    expect(msg).toMatch(/more than storage\.postgres\.max_clock_skew_ms \(5000 ms\)/);
    expect(msg).toMatch(/NTP/);
    // It refused before writing anything: the database has no schema yet (the first start).
    const pool = openPool(db.url, { max: 1 });
    try {
      const t = await pool.query("SELECT to_regclass('tpu_mcp_schema') AS t");
      expect(t.rows[0].t).toBeNull();
    } finally {
      await pool.end();
    }
  });

  it("behind by more than the bound: refused too; within the bound it starts", async () => {
    const refused = await open("behind:8080", skewed(-8_000)).catch((e: Error) => e);
    expect(refused).toBeInstanceOf(ClockSkewError);
    expect((refused as Error).message).toMatch(/8\.\d s behind the database's/);
    // A bound of the deployment's own (storage.postgres.max_clock_skew_ms) lets it start.
    const allowed = await open("behind-ok:8080", skewed(-8_000), 20_000);
    expect(Math.abs(allowed.clock!() - Date.now())).toBeLessThan(1_000);
  });

  it("a request state sealed on a replica whose clock runs ahead expires by the database's clock on another", async () => {
    // Ahead by 5 minutes, within this deployment's 10-minute bound: it starts.
    const ahead = await open("ahead-ok:8080", skewed(5 * 60_000), 600_000);
    const right = await open("right:8080", Date.now, 600_000);
    const key = Buffer.alloc(32, 7);
    const sealA = new RequestStateSealer(key, ahead.clock);
    const openB = new RequestStateSealer(key, right.clock);
    const ttlMs = scaled(1_500);
    const state = sealA.seal({ p: "alice", t: "run_benchmark", d: "digest", a: "apr_1" }, ttlMs);
    // Its expiry is the database's now + ttl, not the skewed clock's (5 minutes later).
    const payload = openB.open(state);
    expect(Math.abs(payload.e - (Date.now() + ttlMs))).toBeLessThan(1_000);
    await new Promise((r) => setTimeout(r, ttlMs + scaled(500)));
    expect(() => openB.open(state)).toThrow(RequestStateError);
    expect(() => openB.open(state)).toThrow("expired");
  });

  it("the built policies (build_policies.ts) seal request states on the database's clock, not this machine's", async () => {
    // This process's own clock (Date.now, what systemClock reads) 5 minutes ahead, within a
    // 10-minute bound: the replica starts, and only the database clock it is handed is right.
    const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-clock-policies-"));
    const realNow = Date.now.bind(Date);
    const ahead = vi.spyOn(Date, "now").mockImplementation(() => realNow() + 5 * 60_000);
    try {
      const config = parseConfig(
        {
          data_dir: join(dir, "data"),
          storage: { postgres: { url: db.url, max_clock_skew_ms: 600_000 } },
        },
        { root: ROOT },
      );
      const shared = (await openSharedBackend(config, logger, {
        id: "policies:8080",
        storage: "postgres",
      }))!;
      opened.push(shared);
      const services = await createPolicyServices(config, logger, { shared });
      try {
        // The gate's own sealer, as the in-band approval flow uses it (input_required.ts).
        const sealer = (services.gate as unknown as { ctx: GateContext }).ctx.deps.requestStates!;
        const ttlMs = 60_000;
        const state = sealer.seal({ p: "alice", t: "run_inference", d: "d", a: "apr_1" }, ttlMs);
        const e = JSON.parse(Buffer.from(state.split(".")[1]!, "base64url").toString("utf8")).e;
        // The database's now + ttl; on this machine's clock it would be 5 minutes later.
        expect(Math.abs(e - (realNow() + ttlMs))).toBeLessThan(scaled(2_000));
      } finally {
        await services.close();
      }
    } finally {
      ahead.mockRestore();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
