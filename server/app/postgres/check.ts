// The shared store's health, for `tpu-mcp storage check` and the doctor: reachable, its schema
// this code's, and this machine's clock against the database's (the budget window and job leases
// run on the database's clock, so a replica whose clock is far off reads its own times wrongly).
// Never throws, never names the password.
import type { ServerConfig } from "../../config/config.js";
import { databaseUrl } from "../storage.js";
import { openPool, redactError, redactUrl } from "../../stores/pg/pool.js";
import { checkSchema, SCHEMA_VERSION } from "./schema.js";

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
