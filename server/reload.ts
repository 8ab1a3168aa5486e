// Config reload: on SIGHUP, or `tpu-mcp workers reload` (admin; through workers.db like
// `workers scale`), the server re-reads its config file, validates it with the same schema as at
// start-up, and applies what can change at run time (server/config_diff.ts: the Ray fleet's
// actor count, through the `workers scale` path, so removals drain first). An invalid file is
// refused with a clear log line and nothing changes; other changed settings are logged as
// needing a restart.
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import type { Logger } from "pino";
import { openPolicyDb, type SqliteDb } from "../policies/sqlite.js";
import type { RayFleet } from "../runtime/fleet/ray.js";
import { ConfigError, type ServerConfig } from "./config.js";
import { diffConfig } from "./config_diff.js";
import { recordFleetTarget, waitForFleet, type FleetWaitIo } from "./fleet.js";

export interface ReloadResult {
  ok: boolean;
  /** What was applied, e.g. "runtime.ray.placement.count: 2 -> 3". */
  applied: string[];
  /** Changed settings that need a restart (left as they are). */
  restart: string[];
  /** The fleet's new target, when the reload changed it. */
  fleet_target?: number;
  /** When that target was recorded (the CLI waits for fleet state newer than this). */
  fleet_target_at?: string;
  error?: string;
}

export interface Reloader {
  reload(by: string): Promise<ReloadResult>;
}

/**
 * `load` reads and validates the config file again (the CLI's loadConfig with the same command
 * line overrides); `running` is the config the server started from (before any token the CLI
 * generated for itself).
 */
export function createReloader(
  running: ServerConfig,
  load: (() => ServerConfig) | undefined,
  /** The Ray fleet (runtime.ray), whose capacity a removed count stands for. */
  fleet: RayFleet | undefined,
  logger: Logger,
): Reloader {
  let current = running;
  let busy: Promise<ReloadResult> | null = null;
  const run = async (by: string): Promise<ReloadResult> => {
    if (!load) {
      const error = "this server was started without a config file; there is nothing to reload";
      logger.warn({ by }, `config reload refused: ${error}`);
      return { ok: false, applied: [], restart: [], error };
    }
    let next: ServerConfig;
    try {
      next = load();
    } catch (e) {
      const error = e instanceof ConfigError ? e.message : `cannot read the config: ${String(e)}`;
      logger.error({ by }, `config reload refused, nothing changed: ${error}`);
      return { ok: false, applied: [], restart: [], error };
    }
    const diff = diffConfig(current, next);
    const result: ReloadResult = { ok: true, applied: [], restart: diff.restart };
    if (diff.fleet_count !== undefined) {
      const count =
        diff.fleet_count === "capacity" ? (fleet?.status().capacity ?? 0) : diff.fleet_count;
      // The same desired state `workers scale` writes: the fleet watcher applies it (drain first).
      result.fleet_target_at = recordFleetTarget(current, count, `config-reload (${by})`);
      result.applied.push(
        `runtime.ray.placement.count: ${current.runtime.ray?.placement.count ?? "capacity"} -> ${next.runtime.ray?.placement.count ?? "capacity"} (target ${count})`,
      );
      result.fleet_target = count;
      const ray = current.runtime.ray!;
      current = Object.freeze({
        ...current,
        runtime: Object.freeze({
          ...current.runtime,
          ray: Object.freeze({
            ...ray,
            placement: Object.freeze({
              ...ray.placement,
              count: next.runtime.ray!.placement.count,
            }),
          }),
        }),
      }) as ServerConfig;
    }
    logger.warn(
      { by, applied: result.applied, needs_restart: result.restart },
      result.applied.length || result.restart.length
        ? `config reloaded: ${result.applied.length ? `applied ${result.applied.join("; ")}` : "nothing to apply at run time"}${result.restart.length ? `; these changed settings need a restart: ${result.restart.join(", ")}` : ""}`
        : "config reloaded: no change",
    );
    return result;
  };
  return {
    reload(by) {
      // One at a time: a second SIGHUP during a reload waits for the first.
      const p = (busy ?? Promise.resolve()).then(() => run(by));
      busy = p.catch(() => ({ ok: false, applied: [], restart: [] }));
      return p;
    },
  };
}

