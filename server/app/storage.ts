// The storage port: every store that persists and every counter that must agree across calls,
// built here, in one place, from the config's one `storage` setting. The rest of the server, the
// console and the CLI hold the interfaces below, never a store's class, so a second backend is
// a second builder in this file, not an edit across the tree.
//
// Each member says whether it is SHARED (replicas of one deployment must see the same state:
// a shared backend keeps it in the database) or NODE-LOCAL (each process keeps its own, and
// sharing it would be wrong or pointless). With SQLite (the default, one process and the CLI
// beside it) every store is the data directory's file it always was, opened through
// policies/sqlite.ts with the same pragmas; the counters are this process's memory.
import type { Logger } from "pino";
import type { ApprovalQueue } from "../../policies/approval_record.js";
import { SqliteApprovalQueue } from "../stores/approvals/sqlite.js";
import { SqliteAuditTrail } from "../stores/audit/sqlite.js";
import { type AuditTrail } from "../../policies/audit.js";
import { loadOrCreateAuditKey, type AuditKey } from "../../policies/audit_key.js";
import {
  HEARTBEAT_MS,
  SqliteCallsInFlight,
  type CallsInFlight,
} from "../../policies/calls_in_flight.js";
import type { LeftBehind } from "../../policies/gate/reconcile.js";
import type { ConsumedStates } from "../../policies/gate/types.js";
import { SqliteBudgetLedger, type BudgetLedger } from "../../policies/limits/budget.js";
import { ConcurrencyLimiter } from "../../policies/limits/concurrency.js";
import { RateLimiter, type RateLimit } from "../../policies/limits/rate.js";
import type { Passkeys } from "../../policies/passkeys/store.js";
import { SqlitePasskeys } from "../stores/passkeys/sqlite.js";
import { SqliteAlertStore, type AlertStore } from "../../policies/alerts/store.js";
import {
  SqliteSuspensionStore,
  type Suspension,
  type SuspensionStore,
} from "../../policies/suspensions.js";
import {
  emptyStoreDb,
  openStoreDb,
  openStoreDbReadOnly,
  type SqliteDb,
} from "../../policies/sqlite.js";
import { SqliteJobs, type Jobs } from "../../tools/stores/jobs.js";
import { MemoryOutputs, type Outputs } from "../../tools/stores/outputs.js";
import { SqliteReports, type Reports } from "../../tools/stores/reports.js";
import { ConfigError, type ServerConfig } from "../config/config.js";
import { MemoryConsoleSessions, type ConsoleSessions } from "./console_sessions.js";
import { readSharedAuditKey, sharedAuditKey, type SharedKey } from "./postgres/keys.js";
import { openPgAuditReader } from "./postgres/audit_read.js";
import { PgAuditTrail } from "../stores/audit/postgres.js";
import { PgBudget } from "./postgres/budget.js";
import { PgCallsInFlight } from "./postgres/calls.js";
import { openPgPolicyStores } from "./postgres/policy.js";
import { PgApprovalQueue } from "../stores/approvals/postgres.js";
import { PgPasskeys } from "../stores/passkeys/postgres.js";
import { PgRateLimit } from "./postgres/rate.js";
import { PgSuspensions } from "./postgres/suspensions.js";
import type { CredentialLookup } from "../../policies/passkeys/verify_trail.js";
import { openPool, redactError, redactUrl, type PgPool } from "../stores/pg/pool.js";
import { checkSchema, migrate } from "./postgres/schema.js";
import { openPgServerStores } from "./postgres/limits.js";
import { PgControlChannel } from "./postgres/control.js";
import { hostname } from "node:os";
import { systemClock, type Clock } from "../../policies/clock.js";
import {
  ClockSkewError,
  describeSkew,
  openDatabaseClock,
  type DatabaseClock,
} from "./postgres/db_clock.js";
import type { ReplicaIdentity } from "./replica.js";
import type { LapsedCalls } from "./lapsed_calls.js";
import { createDataDir, dataDir } from "../config/data_dir.js";
import { SqliteControlChannel, type ControlChannel } from "../control/channel.js";

