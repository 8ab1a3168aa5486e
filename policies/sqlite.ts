// The one place SQLite files are opened: the stores shared by the server and the CLI (policy.db,
// workers.db) and the server's own (jobs.db, reports.db). The server and the CLI open the same
// file at once, so WAL (readers never block the writer) and a busy timeout (a writer waits for
// the other process instead of failing) are not optional.

import { existsSync } from "node:fs";
import Database from "better-sqlite3";

export type SqliteDb = Database.Database;

/** Opens a SQLite store for writing (policy.db, workers.db, jobs.db, reports.db). */
export function openStoreDb(path: string): SqliteDb {
  const db = new Database(path);
  db.pragma("journal_mode = WAL");
  db.pragma("busy_timeout = 5000");
  // NORMAL under WAL is durable across process crashes; only an OS crash may drop the last commits.
  db.pragma("synchronous = NORMAL");
  return db;
}

/**
 * A store as it is, read-only; null when nothing has made it yet. (SQLite may add its -wal and
 * -shm files beside a store in WAL mode; the store itself is never created or changed.)
 */
export function openStoreDbReadOnly(path: string): SqliteDb | null {
  if (!existsSync(path)) return null;
  const db = new Database(path, { readonly: true, fileMustExist: true });
  // The server may be writing: wait for it as the writers do.
  db.pragma("busy_timeout = 5000");
  return db;
}

/** An empty store in memory: what a read-only command reads where no store exists yet. */
export function emptyStoreDb(): SqliteDb {
  return new Database(":memory:");
}

/** Accepts a path (the store owns and closes it) or an open handle (the caller owns it). */
export function resolveDb(pathOrDb: string | SqliteDb): { db: SqliteDb; owned: boolean } {
  return typeof pathOrDb === "string"
    ? { db: openStoreDb(pathOrDb), owned: true }
    : { db: pathOrDb, owned: false };
}
