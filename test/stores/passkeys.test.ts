// The passkey store on SQLite: the shared contract (server/stores/passkeys/contract.ts, also run
// on Postgres by test/postgres/contracts.test.ts), then what only the SQLite file promises.
import Database from "better-sqlite3";
import { afterAll, describe, expect, it } from "vitest";
import { passkeysContract } from "../../server/stores/passkeys/contract.js";
import { SqlitePasskeys } from "../../server/stores/passkeys/sqlite.js";
import { openStoreDbReadOnly } from "../../policies/sqlite.js";
import { FakeClock, tempDir } from "../policies/helpers.js";

const tmp = tempDir();
afterAll(() => tmp.cleanup());

const newFile = (tag: string) => tmp.file(`${tag}-${Math.random().toString(36).slice(2)}.db`);

passkeysContract("sqlite", async () => {
  // One clock for every handle on the file: the server's and the CLI's read the same time.
  const clock = new FakeClock();
  const file = newFile("pk");
  const opened: SqlitePasskeys[] = [];
  const make = () => {
    const store = new SqlitePasskeys(file, { clock: clock.now });
    opened.push(store);
    return store;
  };
  return {
    store: make(),
    advance: (ms) => clock.advance(ms),
    another: async () => make(),
    close: async () => opened.forEach((s) => s.close()),
  };
});

describe("SqlitePasskeys: the file", () => {
  it("keeps credentials and counters across a reopen", async () => {
    const file = newFile("re");
    const store = new SqlitePasskeys(file);
    const { code } = await store.createEnrolmentCode("dave", 600);
    await store.addCredential(
      {
        id: "cred-dave",
        operator: "dave",
        public_key: new Uint8Array([1]),
        counter: 0,
        transports: [],
        aaguid: "00000000-0000-0000-0000-000000000000",
        rp_id: "localhost",
      },
      { code },
    );
    await store.advanceCounter("cred-dave", 5);
    store.close();
    const again = new SqlitePasskeys(file);
    expect((await again.get("cred-dave"))!.counter).toBe(5);
    again.close();
  });

  it("a read-only handle on a store from before passkeys answers as an empty one", async () => {
    const file = newFile("old");
    const db = new Database(file);
    db.exec("CREATE TABLE other (x)");
    db.close();
    const ro = openStoreDbReadOnly(file)!;
    const store = new SqlitePasskeys(ro);
    expect(await store.list()).toEqual([]);
    expect(await store.activeCount()).toBe(0);
    expect(await store.get("x")).toBeUndefined();
    expect(await store.removeOperator("x")).toBe(0);
    store.close();
    ro.close();
  });
});
