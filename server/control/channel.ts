// workers.db: the one control channel between `tpu-mcp workers drain|undrain|scale|reload` and a
// running server. The CLI, after checking an admin token against the same policy config as the
// server, writes desired state; the running server (stdio or HTTP: it has no admin port to open)
// reads it every half second through one poller, applies it, and writes back what it observes,
// which the CLI waits on. Why not an HTTP endpoint: a stdio server has none, and a new admin
// endpoint is new network surface; reaching the data directory already takes the same local
// authority as `tpu-mcp approvals` and `audit`. Desired state (not a command queue) also survives
// a server restart: a drained worker stays drained, a fleet keeps its recorded size.
//
// The file is opened and given its schema here only; control/drain.ts, fleet.ts and reload.ts
// hold the server halves (handlers of the one poller), cli/workers.ts the CLI half.
import type { Logger } from "pino";
import { openStoreDb, type SqliteDb } from "../../policies/sqlite.js";
import type { FleetStatus } from "../../runtime/fleet/ray.js";
import type { WorkerStatus } from "../../runtime/types.js";
import { openExisting } from "../config/data_dir.js";

const SCHEMA = `
  CREATE TABLE IF NOT EXISTS drained (name TEXT PRIMARY KEY, by TEXT NOT NULL, at TEXT NOT NULL);
  CREATE TABLE IF NOT EXISTS observed (name TEXT PRIMARY KEY, status TEXT NOT NULL, at TEXT NOT NULL);
  CREATE TABLE IF NOT EXISTS fleet_target (id INTEGER PRIMARY KEY CHECK (id = 1), count INTEGER NOT NULL, by TEXT NOT NULL, at TEXT NOT NULL);
  CREATE TABLE IF NOT EXISTS fleet_observed (id INTEGER PRIMARY KEY CHECK (id = 1), target INTEGER, status TEXT NOT NULL, error TEXT, at TEXT NOT NULL);
  CREATE TABLE IF NOT EXISTS reload_request (id INTEGER PRIMARY KEY CHECK (id = 1), by TEXT NOT NULL, at TEXT NOT NULL);
  CREATE TABLE IF NOT EXISTS reload_result (id INTEGER PRIMARY KEY CHECK (id = 1), request_at TEXT NOT NULL, result TEXT NOT NULL, at TEXT NOT NULL);`;

export interface ObservedWorker {
  w: WorkerStatus;
  at: string;
}

/** What the server publishes of its fleet: the driver's status, and the last actor that died or
 * was lost with why (`workers scale` prints it while it waits). */
export type PublishedFleet = FleetStatus & {
  last_actor_error?: { name: string; reason: string; code?: string } | null;
};

export interface FleetObserved {
  target: number | null;
  status: PublishedFleet;
  error: string | null;
  at: string;
}

/**
 * The control channel's state: the operator's desired state (drains, the fleet's size, a reload
 * request) and what the servers observe. Every read and write returns a promise: SQLite
 * (workers.db, SqliteControlChannel) answers inside the call; the shared store
 * (server/app/postgres/control.ts) is one state for every replica and the CLI.
 */
export interface ControlChannel {
  /** The names the operator wants drained. */
  drained(): Promise<Set<string>>;
  setDrained(name: string, by: string): Promise<void>;
  clearDrained(name: string): Promise<void>;
  /** Every worker's state as a server last published it. */
  observed(): Promise<ObservedWorker[]>;
  publishWorkers(ws: WorkerStatus[]): Promise<void>;
  /** The wanted Ray actor count. */
  fleetTarget(): Promise<{ count: number; at: string } | undefined>;
  /** Records the wanted actor count; resolves to when (the CLI waits for state newer than that). */
  setFleetTarget(count: number, by: string): Promise<string>;
  fleetObserved(): Promise<FleetObserved | undefined>;
  publishFleet(target: number | null, status: PublishedFleet, error: string | null): Promise<void>;
  /** The last reload request. */
  reloadRequest(): Promise<{ by: string; at: string } | undefined>;
  /** Records a reload request; resolves to its time, which names it in the result. */
  requestReload(by: string): Promise<string>;
  reloadResult(): Promise<{ request_at: string; result: string } | undefined>;
  writeReloadResult(requestAt: string, result: unknown): Promise<void>;
  close(): void;
}

/** The channel in workers.db beside a SQLite server (the data directory's). */
export class SqliteControlChannel implements ControlChannel {
  private constructor(
    private readonly db: SqliteDb,
    private readonly readOnly: boolean,
  ) {}

  /** Opens the channel, making the file and its schema if needed (the data dir must exist). */
  static open(path: string): SqliteControlChannel {
    const db = openStoreDb(path);
    db.exec(SCHEMA);
    return new SqliteControlChannel(db, false);
  }

  /** The channel as it is, read-only (`workers list`); null when nothing has made it yet. */
  static openExisting(path: string): SqliteControlChannel | null {
    const db = openExisting(path);
    return db ? new SqliteControlChannel(db, true) : null;
  }

  /** A read-only channel from before a table existed answers as if that table were empty. */
  private get<T>(sql: string): T | undefined {
    try {
      return this.db.prepare(sql).get() as T | undefined;
    } catch (e) {
      if (this.readOnly && /no such table/.test(String(e))) return undefined;
      throw e;
    }
  }

