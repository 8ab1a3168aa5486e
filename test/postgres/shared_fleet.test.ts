// The shared Ray fleet's store side on a real PostgreSQL (server/control/shared_fleet.ts): one
// replica at a time holds the fleet driver's lease and runs the driver; the others follow the
// actors it writes into their pools; a scale written to the shared control channel reaches the
// leader; a killed leader's lease runs out and another replica takes the driver over. The
// replicas are the real fleet code (attachRayFleet, RayFleet, FleetMembers, the store, LISTEN)
// over a recording pool, with a scripted driver in place of Ray (test/helpers/scripted_fleet_driver.mjs);
// the Ray suite runs the same with a real cluster and real actors.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PgFleetStore } from "../../server/app/postgres/fleet.js";
import { PgControlChannel } from "../../server/app/postgres/control.js";
import { openPool, type PgPool } from "../../server/stores/pg/pool.js";
import { migrate } from "../../server/app/postgres/schema.js";
import { scaled, slowdown } from "../helpers/calibrate.js";
import { startPostgres, type TestPostgres } from "../helpers/postgres.js";
import { ROOT } from "../helpers/server.js";
import { waitFor as waitUntil } from "../helpers/wait.js";
import { startFleetReplica, type FleetReplica } from "./fleet_replica.js";

const waitFor = <T>(what: string, fn: () => T | undefined | Promise<T | undefined>) =>
  waitUntil(what, fn, scaled(60_000));

const LEASE_S = 3 * slowdown();
let db: TestPostgres;
let pool: PgPool;
let dir: string;
let a: ChildProcess | undefined;
let b: FleetReplica | undefined;
/** Replica A's last report: whether it leads and the members its pool routes to. */
let aSays: { leads: boolean; serving: Record<string, string> } | undefined;

beforeAll(async () => {
  db = await startPostgres();
  pool = openPool(db.url, { max: 4, application: "tpu-mcp-test" });
  await migrate(pool);
  dir = mkdtempSync(join(tmpdir(), "tpu-mcp-shared-fleet-"));
});

