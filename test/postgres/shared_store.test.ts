// The promises replicas must keep together, on a real PostgreSQL: three replicas (three pools,
// each its own connections, as three processes would hold) racing for one request state. (The
// budget: budget.test.ts. Approvals, passkeys, suspensions, alerts and console sessions:
// policy_stores.test.ts. The audit trail: audit.test.ts.)
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { openPool, redactError, redactUrl, type PgPool } from "../../server/stores/pg/pool.js";
import {
  checkSchema,
  migrate,
  MIGRATIONS,
  SCHEMA_VERSION,
  SchemaError,
  schemaVersion,
} from "../../server/app/postgres/schema.js";
import { PgRequestStates } from "../../server/app/postgres/shared.js";
import { startPostgres, type TestPostgres } from "../helpers/postgres.js";

let db: TestPostgres;
let replicas: PgPool[];
const NAMES = ["a", "b", "c"];

beforeAll(async () => {
  db = await startPostgres();
  replicas = NAMES.map((n) => openPool(db.url, { max: 8, application: `tpu-mcp-${n}` }));
  // Three replicas starting at once: one migrates, the others find it done.
  const applied = await Promise.all(replicas.map((p) => migrate(p)));
  expect(applied.flat()).toEqual(MIGRATIONS.map((m) => m.version));
});

afterAll(async () => {
  await Promise.all((replicas ?? []).map((p) => p.end()));
  await db?.stop();
});

describe("schema", () => {
  it("is applied once, then is this code's version; a newer one is refused", async () => {
    expect(await migrate(replicas[0]!)).toEqual([]);
    expect(await checkSchema(replicas[1]!)).toBe(SCHEMA_VERSION);
    await replicas[0]!.query("INSERT INTO tpu_mcp_schema (version, name) VALUES (999, 'future')");
    try {
      expect(await schemaVersion(replicas[0]!)).toBe(999);
      await expect(migrate(replicas[1]!)).rejects.toThrow(SchemaError);
      await expect(checkSchema(replicas[2]!)).rejects.toThrow(
        /version 999, newer than this tpu-mcp knows/,
      );
    } finally {
      await replicas[0]!.query("DELETE FROM tpu_mcp_schema WHERE version = 999");
    }
  });
});

describe("a request state across replicas", () => {
  it("is consumed once: a replay is refused on every replica", async () => {
    const states = replicas.map((p, i) => new PgRequestStates(p, NAMES[i]!));
    const first = await Promise.all(states.map((s) => s.consume("nonce-1")));
    expect(first.filter(Boolean)).toHaveLength(1);
    for (const s of states) expect(await s.consume("nonce-1")).toBe(false);
  });
});

describe("credentials", () => {
  it("never appear in what names the database or in a refused connection's error", async () => {
    expect(redactUrl(db.url)).not.toContain(db.password);
    expect(redactUrl(db.url)).toContain("***");
    const wrong = db.url.replace(encodeURIComponent(db.password), "not-the-password");
    const pool = openPool(wrong, { max: 1 });
    try {
      const err = await pool.query("SELECT 1").then(
        () => null,
        (e: unknown) => redactError(e, wrong),
      );
      expect(err).not.toBeNull();
      expect(err!.message).toMatch(/password authentication failed/);
      expect(err!.message).not.toContain("not-the-password");
    } finally {
      await pool.end();
    }
  });
});
