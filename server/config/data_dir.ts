// The data directory's layout: every file tpu-mcp keeps in data_dir is named here, and only
// createDataDir makes the folder. Commands that only read (approvals list/show, audit, workers
// list, doctor) use openExisting: they open what is there read-only and never create the folder,
// a store or a key, so looking at a fresh data directory leaves it as it was.
import { existsSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import Database from "better-sqlite3";
import type { SqliteDb } from "../../policies/sqlite.js";
import type { ServerConfig } from "./config.js";

export interface DataDir {
  /** The folder itself (the config's data_dir). */
  dir: string;
  /** Approvals, the audit trail and the budget ledger: one SQLite file, opened once. */
  policyDb: string;
  /** The control channel between the CLI and a running server (server/control/channel.ts). */
  workersDb: string;
  jobsDb: string;
  reportsDb: string;
  /** The Ray fleet driver's state folder (the driver makes it, mode 0700). */
  fleetState: string;
  /** The audit chain's key; policy.audit.key_file may put it outside the folder. */
  auditKey: string;
  /** The bearer token `tpu-mcp http` generates when the config names none. */
  localToken: string;
}

/** Where each file lives; touches nothing on disk. */
export function dataDir(config: ServerConfig): DataDir {
  const dir = config.paths.data_dir;
  return {
    dir,
    policyDb: join(dir, "policy.db"),
    workersDb: join(dir, "workers.db"),
    jobsDb: join(dir, "jobs.db"),
    reportsDb: join(dir, "reports.db"),
    fleetState: join(dir, "fleet"),
    auditKey: config.paths.audit_key,
    localToken: join(dir, "local-token"),
  };
}

/** The one mkdir: for the server and the commands that write (approve, drain, scale, reload). */
export function createDataDir(config: ServerConfig): DataDir {
  const layout = dataDir(config);
  mkdirSync(layout.dir, { recursive: true });
  return layout;
}

/**
 * A store as it is, read-only; null when nothing has made it yet. (SQLite may add its -wal and
 * -shm files beside a store in WAL mode; the store itself is never created or changed.)
 */
export function openExisting(path: string): SqliteDb | null {
  if (!existsSync(path)) return null;
  const db = new Database(path, { readonly: true, fileMustExist: true });
  // The server may be writing: wait for it as the writers do (policies/sqlite.ts).
  db.pragma("busy_timeout = 5000");
  return db;
}
