// The store contracts (server/stores/<port>/contract.ts) on a real PostgreSQL: the same cases the
// default suite runs on SQLite (test/stores/), against the Postgres backends. One cluster for the
// file; each case opens its store on emptied tables. The database's clock cannot be set, so a
// case's `advance(ms)` moves every stored time of the port's tables back by ms instead: every
// rule compares a stored time with the database's now, so that is the same as now moving on.
import { afterAll, beforeAll } from "vitest";
import { PgAuditTrail } from "../../server/stores/audit/postgres.js";
import { approvalsContract } from "../../server/stores/approvals/contract.js";
import { auditContract, type RawAuditRow } from "../../server/stores/audit/contract.js";
import { PgApprovalQueue } from "../../server/stores/approvals/postgres.js";
import { passkeysContract } from "../../server/stores/passkeys/contract.js";
import { PgPasskeys } from "../../server/stores/passkeys/postgres.js";
import { openPool, type PgPool } from "../../server/stores/pg/pool.js";
import { migrate } from "../../server/app/postgres/schema.js";
import { startPostgres, type TestPostgres } from "../helpers/postgres.js";

let db: TestPostgres;
let pool: PgPool;

beforeAll(async () => {
  db = await startPostgres();
  pool = openPool(db.url, { max: 8, application: "tpu-mcp-contracts" });
  await migrate(pool);
});

afterAll(async () => {
  await pool?.end();
  await db?.stop();
});

approvalsContract("postgres", async ({ keepDecidedS }) => {
  await pool.query("TRUNCATE approvals");
  const opened: PgApprovalQueue[] = [];
  const make = (opts: { keepDecidedS?: number }) => {
    const store = new PgApprovalQueue(pool, opts);
    opened.push(store);
    return store;
  };
  return {
    store: make({ keepDecidedS }),
    advance: async (ms) => {
      await pool.query(
        `UPDATE approvals SET created_ms = created_ms - $1, expires_ms = expires_ms - $1,
           decided_ms = decided_ms - $1, used_ms = used_ms - $1`,
        [ms],
      );
    },
    another: async (opts = {}) => make(opts),
    close: async () => {
      for (const s of opened) await s.close();
    },
  };
});

passkeysContract("postgres", async () => {
  await pool.query("TRUNCATE passkey_credentials, passkey_enrolment_codes");
  return {
    store: new PgPasskeys(pool),
    advance: async (ms) => {
      await pool.query(
        `UPDATE passkey_credentials SET created_ms = created_ms - $1,
           last_used_ms = last_used_ms - $1`,
        [ms],
      );
      await pool.query(
        `UPDATE passkey_enrolment_codes SET created_ms = created_ms - $1,
           expires_ms = expires_ms - $1, used_ms = used_ms - $1`,
        [ms],
      );
    },
    another: async () => new PgPasskeys(pool),
    // The stores hold nothing of their own: the pool is this file's.
    close: async () => {},
  };
});

auditContract("postgres", async () => {
  await pool.query(
    "TRUNCATE audit_records, audit_checkpoint, audit_refusal_windows; DELETE FROM audit_head",
  );
  await pool.query(`INSERT INTO audit_head (id, seq, hash) VALUES (1, 0, '${"0".repeat(64)}')`);
  const opened: PgAuditTrail[] = [];
  let n = 0;
  return {
    trail: async (opts = {}) => {
      // Each handle a replica of its own, as another process would be.
      const t = await PgAuditTrail.open(pool, { replica: `r${n++}`, ...opts });
      opened.push(t);
      return t;
    },
    raw: {
      rows: async () =>
        (
          await pool.query("SELECT seq, record, prev_hash, hash FROM audit_records ORDER BY seq")
        ).rows.map((r) => ({ ...r, seq: Number(r.seq) })) as RawAuditRow[],
      update: async (r) => {
        await pool.query(
          "UPDATE audit_records SET record = $1, prev_hash = $2, hash = $3 WHERE seq = $4",
          [r.record, r.prev_hash, r.hash, r.seq],
        );
      },
      remove: async (from, to = Number.MAX_SAFE_INTEGER) => {
        await pool.query("DELETE FROM audit_records WHERE seq BETWEEN $1 AND $2", [from, to]);
      },
      replace: async (rows) => {
        await pool.query("DELETE FROM audit_records");
        for (const r of rows)
          await pool.query(
            "INSERT INTO audit_records (seq, record, prev_hash, hash, replica) VALUES ($1, $2, $3, $4, 'tamperer')",
            [r.seq, r.record, r.prev_hash, r.hash],
          );
      },
      setHead: async (h) => {
        await pool.query("UPDATE audit_head SET seq = $1, hash = $2", [h.seq, h.hash]);
        if (h.mac !== undefined) await pool.query("UPDATE audit_head SET mac = $1", [h.mac]);
      },
      wipe: async () => {
        await pool.query("DELETE FROM audit_records; DELETE FROM audit_head");
      },
    },
    close: async () => {
      for (const t of opened) await t.close();
    },
  };
});