  private all<T>(sql: string): T[] {
    try {
      return this.db.prepare(sql).all() as T[];
    } catch (e) {
      if (this.readOnly && /no such table/.test(String(e))) return [];
      throw e;
    }
  }

  // Drain: the names the operator wants drained, and every worker's state as the server saw it.

  async drained(): Promise<Set<string>> {
    return new Set(this.all<{ name: string }>("SELECT name FROM drained").map((r) => r.name));
  }

  async setDrained(name: string, by: string): Promise<void> {
    this.db
      .prepare(
        "INSERT INTO drained (name, by, at) VALUES (?, ?, ?) ON CONFLICT(name) DO UPDATE SET by = excluded.by, at = excluded.at",
      )
      .run(name, by, new Date().toISOString());
  }

  async clearDrained(name: string): Promise<void> {
    this.db.prepare("DELETE FROM drained WHERE name = ?").run(name);
  }

  async observed(): Promise<ObservedWorker[]> {
    return this.all<{ status: string; at: string }>(
      "SELECT status, at FROM observed ORDER BY name",
    ).map((r) => ({ w: JSON.parse(r.status) as WorkerStatus, at: r.at }));
  }

  async publishWorkers(ws: WorkerStatus[]): Promise<void> {
    const upsert = this.db.prepare(
      "INSERT INTO observed (name, status, at) VALUES (?, ?, ?) ON CONFLICT(name) DO UPDATE SET status = excluded.status, at = excluded.at",
    );
    const now = new Date().toISOString();
    this.db.transaction(() => {
      for (const w of ws) upsert.run(w.name, JSON.stringify(w), now);
    })();
  }

  // Fleet: the wanted Ray actor count, and what the fleet reports.

  async fleetTarget(): Promise<{ count: number; at: string } | undefined> {
    return this.get("SELECT count, at FROM fleet_target WHERE id = 1");
  }

  /** Records the wanted actor count; returns when (the CLI waits for state newer than that). */
  async setFleetTarget(count: number, by: string): Promise<string> {
    const at = new Date().toISOString();
    this.db
      .prepare(
        "INSERT INTO fleet_target (id, count, by, at) VALUES (1, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET count = excluded.count, by = excluded.by, at = excluded.at",
      )
      .run(count, by, at);
    return at;
  }

  async fleetObserved(): Promise<FleetObserved | undefined> {
    const o = this.get<{ target: number | null; status: string; error: string | null; at: string }>(
      "SELECT target, status, error, at FROM fleet_observed WHERE id = 1",
    );
    return o && { ...o, status: JSON.parse(o.status) as PublishedFleet };
  }

  async publishFleet(
    target: number | null,
    status: PublishedFleet,
    error: string | null,
  ): Promise<void> {
    this.db
      .prepare(
        "INSERT INTO fleet_observed (id, target, status, error, at) VALUES (1, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET target = excluded.target, status = excluded.status, error = excluded.error, at = excluded.at",
      )
      .run(target, JSON.stringify(status), error, new Date().toISOString());
  }

  // Reload: the last request, and the result for it.

  async reloadRequest(): Promise<{ by: string; at: string } | undefined> {
    return this.get("SELECT by, at FROM reload_request WHERE id = 1");
  }

  /** Records a reload request; returns its time, which names it in the result. */
  async requestReload(by: string): Promise<string> {
    const at = new Date().toISOString();
    this.db
      .prepare(
        "INSERT INTO reload_request (id, by, at) VALUES (1, ?, ?) ON CONFLICT(id) DO UPDATE SET by = excluded.by, at = excluded.at",
      )
      .run(by, at);
    return at;
  }

  async reloadResult(): Promise<{ request_at: string; result: string } | undefined> {
    return this.get("SELECT request_at, result FROM reload_result WHERE id = 1");
  }

  async writeReloadResult(requestAt: string, result: unknown): Promise<void> {
    this.db
      .prepare(
        "INSERT INTO reload_result (id, request_at, result, at) VALUES (1, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET request_at = excluded.request_at, result = excluded.result, at = excluded.at",
      )
      .run(requestAt, JSON.stringify(result), new Date().toISOString());
  }

  close(): void {
    if (this.db.open) this.db.close();
  }
}

/** One server half of the channel: runs on each tick of the one poller. */
export interface ControlHandler {
  name: string;
  tick(channel: ControlChannel): void | Promise<void>;
}

/**
 * The one poller: every `intervalMs` it runs each handler whose previous tick has finished (a
 * fleet scale may take minutes; drains keep being applied meanwhile). The first tick runs now,
 * so a worker drained before the server started is never routed to.
 */
export function watchControl(
  channel: ControlChannel,
  handlers: ControlHandler[],
  logger: Logger,
  intervalMs = 500,
): { close(): void } {
  const busy = new Set<string>();
  const tick = () => {
    for (const h of handlers) {
      if (busy.has(h.name)) continue;
      busy.add(h.name);
      let r: void | Promise<void> = undefined;
      try {
        r = h.tick(channel);
      } catch (e) {
        logger.warn({ err: String(e), handler: h.name }, "control channel tick failed");
      }
      Promise.resolve(r)
        .catch((e: unknown) =>
          logger.warn({ err: String(e), handler: h.name }, "control channel tick failed"),
        )
        .finally(() => busy.delete(h.name));
    }
  };
  tick();
  const timer = setInterval(tick, intervalMs);
  timer.unref();
  return { close: () => clearInterval(timer) };
}
