// The audit trail on SQLite: the shared contract (server/stores/audit/contract.ts, also run on
// Postgres by test/postgres/contracts.test.ts), then what only the SQLite file and the key file
// promise: the key file's mode, a rollback of the file, and a trail from before the key.
import { chmodSync, copyFileSync, readFileSync, rmSync, statSync } from "node:fs";
import Database from "better-sqlite3";
import { afterAll, describe, expect, it } from "vitest";
import { SqliteAuditTrail } from "../../server/stores/audit/sqlite.js";
import { type AuditRecord } from "../../policies/audit.js";
import { chainHash, GENESIS_HASH } from "../../policies/audit_chain.js";
import { loadOrCreateAuditKey, readAuditKey } from "../../policies/audit_key.js";
import { canonicalJson } from "../../policies/digest.js";
import { auditContract, type RawAuditRow } from "../../server/stores/audit/contract.js";
import { captureLogger, tempDir } from "../policies/helpers.js";

const tmp = tempDir();
afterAll(() => tmp.cleanup());

const rec = (i: number, over: Partial<AuditRecord> = {}): AuditRecord => ({
  time: new Date(Date.UTC(2025, 0, 1, 0, 0, i)).toISOString(),
  principal: "agent",
  tool: "run_inference",
  args_digest: "ab".repeat(32),
  args: { model: "tiny-gpt2", texts: { redacted: true, count: 1 } },
  estimate: null,
  outcome: "executed",
  duration_ms: i,
  ...over,
});

function raw(file: string, fn: (db: Database.Database) => void) {
  const db = new Database(file);
  try {
    fn(db);
  } finally {
    db.close();
  }
}

auditContract("sqlite", async () => {
  const file = tmp.file(`audit-${Math.random().toString(36).slice(2)}.db`);
  const opened: SqliteAuditTrail[] = [];
  return {
    trail: async (opts = {}) => {
      const log = new SqliteAuditTrail(file, opts);
      opened.push(log);
      return log;
    },
    raw: {
      rows: async () => {
        let out: RawAuditRow[] = [];
        raw(file, (db) => {
          out = db
            .prepare("SELECT seq, record, prev_hash, hash FROM audit_log ORDER BY seq")
            .all() as RawAuditRow[];
        });
        return out;
      },
      update: async (r) =>
        raw(file, (db) =>
          db
            .prepare("UPDATE audit_log SET record = ?, prev_hash = ?, hash = ? WHERE seq = ?")
            .run(r.record, r.prev_hash, r.hash, r.seq),
        ),
      remove: async (from, to = Number.MAX_SAFE_INTEGER) =>
        raw(file, (db) =>
          db.prepare("DELETE FROM audit_log WHERE seq BETWEEN ? AND ?").run(from, to),
        ),
      replace: async (rows) =>
        raw(file, (db) => {
          db.prepare("DELETE FROM audit_log").run();
          const put = db.prepare(
            "INSERT INTO audit_log (seq, record, prev_hash, hash) VALUES (?, ?, ?, ?)",
          );
          for (const r of rows) put.run(r.seq, r.record, r.prev_hash, r.hash);
        }),
      setHead: async (h) =>
        raw(file, (db) => {
          db.prepare("UPDATE audit_head SET seq = ?, hash = ?").run(h.seq, h.hash);
          if (h.mac !== undefined) db.prepare("UPDATE audit_head SET mac = ?").run(h.mac);
        }),
      wipe: async () =>
        raw(file, (db) => db.exec("DELETE FROM audit_log; DELETE FROM audit_head;")),
    },
    close: async () => opened.forEach((l) => l.close()),
  };
});

/** A log keyed with a real key file; records 2..n+1 follow the chain_keyed record. */
function keyedLog(n: number) {
  const file = tmp.file(`keyed-${Math.random().toString(36).slice(2)}.db`);
  const keyFile = tmp.file(`keyed-${Math.random().toString(36).slice(2)}.key`);
  const { key, created } = loadOrCreateAuditKey(keyFile);
  const logger = captureLogger();
  const log = new SqliteAuditTrail(file, { key, keyCreated: created, logger });
  for (let i = 1; i <= n; i++) log.append(rec(i));
  return { file, keyFile, key, log, logger };
}