/** What the gate's admission and the decisions need: opened by the server and the writing CLI. */
export interface PolicyStores {
  /** Which backend the config chose. */
  readonly backend: "sqlite" | "postgres";
  /** SHARED: approvals, decided once and consumed once wherever asked. */
  approvals: ApprovalQueue;
  /** SHARED: the audit trail, its one chained head and its verification checkpoint. */
  audit: AuditTrail;
  /** The key of the audit chain and of the request state: replicas must hold the same one. */
  auditKey: { key: AuditKey; created: boolean };
  /**
   * SHARED: device-seconds charged per budget line over the window. (SQLite: the rows in
   * policy.db and this process's mirror of them, the one writer of the file.)
   */
  budget: BudgetLedger;
  /**
   * SHARED: admitted calls not yet charged, settled at start when a killed process left them
   * (SQLite: every row is this data directory's one server's); on Postgres also those of another
   * replica whose lease lapsed (`lapsed`: it died and did not start again under its id).
   */
  calls: CallsInFlight & LeftBehind & Partial<LapsedCalls>;
  /**
   * SHARED: request-state nonces consumed once on every replica (Postgres). Absent with SQLite
   * (one process: an in-band answer's single use is its approval's decide-once).
   */
  consumedStates?: ConsumedStates;
  /** SHARED: operators' passkeys and their signature counters. */
  passkeys: Passkeys;
  /** SHARED: principals an alert rule suspended (the gate refuses them; the CLI resumes them). */
  suspensions: SuspensionStore;
  /** SHARED: the alerts that fired, and each rule's quiet time per subject (once per window). */
  alertStore: AlertStore;
  /**
   * SHARED: calls per minute per principal. (SQLite: this process's token buckets; a restart
   * refills them, which a per-minute allowance can afford.)
   */
  rateLimiter: RateLimit;
  /**
   * NODE-LOCAL: slots on this process's devices and the per-principal pending caps of its
   * queues. Admission order on one device is the device owner's, so a replica queues only for
   * the devices it reaches.
   */
  limiter: ConcurrencyLimiter;
  close(): void | Promise<void>;
}

/** The server's stores: the policy stores and those only a running server opens. */
export interface Storage extends PolicyStores {
  /**
   * SHARED: the HTTP surface's counters: failed authentications per minute server-wide (the
   * failed-auth limiter's budget; its per-address back-off stays NODE-LOCAL) and `initialize`
   * requests per principal and per address. (SQLite: this process's token buckets.)
   */
  httpRates: { authFailures: RateLimit; initPerPrincipal: RateLimit; initPerAddress: RateLimit };
  /**
   * Long jobs (SQLite: NODE-LOCAL, jobs.db: a job runs in the process that started it, and a
   * start marks every `running` row interrupted, so two servers must not share the file).
   */
  jobs: Jobs;
  /** SHARED: benchmark reports and measured calls (estimates learn from every replica's). */
  reports: Reports;
  /**
   * SHARED: large outputs kept for a later read (tpu://outputs/…), bounded in bytes, 30 min,
   * the principal's own; an output made through one replica is read through any. (SQLite:
   * NODE-LOCAL, this process's memory, lost on restart.)
   */
  outputs: Outputs;
  /** SHARED: workers' desired state and what the server observes (the CLI's control channel). */
  channel: ControlChannel;
  /**
   * SHARED: the console's signed-in sessions, so any replica serves one (SQLite: this process's
   * memory, as always; a restart signs everyone out). Only the id's hash is stored.
   */
  consoleSessions: ConsoleSessions;
}

/**
 * A Postgres deployment's connection, opened (asynchronously) before its stores: one pool for
 * every store of this process, the schema migrated (replicas starting together migrate once;
 * a newer schema is refused), and the audit key every replica shares (postgres/keys.ts).
 */
export interface SharedBackend {
  pool: PgPool;
  replica: ReplicaIdentity;
  key: SharedKey;
  /**
   * The database's clock as this replica reads it (postgres/db_clock.ts), for what it computes
   * and another replica checks (request states' expiry). A CLI command has none (it seals none).
   */
  clock?: Clock;
  close(): Promise<void>;
}

