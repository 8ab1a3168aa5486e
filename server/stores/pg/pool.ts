// The Postgres connection: one pool per process on the `pg` client, from `storage.postgres.url`
// or TPU_MCP_DATABASE_URL. The URL carries the password, so it is never logged, audited or put
// in an error: everything that names the database names redactUrl(url).
import pg from "pg";

export type PgPool = pg.Pool;
export type PgClient = pg.PoolClient;

/** The database's clock in epoch ms: one clock for every replica (theirs may disagree). */
export const NOW_MS = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

/** The URL with its password (and a `password` query parameter) replaced by "***". */
export function redactUrl(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = "***";
    if (u.searchParams.has("password")) u.searchParams.set("password", "***");
    return u.toString();
  } catch {
    return "(an unparsable database URL)";
  }
}

/** An error from the driver with the password removed wherever it was echoed. */
export function redactError(e: unknown, url: string): Error {
  let msg = e instanceof Error ? e.message : String(e);
  try {
    const pw = decodeURIComponent(new URL(url).password);
    if (pw) msg = msg.split(pw).join("***");
  } catch {
    // unparsable: nothing to take out
  }
  msg = msg.split(url).join(redactUrl(url));
  const out = new Error(msg);
  const code = (e as { code?: string })?.code;
  if (code) (out as Error & { code?: string }).code = code;
  return out;
}

export function openPool(url: string, opts: { max?: number; application?: string } = {}): PgPool {
  const pool = new pg.Pool({
    connectionString: url,
    max: opts.max ?? 10,
    application_name: opts.application ?? "tpu-mcp",
    // A replica that cannot reach the database says so instead of hanging its callers.
    connectionTimeoutMillis: 10_000,
  });
  // An idle client's error (the server restarted) must not crash the process; the next query
  // gets a fresh connection.
  pool.on("error", () => {});
  return pool;
}

/** Runs `fn` in one transaction on one connection: committed if it returns, rolled back if it throws. */
export async function inTransaction<T>(pool: PgPool, fn: (c: PgClient) => Promise<T>): Promise<T> {
  const c = await pool.connect();
  try {
    await c.query("BEGIN");
    const out = await fn(c);
    await c.query("COMMIT");
    return out;
  } catch (e) {
    await c.query("ROLLBACK").catch(() => {});
    throw e;
  } finally {
    c.release();
  }
}
