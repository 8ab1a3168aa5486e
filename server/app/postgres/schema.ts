// The Postgres schema, versioned: each migration runs once, in its own transaction, in order,
// when a replica starts (or `tpu-mcp storage migrate`). Replicas starting together take one
// advisory lock, so one migrates and the others find the work done. A database whose schema is
// newer than this code knows is refused: an older replica must not write rows a newer one reads
// differently.
import { KEYS_SQL } from "./keys.js";
import type { PgClient, PgPool } from "../../stores/pg/pool.js";

/** Session-level advisory lock key of the migration (any constant, distinct from the per-principal ones). */
const MIGRATION_LOCK = 7_801_000_001;

export const MIGRATIONS: readonly { version: number; name: string; sql: string }[] = [
  {
    version: 1,
    name: "budget, approvals, request states, audit chain, jobs",
    sql: `
      CREATE TABLE budget_charges (
        id BIGSERIAL PRIMARY KEY, principal TEXT NOT NULL, time_ms BIGINT NOT NULL,
        seconds DOUBLE PRECISION NOT NULL, tool TEXT, replica TEXT NOT NULL);
      CREATE INDEX budget_charges_by_principal ON budget_charges (principal, time_ms);
      CREATE TABLE budget_reservations (
        id TEXT PRIMARY KEY, principal TEXT NOT NULL, seconds DOUBLE PRECISION NOT NULL,
        replica TEXT NOT NULL, created_ms BIGINT NOT NULL, expires_ms BIGINT NOT NULL);
      CREATE INDEX budget_reservations_by_principal ON budget_reservations (principal);
      CREATE TABLE approvals (
        id TEXT PRIMARY KEY, principal TEXT NOT NULL, tool TEXT NOT NULL, args_digest TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('pending','approved','denied','used','expired')),
        created_ms BIGINT NOT NULL, expires_ms BIGINT NOT NULL,
        approver TEXT, reason TEXT, decided_ms BIGINT, used_ms BIGINT, used_by TEXT);
      CREATE TABLE consumed_states (nonce TEXT PRIMARY KEY, consumed_ms BIGINT NOT NULL, replica TEXT NOT NULL);
      CREATE TABLE audit_records (
        seq BIGINT PRIMARY KEY, record TEXT NOT NULL, prev_hash TEXT NOT NULL, hash TEXT NOT NULL,
        replica TEXT NOT NULL);
      CREATE TABLE audit_head (id INT PRIMARY KEY CHECK (id = 1), seq BIGINT NOT NULL, hash TEXT NOT NULL);
      INSERT INTO audit_head VALUES (1, 0, '');
      CREATE TABLE jobs (
        job_id TEXT PRIMARY KEY, tool TEXT NOT NULL, principal TEXT NOT NULL, status TEXT NOT NULL,
        owner TEXT NOT NULL, lease_until_ms BIGINT NOT NULL, cancel_requested BOOLEAN NOT NULL DEFAULT false,
        result JSONB, error JSONB, created_ms BIGINT NOT NULL, updated_ms BIGINT NOT NULL);
      CREATE INDEX jobs_running_by_lease ON jobs (lease_until_ms) WHERE status = 'running';`,
  },
  {
    version: 2,
    name: "the full approval queue, passkeys, suspensions, alerts, console sessions",
    sql: `
      ALTER TABLE approvals
        ADD COLUMN args_preview JSONB NOT NULL DEFAULT 'null',
        ADD COLUMN estimate JSONB,
        ADD COLUMN assurance TEXT NOT NULL DEFAULT 'token'
          CHECK (assurance IN ('client_form','token','passkey')),
        ADD COLUMN ttl_ms BIGINT;
      UPDATE approvals SET ttl_ms = expires_ms - created_ms WHERE ttl_ms IS NULL;
      ALTER TABLE approvals ALTER COLUMN ttl_ms SET NOT NULL;
      CREATE INDEX approvals_by_call ON approvals (principal, tool, args_digest);
      CREATE INDEX approvals_by_time ON approvals (created_ms);
      CREATE INDEX approvals_open ON approvals (status, expires_ms);
      CREATE INDEX approvals_open_by_principal ON approvals (principal, status, expires_ms);
      CREATE INDEX approvals_by_expiry ON approvals (expires_ms);
      CREATE TABLE passkey_credentials (
        id TEXT PRIMARY KEY, operator TEXT NOT NULL, public_key BYTEA NOT NULL,
        counter BIGINT NOT NULL, transports JSONB NOT NULL, aaguid TEXT NOT NULL, rp_id TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('active','pending','removed')),
        enrolled_by TEXT, created_ms BIGINT NOT NULL, last_used_ms BIGINT);
      CREATE INDEX passkey_credentials_by_operator ON passkey_credentials (operator);
      CREATE TABLE passkey_enrolment_codes (
        code_sha256 TEXT PRIMARY KEY, operator TEXT NOT NULL, created_ms BIGINT NOT NULL,
        expires_ms BIGINT NOT NULL, used_ms BIGINT);
      CREATE TABLE principal_suspensions (
        principal TEXT PRIMARY KEY, reason TEXT NOT NULL, rule TEXT NOT NULL, since TEXT NOT NULL,
        until_ms BIGINT);
      CREATE TABLE alerts (
        seq BIGSERIAL PRIMARY KEY, id TEXT NOT NULL UNIQUE, rule TEXT NOT NULL, kind TEXT NOT NULL,
        subject TEXT NOT NULL, principal TEXT, message TEXT NOT NULL, fired_ms BIGINT NOT NULL,
        quiet_until_ms BIGINT NOT NULL, action TEXT NOT NULL, details JSONB NOT NULL);
      CREATE INDEX alerts_by_time ON alerts (fired_ms);
      CREATE INDEX alerts_quiet ON alerts (rule, subject, quiet_until_ms);
      CREATE TABLE console_sessions (
        id_sha256 TEXT PRIMARY KEY, principal_id TEXT NOT NULL, principal JSONB NOT NULL,
        created_ms BIGINT NOT NULL, last_seen_ms BIGINT NOT NULL, ends_ms BIGINT NOT NULL,
        credential TEXT);
      CREATE INDEX console_sessions_by_principal ON console_sessions (principal_id, last_seen_ms);`,
  },
  { version: 3, name: "the audit key replicas share (keys.ts)", sql: KEYS_SQL },
  {
    version: 4,
    name: "budget holds per line and overruns, calls in flight, rate buckets, reports, control channel, job progress",
    sql: `
      ALTER TABLE budget_reservations DROP CONSTRAINT budget_reservations_pkey;
      ALTER TABLE budget_reservations ADD PRIMARY KEY (id, principal);
      CREATE TABLE budget_overruns (
        replica TEXT NOT NULL, line TEXT NOT NULL, excess DOUBLE PRECISION NOT NULL,
        expires_ms BIGINT NOT NULL, PRIMARY KEY (replica, line));
      CREATE INDEX budget_overruns_by_line ON budget_overruns (line);
      CREATE TABLE calls_in_flight (
        id TEXT PRIMARY KEY, replica TEXT NOT NULL, principal TEXT NOT NULL, tool TEXT NOT NULL,
        args_digest TEXT NOT NULL, args TEXT NOT NULL, estimate TEXT, approval_id TEXT,
        started_ms BIGINT NOT NULL, alive_ms BIGINT NOT NULL);
      CREATE INDEX calls_in_flight_by_replica ON calls_in_flight (replica);
      CREATE TABLE rate_buckets (
        scope TEXT NOT NULL, key TEXT NOT NULL, tokens DOUBLE PRECISION NOT NULL,
        at_ms BIGINT NOT NULL, took BOOLEAN NOT NULL, PRIMARY KEY (scope, key));
      CREATE TABLE benchmark_reports (
        id TEXT PRIMARY KEY, principal TEXT NOT NULL, model TEXT NOT NULL, device TEXT NOT NULL,
        created_at TEXT NOT NULL, report TEXT NOT NULL);
      CREATE INDEX benchmark_reports_by_model ON benchmark_reports (model, device, created_at);
      CREATE INDEX benchmark_reports_by_time ON benchmark_reports (created_at);
      CREATE TABLE measured_calls (
        id BIGSERIAL PRIMARY KEY, model TEXT NOT NULL, device TEXT NOT NULL, kind TEXT NOT NULL,
        work TEXT NOT NULL, seconds DOUBLE PRECISION NOT NULL, at BIGINT NOT NULL,
        estimate_s DOUBLE PRECISION);
      CREATE INDEX measured_calls_by_model ON measured_calls (model, device, id);
      CREATE TABLE control_drained (name TEXT PRIMARY KEY, set_by TEXT NOT NULL, at TEXT NOT NULL);
      CREATE TABLE control_observed (name TEXT PRIMARY KEY, status TEXT NOT NULL, at TEXT NOT NULL);
      CREATE TABLE control_fleet_target (
        id INT PRIMARY KEY CHECK (id = 1), count INT NOT NULL, set_by TEXT NOT NULL, at TEXT NOT NULL);
      CREATE TABLE control_fleet_observed (
        id INT PRIMARY KEY CHECK (id = 1), target INT, status TEXT NOT NULL, error TEXT, at TEXT NOT NULL);
      CREATE TABLE control_reload_request (
        id INT PRIMARY KEY CHECK (id = 1), set_by TEXT NOT NULL, at TEXT NOT NULL);
      CREATE TABLE control_reload_result (
        id INT PRIMARY KEY CHECK (id = 1), request_at TEXT NOT NULL, result TEXT NOT NULL, at TEXT NOT NULL);
      ALTER TABLE jobs ADD COLUMN progress DOUBLE PRECISION, ADD COLUMN total DOUBLE PRECISION,
        ADD COLUMN message TEXT;`,
  },
  {
    version: 5,
    name: "the full audit trail: keyed head, verification checkpoint, refusal windows",
    // The head row gains its MAC and starts at the genesis hash (SqliteAuditTrail's empty head).
    // Version 1's records were written by a test-only chain of another format (no server served
    // on Postgres before this); a trail holding them fails \`tpu-mcp audit verify\` and says where.
    sql: `
      ALTER TABLE audit_head ADD COLUMN mac TEXT;
      UPDATE audit_head SET hash = '${"0".repeat(64)}' WHERE seq = 0 AND hash = '';
      CREATE INDEX audit_records_by_outcome ON audit_records (((record::jsonb) ->> 'outcome'));
      CREATE TABLE audit_checkpoint (
        id INT PRIMARY KEY CHECK (id = 1), seq BIGINT NOT NULL, hash TEXT NOT NULL,
        keyed_from BIGINT, verified_at TEXT NOT NULL, mac TEXT NOT NULL);
      CREATE TABLE audit_refusal_windows (
        key TEXT PRIMARY KEY, scope TEXT NOT NULL CHECK (scope IN ('principal','tool','call')),
        first_seq BIGINT NOT NULL, principal TEXT NOT NULL, tool TEXT NOT NULL, args_digest TEXT,
        code TEXT NOT NULL, ends_ms BIGINT NOT NULL, count BIGINT NOT NULL DEFAULT 0,
        since TEXT, until TEXT, tools JSONB NOT NULL DEFAULT '{}'::jsonb);
      CREATE INDEX audit_refusal_windows_by_end ON audit_refusal_windows (ends_ms);`,
  },
  {
    version: 6,
    name: "stored outputs (outputs.ts)",
    // UNLOGGED: a cache of tensor bytes, not written through the WAL (emptied by a crash of the
    // database, as a replica's restart emptied its memory). Stored out of line, uncompressed:
    // tensor bytes rarely compress, and every put would pay for trying.
    sql: `
      CREATE UNLOGGED TABLE stored_outputs (
        id TEXT PRIMARY KEY, seq BIGSERIAL NOT NULL, principal TEXT NOT NULL, model TEXT NOT NULL,
        bytes BIGINT NOT NULL, replica TEXT NOT NULL, created_ms BIGINT NOT NULL,
        expires_ms BIGINT NOT NULL);
      CREATE INDEX stored_outputs_by_principal ON stored_outputs (principal, seq);
      CREATE INDEX stored_outputs_by_expiry ON stored_outputs (expires_ms);
      CREATE UNLOGGED TABLE stored_output_tensors (
        output_id TEXT NOT NULL REFERENCES stored_outputs (id) ON DELETE CASCADE,
        idx INT NOT NULL, dtype TEXT NOT NULL, shape JSONB NOT NULL, data BYTEA NOT NULL,
        PRIMARY KEY (output_id, idx));
      ALTER TABLE stored_output_tensors ALTER COLUMN data SET STORAGE EXTERNAL;`,
  },
  {
    version: 7,
    name: "the shared Ray fleet: the driver's lease and the actors it placed",
    // One row: which replica runs the fleet driver, until when (the database's clock), and its
    // term (epoch, +1 at every take-over; the actors' rows are written under it). `info` is the
    // driver's ready line (mode, capacity, target, Ray's version) for the other replicas.
    sql: `
      CREATE TABLE fleet_lease (
        id INT PRIMARY KEY CHECK (id = 1), holder TEXT, epoch BIGINT NOT NULL,
        until_ms BIGINT NOT NULL, info JSONB NOT NULL DEFAULT '{}'::jsonb);
      INSERT INTO fleet_lease (id, holder, epoch, until_ms) VALUES (1, NULL, 0, 0);
      CREATE TABLE fleet_actors (
        name TEXT PRIMARY KEY, epoch BIGINT NOT NULL, leader TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('up','lost','draining')),
        host TEXT NOT NULL, port INT NOT NULL, device TEXT, chips JSONB NOT NULL DEFAULT '[]'::jsonb,
        node TEXT, certificate TEXT NOT NULL, ray_name TEXT, restarts INT NOT NULL DEFAULT 0,
        updated_ms BIGINT NOT NULL);`,
  },
  {
    version: 8,
    name: "the shared Ray fleet: which replicas' pools hold each actor",
    // One row per actor and replica whose pool holds it, renewed by that replica (alive_ms, the
    // database's clock): a scale-down stops the actor once no live replica's pool holds it.
    sql: `
      CREATE TABLE fleet_holders (
        name TEXT NOT NULL, replica TEXT NOT NULL, alive_ms BIGINT NOT NULL,
        PRIMARY KEY (name, replica));`,
  },
  {
    version: 9,
    name: "budget holds carry their call's start and rate: overruns read live (budget.ts)",
    // A running call's overrun is computed from its hold's row on the database's clock in the
    // admitting transaction; the once-a-second published overruns are gone.
    sql: `
      ALTER TABLE budget_reservations ADD COLUMN started_ms BIGINT,
        ADD COLUMN rate DOUBLE PRECISION NOT NULL DEFAULT 1;
      DROP TABLE budget_overruns;`,
  },
  {
    version: 10,
    name: "approvals: the policy version and the rule each was requested under",
    // Null on approvals from before: they count under any version (policies/policy_version.ts).
    sql: `ALTER TABLE approvals ADD COLUMN policy_version TEXT, ADD COLUMN rule TEXT;`,
  },
];