/** Opens the shared backend of a `storage.postgres` config; null with SQLite (nothing to open). */
export async function openSharedBackend(
  config: ServerConfig,
  logger: Logger,
  replica: ReplicaIdentity,
  /** This process's clock (a test gives a skewed one). */
  clock: Clock = systemClock,
): Promise<SharedBackend | null> {
  const url = databaseUrl(config);
  if (url === null || !("postgres" in config.storage)) return null;
  const pg = config.storage.postgres;
  const pool = openPool(url, { application: `tpu-mcp ${replica.id}` });
  let dbClock: DatabaseClock | undefined;
  try {
    // First: a replica whose clock is off the database's refuses to start before it writes.
    dbClock = await openDatabaseClock(pool, {
      clock,
      maxSkewMs: pg.max_clock_skew_ms,
      onDrift: (skewMs) =>
        logger.error(
          { skew_ms: skewMs, max_clock_skew_ms: pg.max_clock_skew_ms },
          `storage: ${describeSkew(skewMs)}, more than storage.postgres.max_clock_skew_ms since this replica started (its clock was stepped); request states follow the database's clock, but sync this machine's clock with NTP`,
        ),
    });
    const applied = await migrate(pool);
    if (applied.length > 0)
      logger.info({ applied, database: redactUrl(url) }, "storage: schema migrated");
    const keyFile = config.policy.audit.key_file ? config.paths.audit_key : undefined;
    const key = await sharedAuditKey(pool, keyFile);
    if (key.where === "database" && key.created)
      logger.warn(
        "storage: made the audit key and kept it in the database (tpu_mcp_keys), where every replica reads it: whoever can write the database can also recompute the audit chain; give policy.audit.key_file (the same key on every replica) to keep it apart (docs/storage.md)",
      );
    const opened = dbClock;
    return {
      pool,
      replica,
      key,
      clock: opened.now,
      close: async () => {
        opened.close();
        await pool.end();
      },
    };
  } catch (e) {
    dbClock?.close();
    await pool.end().catch(() => {});
    if (e instanceof ClockSkewError) throw e;
    throw redactError(e, url);
  }
}

/**
 * A CLI command's own connection to the shared store: a small pool on a schema that must be this
 * code's (a command never migrates: `tpu-mcp storage migrate` does), its URL's password kept out
 * of any error.
 */
async function openCommandPool(url: string, application: string): Promise<PgPool> {
  const pool = openPool(url, { max: 2, application });
  try {
    await checkSchema(pool);
    return pool;
  } catch (e) {
    await pool.end().catch(() => {});
    throw redactError(e, url);
  }
}

/**
 * The shared backend of a CLI command that writes on `storage.postgres` (approve, deny, operators
 * enrol|remove, principals resume, workers): the replicas' audit key read, never made (none yet:
 * no replica has started), under a replica name of the command's own (`cli:HOST:pid-PID`), so
 * what a replica holds is never taken for this command's.
 */
export async function openCommandBackend(config: ServerConfig): Promise<SharedBackend> {
  const url = databaseUrl(config);
  if (url === null) throw new Error("openCommandBackend: the config is not storage.postgres");
  const replica: ReplicaIdentity = {
    id: `cli:${hostname()}:pid-${process.pid}`,
    storage: "postgres",
  };
  const pool = await openCommandPool(url, `tpu-mcp ${replica.id}`);
  try {
    const keyFile = config.policy.audit.key_file ? config.paths.audit_key : undefined;
    const key = await readSharedAuditKey(pool, keyFile);
    if (!key)
      throw new ConfigError("(config)", [
        "storage.postgres: the database holds no audit key yet (the first replica to start makes it); start a replica first, or give policy.audit.key_file (docs/storage.md)",
      ]);
    return {
      pool,
      replica,
      key: { key, created: false, where: keyFile ? "file" : "database" },
      close: () => pool.end(),
    };
  } catch (e) {
    await pool.end().catch(() => {});
    throw redactError(e, url);
  }
}

/**
 * The policy stores for writing: the server, and the CLI commands that decide or change state
 * (approve, deny, workers drain/scale/reload). Makes the data directory and the audit key when
 * missing; read-only commands use the read* openers below instead. On Postgres, `shared` is the
 * backend opened first (openSharedBackend), and the stores are built on its pool.
 */
