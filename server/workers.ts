// `tpu-mcp workers [list] | drain NAME | undrain NAME`, and the server side that obeys it.
//
// Mechanism: a small SQLite file beside the other stores (`workers.db` in data_dir). The CLI,
// after checking an admin token against the same policy config as the server, writes the
// desired drain state; the running server (stdio or HTTP, it has no admin port to open) reads it
// every half second, applies it to its pool, and writes back each worker's observed state, which
// the CLI waits on ("drained, 0 calls in flight: it may be stopped"). Why not an HTTP endpoint:
// a stdio server has none, and a new admin endpoint is new network surface; reaching the data
// directory already takes the same local authority as `tpu-mcp approvals` and `audit`. Desired
// state (not a command queue) also survives a server restart: a drained worker stays drained.
import type { Logger } from "pino";
import { Authenticator } from "../policies/auth.js";
import { openPolicyDb, type SqliteDb } from "../policies/sqlite.js";
import type { Runtime, WorkerStatus } from "../runtime/types.js";
import type { ServerConfig } from "./config.js";
import { createPolicyServices } from "./policy.js";
import { requestScale } from "./fleet.js";
import { requestReload } from "./reload.js";
import { join } from "node:path";
import { mkdirSync } from "node:fs";

export function workersDbPath(config: ServerConfig): string {
  return join(config.paths.data_dir, "workers.db");
}

function open(path: string): SqliteDb {
  const db = openPolicyDb(path);
  db.exec(`CREATE TABLE IF NOT EXISTS drained (name TEXT PRIMARY KEY, by TEXT NOT NULL, at TEXT NOT NULL);
           CREATE TABLE IF NOT EXISTS observed (name TEXT PRIMARY KEY, status TEXT NOT NULL, at TEXT NOT NULL);`);
  return db;
}

/** Server side: applies the desired drain state and publishes every worker's state. */
export function watchWorkerControl(
  config: ServerConfig,
  runtime: Runtime,
  logger: Logger,
  intervalMs = 500,
): { close(): void } {
  // The default pool of one worker has nothing to drain (and publishes nothing, as before).
  if (runtime.single) return { close() {} };
  const pool = runtime;
  mkdirSync(config.paths.data_dir, { recursive: true });
  const db = open(workersDbPath(config));
  const readDrained = db.prepare("SELECT name FROM drained");
  const upsert = db.prepare(
    "INSERT INTO observed (name, status, at) VALUES (?, ?, ?) ON CONFLICT(name) DO UPDATE SET status = excluded.status, at = excluded.at",
  );
  const tick = () => {
    try {
      const want = new Set((readDrained.all() as Array<{ name: string }>).map((r) => r.name));
      const now = new Date().toISOString();
      const tx = db.transaction((ws: WorkerStatus[]) => {
        for (const w of ws) upsert.run(w.name, JSON.stringify(w), now);
      });
      for (const w of pool.workers()) {
        if (want.has(w.name) && !w.draining) {
          pool.drain(w.name);
          logger.warn({ worker: w.name }, "worker drained: no new calls are routed to it");
        } else if (!want.has(w.name) && w.draining) {
          pool.undrain(w.name);
          logger.info({ worker: w.name }, "worker undrained");
        }
      }
      tx(pool.workers());
    } catch (e) {
      logger.warn({ err: String(e) }, "worker control tick failed");
    }
  };
  tick();
  const timer = setInterval(tick, intervalMs);
  timer.unref();
  return {
    close() {
      clearInterval(timer);
      db.close();
    },
  };
}

interface Io {
  out: (s: string) => void;
  err: (s: string) => void;
  json: boolean;
  logger: Logger;
  token?: string;
  /** How long `drain` waits for the worker's calls in flight to finish. */
  waitMs?: number;
}

function row(w: WorkerStatus, at: string): string {
  const mem =
    w.memory_free_bytes != null ? ` free ${(w.memory_free_bytes / 2 ** 20).toFixed(0)} MiB` : "";
  return (
    `${w.name.padEnd(10)} ${w.device.padEnd(8)} ${(w.address ? `remote ${w.address}` : "local").padEnd(24)} ` +
    `${w.state}${w.draining ? " (drained)" : ""}, in flight ${w.in_flight}, restarts ${w.restarts},${mem} ` +
    `models: ${w.models.join(", ") || "none"}${w.lost_models.length ? `; lost: ${w.lost_models.join(", ")}` : ""}  [seen ${at}]`
  );
}