describe("SqliteAuditTrail: the file and the key file", () => {
  it("makes a 0600 key file and starts the trail with a chain_keyed record", async () => {
    const { keyFile, key, log } = keyedLog(3);
    expect(statSync(keyFile).mode & 0o777).toBe(0o600);
    expect(readFileSync(keyFile, "utf8")).toContain(key.key.toString("hex"));
    expect((await log.tail(10))[0]).toMatchObject({
      seq: 1,
      outcome: "chain_keyed",
      key_id: key.id,
    });
    expect(await log.verify()).toMatchObject({ ok: true, checked: 4 });
    expect(await log.head()).toMatchObject({ seq: 4, key_id: key.id, time: rec(3).time });
    // Reading the same key again gives the same key, not a new one.
    expect(loadOrCreateAuditKey(keyFile)).toMatchObject({ created: false, key: { id: key.id } });
    log.close();
  });

  it("catches a rollback followed by new appends past the exported head (same seq, other hash)", async () => {
    const { file, key, log } = keyedLog(3);
    log.close();
    const old = `${file}.old`;
    copyFileSync(file, old); // a consistent copy (what a backup or an attacker keeps)
    const live = new SqliteAuditTrail(file, { key, keyCreated: false, logger: captureLogger() });
    live.append(rec(4));
    live.append(rec(5));
    const exported = await live.head();
    expect((await live.verify({ head: exported })).ok).toBe(true);
    live.close();
    // Rolled back, then written on: the trail reaches the exported seq again, with other records.
    for (const f of [`${file}-wal`, `${file}-shm`]) rmSync(f, { force: true });
    copyFileSync(old, file);
    const again = new SqliteAuditTrail(file, { key, keyCreated: false, logger: captureLogger() });
    for (let i = 0; i < 3; i++) await again.append(rec(20 + i, { principal: "after-rollback" }));
    expect((await again.head()).seq).toBeGreaterThan(exported.seq);
    expect((await again.verify()).ok).toBe(true); // consistent on its own...
    const v = await again.verify({ head: exported }); // ...but not the trail the operator exported
    expect(v.ok).toBe(false);
    again.close();
  });

  it("migrates an unkeyed trail: its records stay verifiable and are pinned by the key", async () => {
    const file = tmp.file(`legacy-${Math.random().toString(36).slice(2)}.db`);
    // Written as before the key existed.
    raw(file, async (db) => {
      db.exec(`CREATE TABLE audit_log (seq INTEGER PRIMARY KEY, record TEXT NOT NULL,
        prev_hash TEXT NOT NULL, hash TEXT NOT NULL);
        CREATE TABLE audit_head (id INTEGER PRIMARY KEY CHECK (id = 1), seq INTEGER NOT NULL,
        hash TEXT NOT NULL);`);
      let prev = GENESIS_HASH;
      for (let i = 1; i <= 3; i++) {
        const r = JSON.parse(canonicalJson(rec(i)));
        const hash = chainHash(prev, i, r);
        db.prepare("INSERT INTO audit_log VALUES (?, ?, ?, ?)").run(
          i,
          canonicalJson(r),
          prev,
          hash,
        );
        prev = hash;
      }
      db.prepare("INSERT INTO audit_head VALUES (1, 3, ?)").run(prev);
    });
    // Before the first start with a key, verify works without one (and says it is not keyed).
    const before = new SqliteAuditTrail(file, { key: null });
    expect(await before.verify()).toMatchObject({ ok: true, checked: 3 });
    expect((await before.verify()).reason).toMatch(/not keyed/);
    before.close();
    const keyFile = tmp.file(`legacy-${Math.random().toString(36).slice(2)}.key`);
    const { key, created } = loadOrCreateAuditKey(keyFile);
    const log = new SqliteAuditTrail(file, { key, keyCreated: created });
    log.append(rec(4));
    expect((await log.tail(2))[0]).toMatchObject({ seq: 4, outcome: "chain_keyed" });
    const v = await log.verify();
    expect(v).toMatchObject({ ok: true, checked: 5 });
    expect(v.reason).toMatch(/records 1..3 predate the key and are pinned by record 4/);
    // Rewriting a pre-key record (and its unkeyed chain) now shows at the chain_keyed record.
    raw(file, async (db) => {
      db.prepare(
        "UPDATE audit_log SET record = replace(record, 'agent', 'nobody') WHERE seq = 2",
      ).run();
      const rows = db.prepare("SELECT * FROM audit_log WHERE seq <= 3 ORDER BY seq").all() as any[];
      let prev = GENESIS_HASH;
      for (const r of rows) {
        const h = chainHash(prev, r.seq, JSON.parse(r.record));
        db.prepare("UPDATE audit_log SET prev_hash = ?, hash = ? WHERE seq = ?").run(
          prev,
          h,
          r.seq,
        );
        prev = h;
      }
    });
    expect(await log.verify()).toMatchObject({ ok: false, first_bad_seq: 4 });
    log.close();
  });

  it("refuses a key file others can read", async () => {
    const { keyFile, log } = keyedLog(2);
    log.close();
    chmodSync(keyFile, 0o644);
    expect(() => readAuditKey(keyFile)).toThrow(/chmod 600/);
  });
});
