// The Ray fleet on the server side: attaches a RayFleet to the pool when `runtime.ray` is set,
// and carries `tpu-mcp workers scale N` (admin) to it. The CLI writes the wanted count into the
// same workers.db that `workers drain` uses (desired state, so it survives a restart); the server
// reads it every half second, asks the driver to scale (removals drain in the pool first) and
// writes back what the fleet reports, which the CLI waits on.
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import type { Logger } from "pino";
import { openPolicyDb, type SqliteDb } from "../policies/sqlite.js";
import { RayFleet, type FleetPool, type FleetStatus } from "../runtime/fleet/ray.js";
import type { ServerConfig } from "./config.js";
import { driverConfig } from "./fleet_config.js";

/** Starts the fleet driver for this pool; the pool's close() stops the driver first. */
export function attachRayFleet(
  pool: FleetPool & { onClose(fn: () => Promise<void>): void },
  config: ServerConfig,
  logger: Logger,
): RayFleet {
  const ray = config.runtime.ray!;
  const fleet = new RayFleet({
    pool,
    driverConfig: driverConfig(ray),
    client: ray.client,
    tokenFile: ray.channel.token_file,
    stateDir: join(config.paths.data_dir, "fleet"),
    pythonPath: config.paths.python,
    workerDir: join(config.paths.root, "runtime", "worker"),
    drainTimeoutMs: ray.drain_timeout_s * 1000,
    logger: logger.child({ component: "ray-fleet" }),
  });
  pool.onClose(() => fleet.close());
  fleet
    .start()
    .then((s) =>
      logger.info({ mode: s.mode, capacity: s.capacity, target: s.target }, "Ray fleet ready"),
    )
    .catch((e: unknown) => logger.error({ err: String(e) }, "Ray fleet did not start"));
  return fleet;
}

function open(config: ServerConfig): SqliteDb {
  mkdirSync(config.paths.data_dir, { recursive: true });
  const db = openPolicyDb(join(config.paths.data_dir, "workers.db"));
  db.exec(`CREATE TABLE IF NOT EXISTS fleet_target (id INTEGER PRIMARY KEY CHECK (id = 1), count INTEGER NOT NULL, by TEXT NOT NULL, at TEXT NOT NULL);
           CREATE TABLE IF NOT EXISTS fleet_observed (id INTEGER PRIMARY KEY CHECK (id = 1), target INTEGER, status TEXT NOT NULL, error TEXT, at TEXT NOT NULL);`);
  return db;
}

/** Server side: applies `workers scale` and publishes the fleet's actors. */
export function watchFleetScale(
  config: ServerConfig,
  fleet: RayFleet | undefined,
  logger: Logger,
  intervalMs = 500,
): { close(): void } {
  if (!fleet) return { close() {} };
  const db = open(config);
  let applied: { count: number; at: string } | null = null;
  let lastError: string | null = null;
  let busy = false;
  let driverRestarts = 0;
  const publish = db.prepare(
    "INSERT INTO fleet_observed (id, target, status, error, at) VALUES (1, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET target = excluded.target, status = excluded.status, error = excluded.error, at = excluded.at",
  );
  const tick = async () => {
    if (busy || fleet.status().state !== "ready") return;
    busy = true;
    // A restarted driver starts from the config's count again: re-apply the recorded target.
    const restarts = fleet.summary("").driver_restarts;
    if (restarts !== driverRestarts) {
      driverRestarts = restarts;
      applied = null;
    }
    try {
      const want = db.prepare("SELECT count, at FROM fleet_target WHERE id = 1").get() as
        { count: number; at: string } | undefined;
      if (want && (applied?.at !== want.at || applied.count !== want.count)) {
        applied = want;
        try {
          const r = await fleet.scale(want.count);
          lastError = null;
          logger.warn(
            { target: r.target, added: r.added, draining: r.draining },
            "Ray fleet scaled",
          );
        } catch (e) {
          lastError = `${(e as { code?: string }).code ?? "error"}: ${(e as Error).message}`;
          logger.warn({ err: lastError }, "Ray fleet scale refused");
        }
      }
      const s: FleetStatus = await fleet.actors();
      publish.run(
        applied?.count ?? s.target ?? null,
        JSON.stringify(s),
        lastError,
        new Date().toISOString(),
      );
    } catch (e) {
      logger.debug({ err: String(e) }, "fleet status tick failed");
    } finally {
      busy = false;
    }
  };
  const timer = setInterval(() => void tick(), intervalMs);
  timer.unref();
  return {
    close() {
      clearInterval(timer);
      db.close();
    },
  };
}

/** Records the wanted actor count (desired state); the server's watcher applies it. */
export function recordFleetTarget(config: ServerConfig, count: number, by: string): string {
  const db = open(config);
  try {
    const at = new Date().toISOString();
    db.prepare(
      "INSERT INTO fleet_target (id, count, by, at) VALUES (1, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET count = excluded.count, by = excluded.by, at = excluded.at",
    ).run(count, by, at);
    return at;
  } finally {
    db.close();
  }
}

/**
 * CLI side of `tpu-mcp workers scale N` (the caller has checked the admin token): records the
 * wanted count, then waits until the server's fleet reports that many actors serving.
 */
export async function requestScale(
  config: ServerConfig,
  count: number,
  by: string,
  io: FleetWaitIo,
): Promise<number> {
  if (!config.runtime.ray) {
    io.err("workers scale needs a Ray fleet: add runtime.ray to the config (README: Ray fleet)");
    return 2;
  }
  const at = recordFleetTarget(config, count, by);
  return waitForFleet(config, count, at, io);
}

export interface FleetWaitIo {
  out: (s: string) => void;
  err: (s: string) => void;
  json: boolean;
  waitMs?: number;
}

/** Waits until the server's fleet reports `count` actors serving, after the target set at `at`. */
export async function waitForFleet(
  config: ServerConfig,
  count: number,
  at: string,
  io: FleetWaitIo,
): Promise<number> {
  const db = open(config);
  try {
    const until = Date.now() + (io.waitMs ?? 5 * 60_000);
    for (;;) {
      const o = db
        .prepare("SELECT target, status, error, at FROM fleet_observed WHERE id = 1")
        .get() as
        { target: number | null; status: string; error: string | null; at: string } | undefined;
      if (o && o.at > at) {
        const s = JSON.parse(o.status) as FleetStatus;
        if (o.error && o.target === count) {
          io.err(`scale ${count} refused: ${o.error}`);
          return 1;
        }
        const serving = (s.actors ?? []).filter((a) => a.state === "up").length;
        const total = (s.actors ?? []).length;
        if (o.target === count && serving === count && total === count) {
          io.out(
            io.json
              ? JSON.stringify(s, null, 2)
              : `Ray fleet at ${count} worker(s): ${(s.actors ?? []).map((a) => `${a.name} ${a.endpoint?.device ?? "?"}@${a.endpoint?.host ?? "?"}`).join(", ") || "none"}`,
          );
          return 0;
        }
      }
      if (Date.now() > until) {
        io.err(
          o
            ? `scale ${count} recorded; the fleet is still moving (run tpu-mcp workers to follow)`
            : "scale recorded, but no running server with a Ray fleet has picked it up",
        );
        return 1;
      }
      await new Promise((r) => setTimeout(r, 250));
    }
  } finally {
    db.close();
  }
}