export async function runWorkersCommand(
  config: ServerConfig,
  positionals: string[],
  io: Io,
): Promise<number> {
  const [sub = "list", name] = positionals;
  mkdirSync(config.paths.data_dir, { recursive: true });
  const db = open(workersDbPath(config));
  const observed = () =>
    (
      db.prepare("SELECT status, at FROM observed ORDER BY name").all() as Array<{
        status: string;
        at: string;
      }>
    ).map((r) => ({ w: JSON.parse(r.status) as WorkerStatus, at: r.at }));
  try {
    if (sub === "list") {
      const ws = observed();
      if (io.json) io.out(JSON.stringify(ws, null, 2));
      else
        io.out(
          ws.length
            ? ws.map(({ w, at }) => row(w, at)).join("\n")
            : "no worker state recorded: is a server with a worker pool (runtime.workers) running on this data directory?",
        );
      return 0;
    }
    const scaleTo = sub === "scale" && /^\d{1,4}$/.test(name ?? "") ? Number(name) : undefined;
    const reload = sub === "reload" && name === undefined;
    if (
      (sub !== "drain" && sub !== "undrain" && scaleTo === undefined && !reload) ||
      (!name && !reload)
    ) {
      io.err(
        "usage: tpu-mcp workers [list] | drain NAME | undrain NAME | scale N (Ray fleet) | reload (re-read the config)  (--token T, an admin token)",
      );
      return 2;
    }
    if (!io.token) {
      io.err(
        "an admin token is required: --token TOKEN or TPU_MCP_TOKEN (a principal with the admin scope)",
      );
      return 2;
    }
    let principal;
    try {
      principal = await new Authenticator(config.policy).authenticate(io.token);
    } catch (e) {
      io.err(`the token was refused: ${(e as Error).message}`);
      return 1;
    }
    const policy = createPolicyServices(config, io.logger);
    try {
      const admin = principal.scopes.includes("admin");
      policy.audit.append({
        time: new Date().toISOString(),
        principal: principal.id,
        tool: `workers.${sub}`,
        args_digest: null,
        args: scaleTo !== undefined ? { count: scaleTo } : reload ? {} : { worker: name },
        outcome: admin ? "executed" : "denied",
        ...(admin
          ? {}
          : { code: "insufficient_scope", reason: `workers ${sub} needs the admin scope` }),
      });
      if (!admin) {
        io.err(`insufficient_scope: ${principal.id} lacks the admin scope that ${sub} needs`);
        return 1;
      }
    } finally {
      policy.close();
    }
    if (scaleTo !== undefined) return await requestScale(config, scaleTo, principal.id, io);
    if (reload) return await requestReload(config, principal.id, io);
    const known = observed().map((o) => o.w.name);
    if (known.length && !known.includes(name)) {
      io.err(`no worker named ${name}; workers: ${known.join(", ")}`);
      return 1;
    }
    if (sub === "undrain") {
      db.prepare("DELETE FROM drained WHERE name = ?").run(name);
      io.out(`${name}: undrained; the server routes calls to it again within a second`);
      return 0;
    }
    db.prepare(
      "INSERT INTO drained (name, by, at) VALUES (?, ?, ?) ON CONFLICT(name) DO UPDATE SET by = excluded.by, at = excluded.at",
    ).run(name, principal.id, new Date().toISOString());
    const until = Date.now() + (io.waitMs ?? 60_000);
    for (;;) {
      const o = observed().find((x) => x.w.name === name);
      if (o?.w.draining && o.w.in_flight === 0) {
        io.out(
          io.json
            ? JSON.stringify(o.w, null, 2)
            : `${name}: drained, no calls in flight; it may be stopped (undrain with: tpu-mcp workers undrain ${name})`,
        );
        return 0;
      }
      if (Date.now() > until) {
        io.err(
          o
            ? `${name}: drained, but ${o.w.draining ? `${o.w.in_flight} calls still in flight` : "the server has not applied it yet"}; run tpu-mcp workers to follow`
            : `${name}: marked drained, but no running server has reported it yet`,
        );
        return 1;
      }
      await new Promise((r) => setTimeout(r, 200));
    }
  } finally {
    db.close();
  }
}
