// The key replicas must agree on: the audit chain's HMAC key, which also seals the 2026-07-28
// request states (policies/request_state.ts), so a state sealed by one replica opens on another.
// Replicas share no files, so it comes from one of two places:
//
// - `policy.audit.key_file`, when the config names one: the same key on every replica (a secret
//   the deployment mounts, made once with `tpu-mcp audit` on SQLite or by hand). It is read, never
//   made here: replicas each making their own would chain under different keys. Kept apart from
//   the database, whoever can write the database still cannot recompute the chain.
// - else the database (`tpu_mcp_keys`): the first replica to start makes it, in one INSERT every
//   other replica's loses, and all read the winner's. No file to distribute; but whoever can
//   write the database can then also recompute the chain, which the start-up log says.
import { randomBytes } from "node:crypto";
import {
  auditKeyId,
  readAuditKey,
  AuditKeyError,
  type AuditKey,
} from "../../../policies/audit_key.js";
import type { PgPool } from "../../stores/pg/pool.js";

export interface SharedKey {
  key: AuditKey;
  /** This replica made it (the first start of the deployment). */
  created: boolean;
  where: "file" | "database";
}

export async function sharedAuditKey(
  pool: PgPool,
  keyFile: string | undefined,
): Promise<SharedKey> {
  if (keyFile) {
    const key = readAuditKey(keyFile);
    if (!key)
      throw new AuditKeyError(
        `policy.audit.key_file ${keyFile} does not exist: on storage.postgres every replica must hold the same key, so none is made here; put the deployment's key there (or remove key_file to keep the key in the database)`,
      );
    return { key, created: false, where: "file" };
  }
  const made = randomBytes(32);
  const ins = await pool.query(
    `INSERT INTO tpu_mcp_keys (name, key, created_at) VALUES ('audit', $1, now())
     ON CONFLICT (name) DO NOTHING`,
    [made],
  );
  const row = (await pool.query(SELECT_KEY)).rows[0] as KeyRow;
  return { key: keyOf(row), created: ins.rowCount === 1, where: "database" };
}

/**
 * The replicas' audit key, read only (the operator's read commands): `policy.audit.key_file`'s,
 * else the database's; null when there is none yet. Never made.
 */
export async function readSharedAuditKey(
  pool: PgPool,
  keyFile: string | undefined,
): Promise<AuditKey | null> {
  if (keyFile) return readAuditKey(keyFile);
  const t = await pool.query("SELECT to_regclass('tpu_mcp_keys') AS t");
  if (!t.rows[0].t) return null;
  const row = (await pool.query(SELECT_KEY)).rows[0] as KeyRow | undefined;
  return row ? keyOf(row) : null;
}

const SELECT_KEY = "SELECT key, created_at FROM tpu_mcp_keys WHERE name = 'audit'";
type KeyRow = { key: Buffer; created_at: Date };

function keyOf(row: KeyRow): AuditKey {
  return {
    id: auditKeyId(row.key),
    key: row.key,
    created_at: row.created_at.toISOString(),
    path: "(the database: tpu_mcp_keys)",
  };
}

/** The migration that makes the keys' table (server/app/postgres/schema.ts lists it). */
export const KEYS_SQL = `
  CREATE TABLE tpu_mcp_keys (
    name TEXT PRIMARY KEY, key BYTEA NOT NULL CHECK (length(key) = 32),
    created_at TIMESTAMPTZ NOT NULL);`;
