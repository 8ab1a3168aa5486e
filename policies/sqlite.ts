// How the SQLite files shared by the server and the CLI are opened: the policy stores
// (policy.db) and the workers control channel (workers.db). Both processes open the same file at
// once, so WAL (readers never block the writer) and a busy timeout (a writer waits for the other
// process instead of failing) are not optional.

import Database from "better-sqlite3";

export type SqliteDb = Database.Database;

/** Opens a SQLite store shared between processes (policy.db, workers.db). */
export function openStoreDb(path: string): SqliteDb {
  const db = new Database(path);
  db.pragma("journal_mode = WAL");
  db.pragma("busy_timeout = 5000");
  // NORMAL under WAL is durable across process crashes; only an OS crash may drop the last commits.
  db.pragma("synchronous = NORMAL");
  return db;
}

/** Accepts a path (the store owns and closes it) or an open handle (the caller owns it). */
export function resolveDb(pathOrDb: string | SqliteDb): { db: SqliteDb; owned: boolean } {
  return typeof pathOrDb === "string"
    ? { db: openStoreDb(pathOrDb), owned: true }
    : { db: pathOrDb, owned: false };
}
