// The data directory's layout: every file tpu-mcp keeps in data_dir is named here, and only
// createDataDir makes the folder. Commands that only read (approvals list/show, audit, workers
// list, doctor) use openExisting: they open what is there read-only and never create the folder,
// a store or a key, so looking at a fresh data directory leaves it as it was.
import { chmodSync, closeSync, existsSync, mkdirSync, openSync, statSync } from "node:fs";
import { join } from "node:path";
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
  /**
   * The operator's token of the embedded default (no tokens or JWT configured): approvals:grant,
   * generated beside localToken, used by the console sign-in and `approvals approve|deny`.
   */
  operatorToken: string;
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
    operatorToken: join(dir, "operator-token"),
  };
}

/** A mode others may use in a way that cannot be allowed: refused at start, with the fix. */
export class FileModeError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "FileModeError";
  }
}

const octal = (mode: number) => (mode & 0o777).toString(8).padStart(3, "0");
// Modes mean nothing on Windows, where ACLs decide.
const POSIX = process.platform !== "win32";

/**
 * Like ssh: a folder or store that others may WRITE is refused (they could replace what it
 * holds); one others may only read is allowed with a warning (they read approvals and the trail).
 */
export function checkPrivate(path: string, what: string, warn: (msg: string) => void): void {
  if (!POSIX) return;
  const mode = statSync(path).mode;
  const dir = (mode & 0o170000) === 0o040000;
  if (mode & 0o022)
    throw new FileModeError(
      `${what} ${path} is writable by other users (mode ${octal(mode)}); refusing to use it. Run: chmod ${dir ? "700" : "600"} ${path}`,
    );
  if (mode & 0o055)
    warn(
      `${what} ${path} is readable by other users (mode ${octal(mode)}); run: chmod ${dir ? "700" : "600"} ${path}`,
    );
}

/**
 * A secret (a token, a webhook secret): refused when anyone but its owner may read or write it,
 * as ssh refuses a private key.
 */
export function checkSecretFile(path: string, what: string): void {
  if (!POSIX) return;
  const mode = statSync(path).mode;
  if (mode & 0o077)
    throw new FileModeError(
      `${what} ${path} is accessible to other users (mode ${octal(mode)}); refusing to use it. Run: chmod 600 ${path}`,
    );
}

/**
 * The one mkdir: for the server and the commands that write (approve, drain, scale, reload).
 * The folder is made 0700 and every store in it 0600 (SQLite gives its -wal and -shm files the
 * store's mode); a folder or store others may write is refused, one they may read is warned of.
 */
export function createDataDir(
  config: ServerConfig,
  opts: { warn?: (msg: string) => void } = {},
): DataDir {
  const warn = opts.warn ?? (() => {});
  const layout = dataDir(config);
  if (!existsSync(layout.dir)) {
    mkdirSync(layout.dir, { recursive: true, mode: 0o700 });
    if (POSIX) chmodSync(layout.dir, 0o700);
  }
  checkPrivate(layout.dir, "the data directory", warn);
  for (const store of [layout.policyDb, layout.workersDb, layout.jobsDb, layout.reportsDb]) {
    // An empty file is an empty SQLite database: made here, it never exists with a wider mode.
    if (!existsSync(store)) closeSync(openSync(store, "a", 0o600));
    checkPrivate(store, "the store", warn);
  }
  return layout;
}

/** A store as it is, read-only; null when nothing has made it yet (policies/sqlite.ts). */
export { openStoreDbReadOnly as openExisting } from "../../policies/sqlite.js";
