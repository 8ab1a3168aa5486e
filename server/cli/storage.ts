// `tpu-mcp storage migrate | check`: the shared store's schema and health, before replicas start
// on it. migrate applies the migrations the database lacks (replicas also can, at start, under
// the same lock); check says whether the database is reachable, its schema is this code's, and
// how far this machine's clock is from the database's (the budget window and job leases run on
// the database's clock, so a replica whose clock is far off reads its own times wrongly).
// Nothing here prints the database's password: every URL and error passes redactUrl/redactError.
import type { Logger } from "pino";
import { openPool, redactError, redactUrl, type PgPool } from "../app/postgres/pool.js";
import { checkSchema, migrate, SCHEMA_VERSION } from "../app/postgres/schema.js";
import { databaseUrl } from "../app/storage.js";
import type { ServerConfig } from "../config/config.js";

interface Io {
  out: (s: string) => void;
  err: (s: string) => void;
  json: boolean;
  logger: Logger;
}

/** Clock skew above this is reported as a problem (the budget window is per second). */
export const MAX_SKEW_MS = 1000;

export interface StorageReport {
  backend: "sqlite" | "postgres";
  database?: string;
  reachable?: boolean;
  server_version?: string;
  schema_version?: number;
  code_schema_version: number;
  /** This machine's clock minus the database's, ms (half a round trip of uncertainty). */
  clock_skew_ms?: number;
  problems: string[];
}

/** What `storage check` and the doctor report: never throws, never names the password. */
export async function checkStorage(config: ServerConfig): Promise<StorageReport> {
  let url: string | null;
  try {
    url = databaseUrl(config);
  } catch (e) {
    return {
      backend: "postgres",
      code_schema_version: SCHEMA_VERSION,
      problems: [(e as Error).message],
    };
  }
  if (url === null) return { backend: "sqlite", code_schema_version: SCHEMA_VERSION, problems: [] };
  const report: StorageReport = {
    backend: "postgres",
    database: redactUrl(url),
    code_schema_version: SCHEMA_VERSION,
    problems: [],
  };
  const pool = openPool(url, { max: 1, application: "tpu-mcp storage check" });
  try {
    const before = Date.now();
    const r = await pool.query(
      "SELECT current_setting('server_version') AS v, extract(epoch from clock_timestamp()) * 1000 AS now_ms",
    );
    const after = Date.now();
    report.reachable = true;
    report.server_version = r.rows[0].v;
    report.clock_skew_ms = Math.round((before + after) / 2 - Number(r.rows[0].now_ms));
    if (Math.abs(report.clock_skew_ms) > MAX_SKEW_MS)
      report.problems.push(
        `this machine's clock is ${report.clock_skew_ms} ms off the database's (more than ${MAX_SKEW_MS} ms): sync it (chrony, systemd-timesyncd)`,
      );
    try {
      report.schema_version = await checkSchema(pool);
    } catch (e) {
      report.problems.push(redactError(e, url).message);
    }
  } catch (e) {
    report.reachable = false;
    report.problems.push(`cannot reach ${redactUrl(url)}: ${redactError(e, url).message}`);
  } finally {
    await pool.end();
  }
  return report;
}

export async function runStorageCommand(
  config: ServerConfig,
  positionals: string[],
  io: Io,
): Promise<number> {
  const [sub] = positionals;
  if (sub === "check") {
    const r = await checkStorage(config);
    if (io.json) io.out(JSON.stringify(r, null, 2));
    else if (r.backend === "sqlite")
      io.out(`storage: sqlite in ${config.paths.data_dir} (nothing shared to check)`);
    else {
      io.out(`storage: postgres ${r.database ?? ""}`);
      if (r.reachable)
        io.out(
          `  reachable (PostgreSQL ${r.server_version}); schema ${r.schema_version ?? "?"} (this code: ${r.code_schema_version}); clock skew ${r.clock_skew_ms} ms`,
        );
      for (const p of r.problems) io.out(`  problem: ${p}`);
    }
    return r.problems.length === 0 ? 0 : 1;
  }
  if (sub === "migrate") {
    let url: string | null;
    try {
      url = databaseUrl(config);
    } catch (e) {
      io.err((e as Error).message);
      return 2;
    }
    if (url === null) {
      io.out("storage: sqlite (the server makes its schema at start; nothing to migrate)");
      return 0;
    }
    const pool: PgPool = openPool(url, { max: 1, application: "tpu-mcp storage migrate" });
    try {
      const applied = await migrate(pool);
      io.out(
        applied.length
          ? `migrated ${redactUrl(url)} to schema ${SCHEMA_VERSION} (applied ${applied.join(", ")})`
          : `${redactUrl(url)} is at schema ${SCHEMA_VERSION}: nothing to apply`,
      );
      return 0;
    } catch (e) {
      io.err(`storage migrate: ${redactError(e, url).message}`);
      return 1;
    } finally {
      await pool.end();
    }
  }
  io.err("usage: tpu-mcp storage migrate | check [--json] [--config FILE]");
  return 2;
}
