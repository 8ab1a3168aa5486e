// The approval queue on SQLite: the shared contract (server/stores/approvals/contract.ts, also
// run on Postgres by test/postgres/contracts.test.ts), then what only the SQLite file promises.
import { afterAll, describe, expect, it } from "vitest";
import { approvalsContract } from "../../server/stores/approvals/contract.js";
import { SqliteApprovalQueue } from "../../server/stores/approvals/sqlite.js";
import { FakeClock, tempDir } from "../policies/helpers.js";

const tmp = tempDir();
afterAll(() => tmp.cleanup());

const newFile = (tag: string) => tmp.file(`${tag}-${Math.random().toString(36).slice(2)}.db`);

approvalsContract("sqlite", async ({ keepDecidedS }) => {
  // One clock for every handle on the file: the server's and the CLI's read the same time.
  const clock = new FakeClock();
  const file = newFile("a");
  const opened: SqliteApprovalQueue[] = [];
  const make = (opts: { keepDecidedS?: number }) => {
    const store = new SqliteApprovalQueue(file, { clock: clock.now, ...opts });
    opened.push(store);
    return store;
  };
  return {
    store: make({ keepDecidedS }),
    advance: (ms) => clock.advance(ms),
    another: async (opts = {}) => make(opts),
    close: async () => opened.forEach((s) => s.close()),
  };
});

describe("SqliteApprovalQueue: the file", () => {
  it("reads one page through an index, never the whole table", () => {
    const store = new SqliteApprovalQueue(newFile("q"));
    const db = (store as any).db;
    const plan = (sql: string) =>
      (db.prepare(`EXPLAIN QUERY PLAN ${sql}`).all({ now: 0, limit: 1, offset: 0 }) as any[])
        .map((r) => r.detail)
        .join("; ");
    expect(
      plan(
        "SELECT * FROM approvals WHERE status = 'pending' AND expires_ms > @now ORDER BY expires_ms ASC, rowid ASC LIMIT @limit OFFSET @offset",
      ),
    ).toMatch(/USING INDEX approvals_open/);
    store.close();
  });
});
