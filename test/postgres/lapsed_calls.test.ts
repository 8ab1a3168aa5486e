// Issue 43 row 6, a killed replica's running call, on a real PostgreSQL: a replica process (a
// real one, killed with SIGKILL mid-call) leaves its call's calls_in_flight row; it never starts
// again under its id. Two live replicas (the gate and stores as a serving replica builds them)
// leave the row alone while the dead replica's lease holds, and once it lapsed they settle it
// at the same moment: one of them records it interrupted and charges it, once. A serving
// replica (`tpu-mcp stdio`) does the same on its own, looking twice per lease.
import { spawn, type ChildProcess } from "node:child_process";
import { createInterface } from "node:readline";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createPolicyServices, type PolicyServices } from "../../server/app/build_policies.js";
import { settleLapsed } from "../../server/app/lapsed_calls.js";
import { openSharedBackend, type SharedBackend } from "../../server/app/storage.js";
import { parseConfig } from "../../server/config/config.js";
import { scaled, slowdown } from "../helpers/calibrate.js";
import { startPostgres, type TestPostgres } from "../helpers/postgres.js";
import { connectStdio, ROOT, writeConfig } from "../helpers/server.js";
import { waitFor } from "../helpers/wait.js";

const logger = pino({ level: "silent" });
/** The call lease (storage.postgres.call_lease_s): short, past a loaded replica's heartbeats. */
const LEASE_S = 2 * slowdown();

let db: TestPostgres;
let child: ChildProcess | undefined;
const backends: SharedBackend[] = [];
const survivors: PolicyServices[] = [];

beforeAll(async () => {
  db = await startPostgres();
  const config = parseConfig(
    { storage: { postgres: { url: db.url, call_lease_s: LEASE_S } } },
    { root: ROOT },
  );
  for (const id of ["live-a:8080", "live-b:8080"]) {
    const shared = (await openSharedBackend(config, logger, { id, storage: "postgres" }))!;
    backends.push(shared);
    survivors.push(await createPolicyServices(config, logger, { shared }));
  }
});

afterAll(async () => {
  if (child && child.exitCode === null) child.kill("SIGKILL");
  for (const s of survivors) await s.close();
  for (const b of backends) await b.close();
  await db?.stop();
});

/** A replica process (replica_call.ts) whose one call of `principal` runs until it is killed. */
async function startReplicaCall(replica: string, principal: string): Promise<ChildProcess> {
  const proc = spawn(
    process.execPath,
    [
      "--import",
      "tsx",
      "test/postgres/replica_call.ts",
      db.url,
      replica,
      String(LEASE_S),
      principal,
    ],
    { cwd: ROOT, stdio: ["ignore", "pipe", "inherit"] },
  );
  child = proc;
  const first = await new Promise<string>((resolve, reject) => {
    createInterface({ input: proc.stdout! }).once("line", resolve);
    proc.once("exit", (code) => reject(new Error(`replica ${replica} exited ${code}`)));
  });
  expect(first).toBe("running");
  return proc;
}

/** Both survivors look at once: how many calls each settled. */
const bothLook = () =>
  Promise.all(
    survivors.map((s) =>
      settleLapsed(s.gate, { lapsed: () => s.calls.lapsed!(), leaseMs: LEASE_S * 1000 }, logger),
    ),
  );

describe("row 6: a call left running by a replica that died", () => {
  it("is charged by a survivor once its lease lapsed, exactly once, and not while its replica lives", async () => {
    const pool = backends[0]!.pool;
    child = await startReplicaCall("dead:8080", "zed");
    // Alive past two leases: its heartbeats keep the call its own.
    await new Promise((r) => setTimeout(r, 2 * LEASE_S * 1000));
    expect(await bothLook()).toEqual([0, 0]);
    const rows = async () =>
      Number((await pool.query("SELECT count(*) AS n FROM calls_in_flight")).rows[0].n);
    expect(await rows()).toBe(1);

    child.kill("SIGKILL");
    await new Promise((r) => child!.once("exit", r));
    // Once its lease lapsed, both survivors settle at the same moment: one gets it.
    const settled = await waitFor(
      "a survivor to settle the dead replica's call",
      async () => {
        const got = await bothLook();
        return got.some((n) => n > 0) ? got : undefined;
      },
      scaled(60_000),
    );
    expect([...settled].sort()).toEqual([0, 1]);
    expect(await rows()).toBe(0);
    const charges = (
      await pool.query("SELECT seconds, tool FROM budget_charges WHERE principal = 'zed'")
    ).rows;
    expect(charges).toHaveLength(1);
    // Charged to its last heartbeat: it ran past two leases.
    expect(charges[0].seconds).toBeGreaterThanOrEqual(LEASE_S);
    expect(charges[0].tool).toBe("run_benchmark");
    const records = (
      await pool.query(
        `SELECT record FROM audit_records WHERE (record::jsonb) ->> 'outcome' = 'interrupted'`,
      )
    ).rows.map((r) => JSON.parse(r.record));
    expect(records).toHaveLength(1);
    expect(records[0]).toMatchObject({ principal: "zed", tool: "run_benchmark" });
    expect(records[0].reason).toMatch(/from its start to the server's last heartbeat/);
    // Looked at again: nothing more to settle, nothing charged twice.
    expect(await bothLook()).toEqual([0, 0]);
    expect(
      (await pool.query("SELECT count(*) AS n FROM budget_charges WHERE principal = 'zed'")).rows[0]
        .n,
    ).toBe("1");
  });

  it("a serving replica (`tpu-mcp stdio` on the shared store) settles it on its own, once its lease lapsed", async () => {
    const pool = backends[0]!.pool;
    const dead = await startReplicaCall("gone:8080", "yan");
    dead.kill("SIGKILL");
    await new Promise((r) => dead.once("exit", r));
    const config = writeConfig({ storage: { postgres: { url: db.url, call_lease_s: LEASE_S } } });
    const conn = await connectStdio(config);
    try {
      const charges = await waitFor(
        "the serving replica to charge the dead replica's call",
        async () => {
          const rows = (
            await pool.query("SELECT seconds FROM budget_charges WHERE principal = 'yan'")
          ).rows;
          return rows.length > 0 ? rows : undefined;
        },
        scaled(60_000),
      );
      expect(charges).toHaveLength(1);
      expect(
        (await pool.query("SELECT count(*) AS n FROM calls_in_flight WHERE principal = 'yan'"))
          .rows[0].n,
      ).toBe("0");
    } finally {
      await conn.close();
    }
  });
});