export async function openPolicyStores(
  config: ServerConfig,
  logger: Logger,
  shared: SharedBackend | null = null,
): Promise<PolicyStores> {
  if (shared) return openPgPolicy(config, logger, shared);
  if (databaseUrl(config) !== null)
    throw new ConfigError("(config)", [
      "storage.postgres: the policy stores are opened on the shared backend (openSharedBackend, or openCommandBackend for a CLI command), never on the data directory's SQLite files",
    ]);
  const layout = createDataDir(config, { warn: (msg) => logger.warn(msg) });
  const policy = config.policy;
  // One handle for the stores of policy.db (they share the file, and close with it).
  const db = openStoreDb(layout.policyDb);
  const approvals = new SqliteApprovalQueue(db, { keepDecidedS: policy.approvals.keep_decided_s });
  const auditKey = loadOrCreateAuditKey(layout.auditKey);
  const audit = new SqliteAuditTrail(db, {
    logger: logger.child({ component: "audit" }),
    key: auditKey.key,
    keyCreated: auditKey.created,
    refusalWindowMs: policy.audit.refusal_window_s * 1000,
  });
  const budget = new SqliteBudgetLedger(db, policy.limits.budget);
  const passkeys = new SqlitePasskeys(db);
  const calls = new SqliteCallsInFlight(db, { withCharges: (write) => budget.alongside(write) });
  const suspensions = new SqliteSuspensionStore(db);
  const alertStore = new SqliteAlertStore(db);
  return {
    backend: "sqlite",
    approvals,
    audit,
    auditKey,
    budget,
    calls,
    passkeys,
    suspensions,
    alertStore,
    rateLimiter: new RateLimiter(policy.limits.rate_limit.per_principal_per_minute),
    limiter: new ConcurrencyLimiter(policy.limits),
    close() {
      suspensions.close();
      alertStore.close();
      calls.close();
      passkeys.close();
      approvals.close();
      audit.close();
      budget.close();
      if (db.open) db.close();
    },
  };
}

/**
 * The policy stores on the shared backend's pool, this replica's: the approvals (decided and used
 * once, other replicas' changes heard), the one audit chain under the replicas' key, the budget
 * (one cap; opening it drops what a previous run of this replica held), the calls in flight
 * (settled per replica; their rows join the `allowed` record's transaction), passkeys,
 * suspensions, alerts, rate limits and consumed request states. The device slots stay this
 * process's. `close()` stops what they run (listeners, renewals, the audit queue); the pool is
 * the backend's, closed by its owner.
 */
async function openPgPolicy(
  config: ServerConfig,
  logger: Logger,
  shared: SharedBackend,
): Promise<PolicyStores> {
  const { pool, replica, key } = shared;
  const policy = config.policy;
  const stores = openPgPolicyStores(pool, {
    replica: replica.id,
    keepDecidedS: policy.approvals.keep_decided_s,
    onError: (e) => logger.error({ err: String(e) }, "storage: approvals listener failed"),
  });
  let audit: PgAuditTrail | undefined;
  let budget: PgBudget | undefined;
  try {
    // A key made by this start, or the deployment's key file on an empty trail: the chain starts
    // with its chain_keyed record (replicas starting together write one). A trail with records
    // and no chain_keyed for the key was reset, and is logged as such (as on SQLite).
    const empty = async () =>
      Number((await pool.query("SELECT seq FROM audit_head WHERE id = 1")).rows[0]?.seq) === 0;
    const keyCreated = key.created || (key.where === "file" && (await empty()));
    audit = await PgAuditTrail.open(pool, {
      replica: replica.id,
      logger: logger.child({ component: "audit" }),
      key: key.key,
      keyCreated,
      refusalWindowMs: policy.audit.refusal_window_s * 1000,
    });
    budget = await PgBudget.open(pool, {
      limitS: policy.limits.budget.device_seconds_per_window,
      windowS: policy.limits.budget.window_s,
      replica: replica.id,
    });
  } catch (e) {
    await audit?.close();
    await stores.close();
    throw e;
  }
  const callLeaseS = "postgres" in config.storage ? config.storage.postgres.call_lease_s : 15;
  const calls = new PgCallsInFlight(pool, replica.id, HEARTBEAT_MS, callLeaseS * 1000);
  const [trail, ledger] = [audit, budget];
  return {
    backend: "postgres",
    approvals: stores.approvals,
    audit,
    auditKey: { key: key.key, created: key.created },
    budget,
    calls,
    consumedStates: stores.consumedStates,
    passkeys: stores.passkeys,
    suspensions: stores.suspensions,
    alertStore: stores.alertStore,
    rateLimiter: new PgRateLimit(
      pool,
      "principal",
      policy.limits.rate_limit.per_principal_per_minute,
    ),
    limiter: new ConcurrencyLimiter(policy.limits),
    async close() {
      calls.close();
      ledger.close();
      await trail.close();
      await stores.close();
    },
  };
}

