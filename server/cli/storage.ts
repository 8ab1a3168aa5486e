// `tpu-mcp storage migrate | check`: the shared store's schema and health, before replicas start
// on it. migrate applies the migrations the database lacks (under one lock, however many run);
// check is server/app/postgres/check.ts.
// Nothing here prints the database's password: every URL and error passes redactUrl/redactError.
import type { Logger } from "pino";
import { checkStorage } from "../app/postgres/check.js";
import { openPool, redactError, redactUrl, type PgPool } from "../stores/pg/pool.js";
import { migrate, SCHEMA_VERSION } from "../app/postgres/schema.js";
import { databaseUrl } from "../app/storage.js";
import type { ServerConfig } from "../config/config.js";

interface Io {
  out: (s: string) => void;
  err: (s: string) => void;
  json: boolean;
  logger: Logger;
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
