// `tpu-mcp audit tail | head | export | verify-export | verify` through the real CLI against the
// shared trail on a real PostgreSQL: the same commands and outputs as on SQLite, a receiver's
// check of the export without the key, and a one-row edit reported as TAMPERED.
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { loadOrCreateAuditKey } from "../../policies/audit_key.js";
import { PgAuditTrail } from "../../server/stores/audit/postgres.js";
import { openPool, type PgPool } from "../../server/stores/pg/pool.js";
import { migrate } from "../../server/app/postgres/schema.js";
import { startPostgres, type TestPostgres } from "../helpers/postgres.js";
import { cli, writeConfig } from "../helpers/server.js";

let db: TestPostgres;
let pool: PgPool;
let config: string;
let dir: string;

beforeAll(async () => {
  db = await startPostgres();
  pool = openPool(db.url, { max: 4 });
  dir = mkdtempSync(join(tmpdir(), "tpu-mcp-pg-audit-"));
  const keyFile = join(dir, "keys", "audit.key");
  config = writeConfig(
    {
      storage: { postgres: { url: db.url } },
      policy: { approvals: { rules: [] }, audit: { key_file: keyFile } },
    },
    dir,
  );
  const before = await cli(config, "audit", "tail");
  expect(before.code).toBe(1);
  expect(before.stderr).toMatch(/run `tpu-mcp storage migrate`/);
  await migrate(pool);
  // Two replicas' records on the one chain, under the deployment's key file.
  const { key } = loadOrCreateAuditKey(keyFile);
  const [a, b] = [
    await PgAuditTrail.open(pool, { replica: "a", key, keyCreated: true }),
    await PgAuditTrail.open(pool, { replica: "b", key }),
  ];
  for (let n = 0; n < 10; n++)
    await (n % 2 ? a : b).append({
      time: new Date().toISOString(),
      principal: n % 2 ? "alice" : "bob",
      tool: "run_inference",
      args_digest: `d${n}`,
      outcome: "executed",
      duration_ms: n,
    });
  await a.close();
  await b.close();
});

afterAll(async () => {
  await pool?.end();
  await db?.stop();
});

describe("tpu-mcp audit on storage.postgres", () => {
  it("tail, head, export and verify-export read the shared trail; a one-row edit makes verify say TAMPERED", async () => {
    const tail = await cli(config, "audit", "tail", "-n", "3");
    expect(tail.code).toBe(0);
    expect(tail.stdout.trim().split("\n")).toHaveLength(3);
    expect(tail.stdout).toMatch(/^#9 .* alice run_inference executed 7 ms/m);

    const head = await cli(config, "audit", "head");
    expect(head.code).toBe(0);
    const h = JSON.parse(head.stdout);
    expect(h).toMatchObject({ seq: 11 });

    const out = join(dir, "export.jsonl");
    const exp = await cli(config, "audit", "export", "--since", "1", "--out", out);
    expect(exp.code).toBe(0);
    expect(exp.stderr).toContain(`export_hash ${h.export_hash}`);
    expect(readFileSync(out, "utf8").trim().split("\n")).toHaveLength(12);
    const checked = await cli(config, "audit", "verify-export", out, "--head", h.export_hash);
    expect(checked.code).toBe(0);

    const ok = await cli(config, "audit", "verify");
    expect(ok.code).toBe(0);
    expect(ok.stdout).toMatch(/ok: 11 record\(s\), chain intact/);
    await pool.query(
      "UPDATE audit_records SET record = replace(record, '\"bob\"', '\"eve\"') WHERE seq = 4",
    );
    const bad = await cli(config, "audit", "verify");
    expect(bad.code).toBe(1);
    expect(bad.stdout).toMatch(/TAMPERED at record #4: record 4 was modified or rewritten/);
    for (const r of [tail, head, exp, checked, ok, bad])
      expect(r.stdout + r.stderr).not.toContain(db.password);
  });
});