/**
 * Every store a running server holds (the policy stores are built by createPolicyServices). On
 * storage.postgres, `shared` (openSharedBackend) holds them all: jobs owned by this replica under
 * a lease (storage.postgres.job_lease_s; this replica's previous run's jobs are marked
 * interrupted before this resolves), benchmark reports and measured calls, the control channel,
 * console sessions, the HTTP surface's rates and the stored outputs. close() closes what it
 * opened, never the pool (the backend's).
 */
export async function openServerStores(
  config: ServerConfig,
  logger: Logger,
  shared: SharedBackend | null = null,
): Promise<Omit<Storage, keyof PolicyStores> & { close(): Promise<void> }> {
  const onJobError = (err: unknown) => logger.error({ err }, "job failed unexpectedly");
  if (shared) {
    const pg = openPgServerStores(shared.pool, config, { replica: shared.replica.id, onJobError });
    try {
      await pg.jobs.ready();
    } catch (e) {
      await pg.close().catch(() => {});
      throw e;
    }
    return pg;
  }
  if (databaseUrl(config) !== null)
    throw new ConfigError("(config)", [
      "storage.postgres: the server's stores need the shared backend, opened first (openSharedBackend)",
    ]);
  // Each store also closes on its own: the server closes them at their own points of its shutdown.
  const layout = createDataDir(config, { warn: (msg) => logger.warn(msg) });
  const reports = new SqliteReports(layout.reportsDb);
  const jobs = new SqliteJobs(layout.jobsDb, { onError: onJobError });
  const channel = SqliteControlChannel.open(layout.workersDb);
  const consoleSessions = new MemoryConsoleSessions();
  const outputs = new MemoryOutputs(config.inference.outputs_max_bytes);
  const http = config.http;
  return {
    jobs,
    reports,
    outputs,
    channel,
    consoleSessions,
    httpRates: {
      authFailures: new RateLimiter(http.auth_limit.failures_per_minute),
      initPerPrincipal: new RateLimiter(http.initialize_rate.per_principal_per_minute),
      initPerAddress: new RateLimiter(http.initialize_rate.per_address_per_minute),
    },
    async close() {
      consoleSessions.close();
      channel.close();
      jobs.close();
      reports.close();
    },
  };
}

/**
 * The workers' control channel as `tpu-mcp workers` opens it: workers.db beside a SQLite server
 * (`existing`: read-only, null when no server has made it yet, nothing created); on
 * storage.postgres the shared one every replica polls, from a small pool of the command's own
 * (the schema must be this code's: never migrated from here).
 */
export async function openControlChannel(
  config: ServerConfig,
  opts: { existing?: boolean; warn: (msg: string) => void },
): Promise<{ channel: ControlChannel; close(): Promise<void> } | null> {
  const url = databaseUrl(config);
  if (url !== null) {
    const pool = await openCommandPool(url, "tpu-mcp workers");
    return { channel: new PgControlChannel(pool), close: () => pool.end() };
  }
  const channel = opts.existing
    ? SqliteControlChannel.openExisting(dataDir(config).workersDb)
    : SqliteControlChannel.open(createDataDir(config, { warn: opts.warn }).workersDb);
  return channel && { channel, close: async () => channel.close() };
}

/** An existing store from before the current schema: opened for writing, as the server would. */
function isReadOnlyRefusal(e: unknown): boolean {
  return (e as { code?: string })?.code === "SQLITE_READONLY";
}

/**
 * The policy store as it is, read-only. None yet (no server or decision has used this data
 * directory): an empty in-memory store answers instead, so the output is what an empty store
 * gives, and `note` says why; nothing is created.
 */
function readPolicyDb(config: ServerConfig, note: (msg: string) => void): SqliteDb {
  const path = dataDir(config).policyDb;
  const db = openStoreDbReadOnly(path);
  if (db) return db;
  note(`(no policy store yet at ${path}: no server has run on this data directory)`);
  return emptyStoreDb();
}

/**
 * The approvals, read-only (`approvals list|show`): never makes the store or the audit key. On
 * storage.postgres: the shared queue, its schema this code's.
 */
export async function readApprovals(
  config: ServerConfig,
  note: (msg: string) => void,
): Promise<{ approvals: ApprovalQueue; close(): void | Promise<void> }> {
  const url = databaseUrl(config);
  if (url !== null) {
    const pool = await openCommandPool(url, "tpu-mcp approvals");
    const approvals = new PgApprovalQueue(pool);
    return {
      approvals,
      async close() {
        await approvals.close();
        await pool.end();
      },
    };
  }
  const db = readPolicyDb(config, note);
  let approvals: SqliteApprovalQueue;
  try {
    approvals = new SqliteApprovalQueue(db);
  } catch (e) {
    db.close();
    if (!isReadOnlyRefusal(e)) throw e;
    // A policy.db without the approvals table yet: there is nothing to show.
    approvals = new SqliteApprovalQueue(emptyStoreDb());
  }
  return {
    approvals,
    close() {
      approvals.close();
      if (db.open) db.close();
    },
  };
}

