// The store contracts (server/stores/<port>/contract.ts) on a real PostgreSQL: the same cases the
// default suite runs on SQLite (test/stores/), against the Postgres backends. One cluster for the
// file; each case opens its store on emptied tables. The database's clock cannot be set, so a
// case's `advance(ms)` moves every stored time of the port's tables back by ms instead: every
// rule compares a stored time with the database's now, so that is the same as now moving on.
import { afterAll, beforeAll } from "vitest";
import { approvalsContract } from "../../server/stores/approvals/contract.js";
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