function open(config: ServerConfig): SqliteDb {
  mkdirSync(config.paths.data_dir, { recursive: true });
  const db = openPolicyDb(join(config.paths.data_dir, "workers.db"));
  db.exec(`CREATE TABLE IF NOT EXISTS reload_request (id INTEGER PRIMARY KEY CHECK (id = 1), by TEXT NOT NULL, at TEXT NOT NULL);
           CREATE TABLE IF NOT EXISTS reload_result (id INTEGER PRIMARY KEY CHECK (id = 1), request_at TEXT NOT NULL, result TEXT NOT NULL, at TEXT NOT NULL);`);
  return db;
}

/** Server side of `tpu-mcp workers reload`: runs each new request once, writes its result. */
export function watchReloadRequests(
  config: ServerConfig,
  reloader: Reloader,
  logger: Logger,
  intervalMs = 500,
): { close(): void } {
  const db = open(config);
  const read = db.prepare("SELECT by, at FROM reload_request WHERE id = 1");
  // A request made before this server started is not replayed.
  let handled = (read.get() as { at: string } | undefined)?.at ?? null;
  let busy = false;
  const write = db.prepare(
    "INSERT INTO reload_result (id, request_at, result, at) VALUES (1, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET request_at = excluded.request_at, result = excluded.result, at = excluded.at",
  );
  const timer = setInterval(() => {
    if (busy) return;
    const req = read.get() as { by: string; at: string } | undefined;
    if (!req || req.at === handled) return;
    handled = req.at;
    busy = true;
    reloader
      .reload(`workers reload by ${req.by}`)
      .then((r) => write.run(req.at, JSON.stringify(r), new Date().toISOString()))
      .catch((e: unknown) => logger.warn({ err: String(e) }, "config reload request failed"))
      .finally(() => (busy = false));
  }, intervalMs);
  timer.unref();
  return {
    close() {
      clearInterval(timer);
      db.close();
    },
  };
}

/** CLI side of `tpu-mcp workers reload` (the caller has checked the admin token). */
export async function requestReload(
  config: ServerConfig,
  by: string,
  io: FleetWaitIo,
): Promise<number> {
  const db = open(config);
  let result: ReloadResult | undefined;
  try {
    const at = new Date().toISOString();
    db.prepare(
      "INSERT INTO reload_request (id, by, at) VALUES (1, ?, ?) ON CONFLICT(id) DO UPDATE SET by = excluded.by, at = excluded.at",
    ).run(by, at);
    const until = Date.now() + Math.min(io.waitMs ?? 30_000, 30_000);
    for (;;) {
      const r = db.prepare("SELECT request_at, result FROM reload_result WHERE id = 1").get() as
        { request_at: string; result: string } | undefined;
      if (r?.request_at === at) {
        result = JSON.parse(r.result) as ReloadResult;
        break;
      }
      if (Date.now() > until) {
        io.err("reload recorded, but no running server on this data directory has picked it up");
        return 1;
      }
      await new Promise((res) => setTimeout(res, 200));
    }
  } finally {
    db.close();
  }
  if (!result.ok) {
    io.err(`reload refused, nothing changed: ${result.error ?? "?"}`);
    return 1;
  }
  if (io.json) io.out(JSON.stringify(result, null, 2));
  else {
    io.out(
      result.applied.length
        ? `applied: ${result.applied.join("; ")}`
        : "nothing to apply at run time",
    );
    if (result.restart.length) io.out(`changed, but needs a restart: ${result.restart.join(", ")}`);
  }
  if (result.fleet_target === undefined) return 0;
  const since = result.fleet_target_at ?? new Date(0).toISOString();
  return waitForFleet(config, result.fleet_target, since, {
    ...io,
    out: io.json ? () => {} : io.out,
  });
}
