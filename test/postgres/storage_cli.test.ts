// `tpu-mcp storage migrate | check` and `config show` through the real CLI against a real
// PostgreSQL: the schema is applied once and checked, the clock compared, and the database's
// password never printed; and a stdio server serving on it reaches another replica's job.
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PgJobs } from "../../server/app/postgres/jobs.js";
import { openPool } from "../../server/stores/pg/pool.js";
import { migrate, MIGRATIONS, SCHEMA_VERSION } from "../../server/app/postgres/schema.js";
import { scaled, slowdown } from "../helpers/calibrate.js";
import { startPostgres, type TestPostgres } from "../helpers/postgres.js";
import { CLI, cli, connectStdio, ROOT, writeConfig } from "../helpers/server.js";

let db: TestPostgres;
beforeAll(async () => {
  db = await startPostgres();
});
afterAll(async () => {
  await db?.stop();
});

describe("tpu-mcp storage", () => {
  it("check says to migrate, migrate applies the schema once, check then passes", async () => {
    const config = writeConfig({ storage: { postgres: { url: db.url } } });
    const before = await cli(config, "storage", "check");
    expect(before.code).toBe(1);
    expect(before.stdout).toMatch(
      new RegExp(
        `schema is version 0; this tpu-mcp needs ${SCHEMA_VERSION}: run \`tpu-mcp storage migrate\``,
      ),
    );

    const first = await cli(config, "storage", "migrate");
    expect(first.code).toBe(0);
    expect(first.stdout).toContain(
      `to schema ${SCHEMA_VERSION} (applied ${MIGRATIONS.map((m) => m.version).join(", ")})`,
    );
    const again = await cli(config, "storage", "migrate");
    expect(again.stdout).toMatch(/nothing to apply/);

    const check = await cli(config, "storage", "check", "--json");
    expect(check.code).toBe(0);
    const report = JSON.parse(check.stdout);
    expect(report).toMatchObject({
      backend: "postgres",
      reachable: true,
      schema_version: SCHEMA_VERSION,
      problems: [],
    });
    expect(Math.abs(report.clock_skew_ms)).toBeLessThan(1000);

    const shown = await cli(config, "config", "show");
    for (const r of [before, first, again, check, shown]) {
      expect(r.stdout + r.stderr).not.toContain(db.password);
    }
    expect(shown.stdout).toContain("postgres://tpu:***@127.0.0.1");
  });

  it("the doctor has a storage section: reachable, schema, clock skew, no password", async () => {
    // No worker Python: the doctor stops after its config, storage and catalog sections.
    const config = writeConfig({
      storage: { postgres: { url: db.url } },
      runtime: { python: "/nonexistent/python", device: "cpu" },
    });
    const r = await cli(config, "doctor");
    expect(r.stdout).toMatch(
      new RegExp(
        `storage\\n {2}ok {3}postgres postgres://tpu:\\*\\*\\*@127\\.0\\.0\\.1:\\d+/tpu: PostgreSQL \\d+.*, schema ${SCHEMA_VERSION} \\(this code: ${SCHEMA_VERSION}\\), clock skew -?\\d+ ms`,
      ),
    );
    expect(r.stdout + r.stderr).not.toContain(db.password);
  });

  it("takes the URL from TPU_MCP_DATABASE_URL; a wrong password is refused without echoing it", async () => {
    const config = writeConfig({ storage: { postgres: {} } });
    const run = (url: string) =>
      promisify(execFile)(process.execPath, [CLI, "storage", "check", "--config", config], {
        cwd: ROOT,
        env: { ...process.env, TPU_MCP_DATABASE_URL: url },
        timeout: scaled(60_000),
      }).then(
        (r) => ({ code: 0, out: r.stdout + r.stderr }),
        (e: { code: number; stdout: string; stderr: string }) => ({
          code: e.code,
          out: e.stdout + e.stderr,
        }),
      );
    const ok = await run(db.url);
    expect(ok.code).toBe(0);
    expect(ok.out).toMatch(/reachable \(PostgreSQL \d+/);
    const wrong = db.url.replace(encodeURIComponent(db.password), "guessed-secret");
    const refused = await run(wrong);
    expect(refused.code).toBe(1);
    expect(refused.out).toMatch(
      /cannot reach postgres:\/\/tpu:\*\*\*@127\.0\.0\.1.*password authentication failed/,
    );
    expect(refused.out).not.toContain("guessed-secret");
  });

  it("the server serves on Postgres: get_job and cancel_job reach a job another replica runs", async () => {
    // Another replica (this test's process) runs a job of the stdio principal on the shared store.
    const pool = openPool(db.url, { max: 2, application: "tpu-mcp-other" });
    await migrate(pool);
    const other = await PgJobs.open(pool, "other:1", { leaseS: 3 * slowdown() });
    const config = writeConfig({ storage: { postgres: { url: db.url } } });
    let conn: Awaited<ReturnType<typeof connectStdio>> | undefined;
    try {
      const job = await other.start(
        "run_benchmark",
        "local-user",
        (signal) =>
          new Promise((_, reject) => signal.addEventListener("abort", () => reject(signal.reason))),
      );
      conn = await connectStdio(config);
      const got = await conn.client.callTool({
        name: "get_job",
        arguments: { job_id: job.job_id },
      });
      expect(got.isError).toBeFalsy();
      expect(got.structuredContent).toMatchObject({ job_id: job.job_id, status: "running" });
      // What the tool shows of a job is the job, not the store's bookkeeping (its owner).
      expect(got.structuredContent).not.toHaveProperty("owner");
      const cancelled = await conn.client.callTool({
        name: "cancel_job",
        arguments: { job_id: job.job_id },
      });
      expect(cancelled.isError).toBeFalsy();
      // The cancel is the store's flag: the owner aborts the job at its next renewal.
      await other.settled(job.job_id);
      expect((await other.get(job.job_id, "local-user"))!.status).toBe("cancelled");
      const missing = await conn.client.callTool({
        name: "get_job",
        arguments: { job_id: `job_${"0".repeat(24)}` },
      });
      expect(missing.isError).toBe(true);
      expect(JSON.stringify(missing.content)).toMatch(/job_not_found/);
    } finally {
      await conn?.close();
      await other.close();
      await pool.end();
    }
  });
});
