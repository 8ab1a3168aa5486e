// The transaction a Postgres store's query joins, when there is one: a write made "alongside"
// another store's (the call's calls_in_flight row with its audit record, policies/audit.ts
// `Alongside`) takes no connection parameter, so the store that opens the transaction runs the
// callback inside `withClient(c, fn)` and every store's `queryable(pool)` answers that client.
// Outside one, the pool (each query its own transaction).
import { AsyncLocalStorage } from "node:async_hooks";
import type { PgClient, PgPool } from "./pool.js";

const current = new AsyncLocalStorage<PgClient>();

/** Runs `fn` with `c` as the connection every store's queries join. */
export function withClient<T>(c: PgClient, fn: () => T): T {
  return current.run(c, fn);
}

/** The connection of the transaction in progress, else the pool. */
export function queryable(pool: PgPool): PgPool | PgClient {
  return current.getStore() ?? pool;
}

/** The connection of the transaction in progress (null outside one). */
export function currentClient(): PgClient | null {
  return current.getStore() ?? null;
}