/**
 * The audit trail read-only, with the passkeys its signed decisions are checked against. A store
 * from before the keyed head (its schema needs a column) is opened for writing, as the server
 * would on start, to add it; a missing store is an empty trail in memory. On storage.postgres:
 * the shared trail, its schema this code's, under the replicas' key (postgres/audit_read.ts;
 * `opts.key`, the data directory's, is not theirs).
 */
export async function readAuditTrail(
  config: ServerConfig,
  opts: { key: AuditKey | null; logger?: Logger },
  note: (msg: string) => void,
): Promise<{ audit: AuditTrail; passkeys: CredentialLookup; close(): void | Promise<void> }> {
  const url = databaseUrl(config);
  if (url !== null)
    return openPgAuditReader(url, {
      keyFile: config.policy.audit.key_file ? config.paths.audit_key : undefined,
      logger: opts.logger,
    });
  const db = readPolicyDb(config, note);
  try {
    const audit = new SqliteAuditTrail(db, opts);
    return {
      audit,
      passkeys: new SqlitePasskeys(db),
      close() {
        audit.close();
        if (db.open) db.close();
      },
    };
  } catch (e) {
    if (db.open) db.close();
    if (!isReadOnlyRefusal(e)) throw e;
    const audit = new SqliteAuditTrail(dataDir(config).policyDb, opts);
    const passkeys = new SqlitePasskeys(dataDir(config).policyDb);
    return {
      audit,
      passkeys,
      close: () => {
        audit.close();
        passkeys.close();
      },
    };
  }
}

/** The suspensions in force, read-only (`principals list|suspended`); none without a store. */
export async function readSuspensions(config: ServerConfig, nowMs: number): Promise<Suspension[]> {
  const url = databaseUrl(config);
  if (url !== null) {
    const pool = await openCommandPool(url, "tpu-mcp principals");
    try {
      return await new PgSuspensions(pool).list(nowMs);
    } finally {
      await pool.end();
    }
  }
  const db = openStoreDbReadOnly(dataDir(config).policyDb);
  if (!db) return [];
  try {
    const table = db
      .prepare(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'principal_suspensions'",
      )
      .get();
    return table ? await new SqliteSuspensionStore(db).list(nowMs) : [];
  } finally {
    db.close();
  }
}

/** The passkeys read-only (`operators list`); null when no store exists yet. */
export async function readPasskeys(
  config: ServerConfig,
): Promise<{ passkeys: Passkeys; close(): void | Promise<void> } | null> {
  const url = databaseUrl(config);
  if (url !== null) {
    const pool = await openCommandPool(url, "tpu-mcp operators");
    return { passkeys: new PgPasskeys(pool), close: () => pool.end() };
  }
  const db = openStoreDbReadOnly(dataDir(config).policyDb);
  if (!db) return null;
  const store = new SqlitePasskeys(db);
  return {
    passkeys: store,
    close() {
      store.close();
      if (db.open) db.close();
    },
  };
}

/** The Postgres URL of a `storage.postgres` config (the file's, else TPU_MCP_DATABASE_URL); null with SQLite. */
export function databaseUrl(
  config: Pick<ServerConfig, "storage">,
  env: NodeJS.ProcessEnv = process.env,
): string | null {
  if (!("postgres" in config.storage)) return null;
  const url = config.storage.postgres.url ?? env.TPU_MCP_DATABASE_URL;
  if (!url)
    throw new ConfigError("(config)", [
      "storage.postgres: no database URL: give storage.postgres.url or set TPU_MCP_DATABASE_URL (postgres://USER:PASSWORD@HOST:PORT/DB)",
    ]);
  return url;
}

/** The config as printed (`config show`): the database URL's password replaced by "***". */
export function redactedConfig<T extends Pick<ServerConfig, "storage">>(config: T): T {
  if (!("postgres" in config.storage) || !config.storage.postgres.url) return config;
  const pg = config.storage.postgres;
  return { ...config, storage: { postgres: { ...pg, url: redactUrl(pg.url!) } } };
}