afterAll(async () => {
  if (a && a.exitCode === null && a.signalCode === null) a.kill("SIGKILL");
  await b?.close();
  await pool?.end();
  await db?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const lease = async () =>
  (await pool.query("SELECT holder, epoch FROM fleet_lease WHERE id = 1")).rows[0] as {
    holder: string | null;
    epoch: string;
  };

describe("one Ray fleet shared by replicas on Postgres", () => {
  it("one replica leads and runs the driver; another follows its actors into its pool", async () => {
    // What a previous run of replica b recorded as held: its new run starts holding nothing.
    await pool.query(
      "INSERT INTO fleet_holders (name, replica, alive_ms) VALUES ('ray-7', 'b', 0), ('ray-0', 'b', 0)",
    );
    a = spawn(
      process.execPath,
      ["--import", "tsx", "test/postgres/fleet_replica.ts", db.url, "a", String(LEASE_S), dir],
      { cwd: ROOT, stdio: ["ignore", "pipe", "inherit"] },
    );
    createInterface({ input: a.stdout! }).on("line", (l) => {
      aSays = JSON.parse(l) as typeof aSays;
    });
    const first = await waitFor("A leading with two actors", () =>
      aSays?.leads && Object.keys(aSays.serving).length === 2 ? aSays.serving : undefined,
    );
    b = startFleetReplica(db.url, "b", LEASE_S, dir);
    // The same actors, at the same addresses, are B's members too.
    await waitFor("B's pool to hold A's actors", () =>
      JSON.stringify(b!.pool.serving()) === JSON.stringify(first) ? true : undefined,
    );
    expect(b.fleet.leads()).toBe(false);
    expect(aSays!.leads).toBe(true);
    expect((await lease()).holder).toBe("a");
    const s = b.fleet.summary("127.0.0.1:6379");
    expect(s).toMatchObject({ leader: "a", observed: 2, mode: "per-chip", capacity: 4 });
    expect(s.actors.map((x) => x.address)).toEqual(Object.values(first));
    expect(b.fleet.owns("ray-0")).toBe(true);
  });

  it("a scale asked of a follower is refused with the leader's name", async () => {
    await expect(b!.fleet.scale(1)).rejects.toMatchObject({
      code: "not_leader",
      message: expect.stringMatching(/replica a does/),
    });
  });

  it("a scale written to the shared channel reaches the leader; the actor is stopped once the follower drained it too", async () => {
    // B's drain of ray-1 waits (as for its calls in flight there) until the test lets it end.
    let release!: () => void;
    b!.pool.holdRemovals = new Promise<void>((r) => (release = r));
    await new PgControlChannel(pool).setFleetTarget(1, "test");
    await waitFor("B draining ray-1", () =>
      b!.pool.log.includes("removing ray-1") ? true : undefined,
    );
    await waitFor("A's pool down to ray-0", () =>
      aSays && Object.keys(aSays.serving).join() === "ray-0" ? true : undefined,
    );
    // A's own pool drained it; two renewals of A's lease later its driver still has not removed
    // the actor: it waits for B.
    const until = async () =>
      String((await pool.query("SELECT until_ms FROM fleet_lease WHERE id = 1")).rows[0].until_ms);
    let last = await until();
    let renewals = 0;
    await waitFor("two renewals of A's lease", async () => {
      const now = await until();
      if (now !== last) [last, renewals] = [now, renewals + 1];
      return renewals >= 2 ? true : undefined;
    });
    const draining = await pool.query("SELECT state FROM fleet_actors WHERE name = 'ray-1'");
    expect(draining.rows).toEqual([{ state: "draining" }]);
    release();
    b!.pool.holdRemovals = null;
    await waitFor("ray-1's row gone", async () =>
      (await pool.query("SELECT 1 FROM fleet_actors WHERE name = 'ray-1'")).rowCount === 0
        ? true
        : undefined,
    );
    expect(Object.keys(b!.pool.serving())).toEqual(["ray-0"]);
    expect(b!.pool.log).toContain("remove ray-1");
    expect(
      (await pool.query("SELECT name, replica FROM fleet_holders ORDER BY replica")).rows,
    ).toEqual([
      { name: "ray-0", replica: "a" },
      { name: "ray-0", replica: "b" },
    ]);
    // The follower shows the target the leader applied.
    await waitFor("B showing the new target", () =>
      b!.fleet.summary("x").target === 1 ? true : undefined,
    );
  });

  it("the leader killed: another replica takes the lease once it ran out and places the fleet again", async () => {
    const before = await lease();
    const old = b!.pool.serving()["ray-0"];
    a!.kill("SIGKILL");
    await new Promise((r) => a!.once("exit", r));
    // Still A's term: its lease has not run out yet.
    expect(b!.fleet.leads()).toBe(false);
    await waitFor("B leading", () => (b!.fleet.leads() ? true : undefined));
    const after = await lease();
    expect(after.holder).toBe("b");
    expect(Number(after.epoch)).toBe(Number(before.epoch) + 1);
    // B's own driver placed the actor again: a new endpoint replaced the old member.
    await waitFor("ray-0 replaced at a new address", () => {
      const now = b!.pool.serving()["ray-0"];
      return now && now !== old ? now : undefined;
    });
    const log = b!.pool.log.join("\n");
    expect(log).toMatch(/drain ray-0[\s\S]*replace ray-0/);
    // The recorded target (1) is applied to the new term's driver too (it started with 2).
    await waitFor("the new term scaled to the recorded target", async () =>
      JSON.stringify(Object.keys(b!.pool.serving())) === '["ray-0"]' &&
      (await pool.query("SELECT name FROM fleet_actors ORDER BY name")).rows
        .map((r: { name: string }) => r.name)
        .join() === "ray-0"
        ? true
        : undefined,
    );
    expect(b!.fleet.summary("x").leader).toBe("b");
    // A clean stop gives the lease up at once.
    await b!.close();
    b = undefined;
    expect((await lease()).holder).toBeNull();
  });

  it("a refused driver is every replica's to see: the follower says refused and why", async () => {
    process.env.SCRIPTED_FLEET_REFUSE = "1";
    const r = startFleetReplica(db.url, "r", LEASE_S, dir);
    const s = startFleetReplica(db.url, "s", LEASE_S, dir);
    try {
      const seen = await waitFor("the follower to show the refusal", () => {
        const st = (r.fleet.leads() ? s : r).fleet.summary("x");
        return st.state === "refused" ? st : undefined;
      });
      expect(seen).toMatchObject({
        leader: r.fleet.leads() ? "r" : "s",
        error: { code: "ray_auth_refused", message: expect.stringMatching(/token/) },
      });
    } finally {
      delete process.env.SCRIPTED_FLEET_REFUSE;
      await r.close();
      await s.close();
    }
  });
});

describe("the driver's lease", () => {
  it("two replicas racing for a free lease: one term, one holder", async () => {
    const s = new PgFleetStore(pool, "race");
    await pool.query("UPDATE fleet_lease SET holder = NULL, until_ms = 0 WHERE id = 1");
    const got = await Promise.all(["x", "y", "z"].map((r) => s.acquire(r, scaled(60_000))));
    expect(got.filter((t) => t !== null)).toHaveLength(1);
    // A live lease is not taken again, not even by a replica that held an earlier term.
    expect(await s.acquire("b", scaled(60_000))).toBeNull();
  });

  it("a term that lost the lease writes nothing (an old leader cannot overwrite the new one's actors)", async () => {
    const s = new PgFleetStore(pool, "fence");
    await pool.query("UPDATE fleet_lease SET holder = NULL, until_ms = 0 WHERE id = 1");
    const old = (await s.acquire("old", 50))!;
    await waitFor("the old term's lease to run out", async () =>
      (await s.lease()).holder === null ? true : undefined,
    );
    const cur = (await s.acquire("new", scaled(60_000)))!;
    expect(cur.epoch).toBe(old.epoch + 1);
    const ep = { name: "ray-9", host: "127.0.0.1", port: 1, certificate: "x", restarts: 0 };
    expect(await s.putEndpoint(old, ep)).toBe(false);
    expect(await s.renew(old, 60_000)).toBe(false);
    expect((await s.actors()).map((r) => r.name)).not.toContain("ray-9");
    expect(await s.putEndpoint(cur, ep)).toBe(true);
    expect(await s.remove(old, "ray-9")).toBe(false);
    expect((await s.actors()).find((r) => r.name === "ray-9")).toMatchObject({ leader: "new" });
  });
});