/** The newest schema this code knows. */
export const SCHEMA_VERSION = MIGRATIONS[MIGRATIONS.length - 1]!.version;

export class SchemaError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "SchemaError";
  }
}

/** The database's schema version (0: none yet). */
export async function schemaVersion(pool: PgPool | PgClient): Promise<number> {
  const t = await pool.query("SELECT to_regclass('tpu_mcp_schema') AS t");
  if (!t.rows[0].t) return 0;
  const r = await pool.query("SELECT COALESCE(MAX(version), 0) AS v FROM tpu_mcp_schema");
  return Number(r.rows[0].v);
}

/** Refuses a schema newer than this code's. */
function refuseNewer(found: number): void {
  if (found > SCHEMA_VERSION)
    throw new SchemaError(
      `the database's schema is version ${found}, newer than this tpu-mcp knows (${SCHEMA_VERSION}): a newer replica migrated it; run that version here too (an older one must not write to it)`,
    );
}

/** Applies every migration the database lacks; returns the versions applied now. */
export async function migrate(pool: PgPool): Promise<number[]> {
  const c = await pool.connect();
  try {
    await c.query("SELECT pg_advisory_lock($1)", [MIGRATION_LOCK]);
    await c.query(
      "CREATE TABLE IF NOT EXISTS tpu_mcp_schema (version INT PRIMARY KEY, name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
    );
    const found = await schemaVersion(c);
    refuseNewer(found);
    const applied: number[] = [];
    for (const m of MIGRATIONS) {
      if (m.version <= found) continue;
      await inTransactionOn(c, async () => {
        await c.query(m.sql);
        await c.query("INSERT INTO tpu_mcp_schema (version, name) VALUES ($1, $2)", [
          m.version,
          m.name,
        ]);
      });
      applied.push(m.version);
    }
    return applied;
  } finally {
    await c.query("SELECT pg_advisory_unlock($1)", [MIGRATION_LOCK]).catch(() => {});
    c.release();
  }
}

/** At start without migrating (`storage check`): the version must be this code's. */
export async function checkSchema(pool: PgPool): Promise<number> {
  const found = await schemaVersion(pool);
  refuseNewer(found);
  if (found < SCHEMA_VERSION)
    throw new SchemaError(
      `the database's schema is version ${found}; this tpu-mcp needs ${SCHEMA_VERSION}: run \`tpu-mcp storage migrate\``,
    );
  return found;
}

async function inTransactionOn(c: PgClient, fn: () => Promise<void>): Promise<void> {
  await c.query("BEGIN");
  try {
    await fn();
    await c.query("COMMIT");
  } catch (e) {
    await c.query("ROLLBACK").catch(() => {});
    throw e;
  }
}
