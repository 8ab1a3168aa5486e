// One replica's share of the Ray fleet on the shared store, for test/postgres/shared_fleet.test.ts:
// the real attachRayFleet (SharedRayFleet, PgFleetStore and its LISTEN from sharedFleetStore, RayFleet, FleetMembers) and
// the control poller's fleetHandler, over a pool that records what the fleet asks of it, with
// test/helpers/scripted_fleet_driver.mjs in place of the Ray driver. Run as a process of its own
// (`node --import tsx THIS URL REPLICA LEASE_S DIR`), it prints whether it leads and the pool's
// members on every change, one JSON line each, until it is killed.
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import pino from "pino";
import type { WorkerEntry } from "../../runtime/pool/entries.js";
import type { FleetPool } from "../../runtime/fleet/members.js";
import type { Fleet } from "../../runtime/fleet/ray.js";
import type { WorkerStatus } from "../../runtime/types.js";
import { openPool, type PgPool } from "../../server/stores/pg/pool.js";
import type { ServerConfig } from "../../server/config/config.js";
import { PgControlChannel } from "../../server/app/postgres/control.js";
import { sharedFleetStore } from "../../server/app/postgres/fleet.js";
import { attachRayFleet, fleetHandler } from "../../server/control/fleet.js";

export const DRIVER = fileURLToPath(
  new URL("../helpers/scripted_fleet_driver.mjs", import.meta.url),
);

const address = (e: WorkerEntry) => ("connect" in e ? e.connect : "local");

/** A pool that keeps its members' entries and a log of what it was asked. */
export class RecordingPool implements FleetPool {
  readonly members = new Map<string, { entry: WorkerEntry; draining: boolean }>();
  readonly log: string[] = [];
  private readonly closers: Array<() => Promise<void>> = [];
  onChange: () => void = () => {};

  add(entry: WorkerEntry): void {
    this.members.set(entry.name, { entry, draining: false });
    this.note(`add ${entry.name} ${address(entry)}`);
  }
  async replace(entry: WorkerEntry, prepare?: () => void): Promise<void> {
    prepare?.();
    this.members.set(entry.name, { entry, draining: false });
    this.note(`replace ${entry.name} ${address(entry)}`);
  }
  /** While set, a removal (a drain) waits for it: calls in flight here not finished yet. */
  holdRemovals: Promise<void> | null = null;

  async remove(name: string): Promise<void> {
    this.note(`removing ${name}`);
    await this.holdRemovals;
    this.members.delete(name);
    this.note(`remove ${name}`);
  }
  drain(name: string): WorkerStatus {
    const m = this.members.get(name);
    if (m) m.draining = true;
    this.note(`drain ${name}`);
    return {} as WorkerStatus;
  }
  names(): string[] {
    return [...this.members.keys()];
  }
  onClose(fn: () => Promise<void>): void {
    this.closers.push(fn);
  }
  async close(): Promise<void> {
    for (const fn of this.closers) await fn();
  }
  /** name → address of the members that are routed to (not draining). */
  serving(): Record<string, string> {
    return Object.fromEntries(
      [...this.members].filter(([, m]) => !m.draining).map(([n, m]) => [n, address(m.entry)]),
    );
  }
  private note(line: string): void {
    this.log.push(line);
    this.onChange();
  }
}

export interface FleetReplica {
  fleet: Fleet;
  pool: RecordingPool;
  db: PgPool;
  close(): Promise<void>;
}

/** Starts `replica`'s share of the fleet on the database at `url` (its own folder under `dir`). */
export function startFleetReplica(
  url: string,
  replica: string,
  leaseS: number,
  dir: string,
  actors = 2,
): FleetReplica {
  const home = join(dir, replica);
  mkdirSync(home, { recursive: true });
  const config = {
    storage: { postgres: { url, fleet_lease_s: leaseS } },
    runtime: {
      ray: {
        address: "127.0.0.1:6379",
        client: { cert: join(home, "client.crt"), key: join(home, "client.key") },
        channel: { token_file: join(home, "token"), client_ca: join(home, "ca.crt") },
        drain_timeout_s: 120,
        placement: { mode: "per-chip" },
      },
    },
    paths: {
      python: DRIVER,
      install: { workerDir: home },
      data_dir: join(home, "data"),
      audit_key: join(home, "audit.key"),
    },
  } as unknown as ServerConfig;
  const db = openPool(url, { max: 4, application: `tpu-mcp-${replica}` });
  const pool = new RecordingPool();
  const logger = pino({ level: process.env.FLEET_TEST_LOG ?? "silent" });
  process.env.SCRIPTED_FLEET_ACTORS = String(actors);
  const fleet = attachRayFleet(pool, config, logger, sharedFleetStore(db, replica, leaseS));
  // The replica's control poller, as a server runs it (`workers scale` through the shared channel):
  // the leader applies the wanted count; a follower applies nothing and publishes nothing.
  const handler = fleetHandler(fleet, logger)!;
  const channel = new PgControlChannel(db);
  let ticking: Promise<void> = Promise.resolve();
  const ticks = setInterval(() => {
    ticking = ticking.then(() => handler.tick(channel)).catch(() => {});
  }, 200);
  return {
    fleet,
    pool,
    db,
    async close() {
      clearInterval(ticks);
      await ticking;
      await pool.close();
      await db.end();
    },
  };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const [url, replica, leaseS, dir] = process.argv.slice(2);
  const r = startFleetReplica(url!, replica!, Number(leaseS), dir!);
  const report = () =>
    process.stdout.write(
      JSON.stringify({ leads: r.fleet.leads(), serving: r.pool.serving() }) + "\n",
    );
  r.pool.onChange = report;
  setInterval(report, 250);
}
