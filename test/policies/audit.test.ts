import { chmodSync, copyFileSync, readFileSync, rmSync, statSync } from "node:fs";
import Database from "better-sqlite3";
import { afterAll, describe, expect, it } from "vitest";
import { SqliteAuditLog, type AuditRecord } from "../../policies/audit.js";
import { chainHash, GENESIS_HASH, headMac, keyedChainHash } from "../../policies/audit_chain.js";
import { redactArgs } from "../../policies/audit_record.js";
import { loadOrCreateAuditKey, readAuditKey } from "../../policies/audit_key.js";
import { canonicalJson } from "../../policies/digest.js";
import { captureLogger, tempDir } from "./helpers.js";

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

function filled(n: number) {
  const file = tmp.file(`audit-${Math.random().toString(36).slice(2)}.db`);
  const logger = captureLogger();
  const log = new SqliteAuditLog(file, { logger });
  for (let i = 1; i <= n; i++) log.append(rec(i));
  return { file, log, logger };
}

describe("SqliteAuditLog", () => {
  it("chains records and emits each as one log line", async () => {
    const { log, logger } = filled(5);
    const tail = await log.tail(2);
    expect(tail.map((r) => r.seq)).toEqual([4, 5]);
    expect(tail[1]!.prev_hash).toBe(tail[0]!.hash);
    expect(await log.verify()).toEqual({
      ok: true,
      checked: 5,
      reason: "5 records chain correctly",
    });
    expect(logger.lines).toHaveLength(5);
    expect(logger.lines[0]!.obj).toMatchObject({ audit: { seq: 1, outcome: "executed" } });
    log.close();
  });

  it("detects an edited record at its seq", async () => {
    const { file, log } = filled(5);
    const raw = new Database(file);
    raw
      .prepare(
        "UPDATE audit_log SET record = replace(record, '\"agent\"', '\"someone-else\"') WHERE seq = 3",
      )
      .run();
    raw.close();
    expect(await log.verify()).toMatchObject({ ok: false, checked: 2, first_bad_seq: 3 });
    log.close();
  });

  it("detects a deleted record", async () => {
    const { file, log } = filled(5);
    const raw = new Database(file);
    raw.prepare("DELETE FROM audit_log WHERE seq = 2").run();
    raw.close();
    const v = await log.verify();
    expect(v).toMatchObject({ ok: false, first_bad_seq: 2 });
    expect(v.reason).toMatch(/missing/);
    log.close();
  });

  it("detects records removed from the end", async () => {
    const { file, log } = filled(5);
    const raw = new Database(file);
    raw.prepare("DELETE FROM audit_log WHERE seq >= 4").run();
    raw.close();
    expect(await log.verify()).toMatchObject({ ok: false, first_bad_seq: 4 });
    log.close();
  });

  it("detects reordered records", async () => {
    const { file, log } = filled(5);
    const raw = new Database(file);
    const a = raw.prepare("SELECT * FROM audit_log WHERE seq = 2").get() as Record<string, unknown>;
    const b = raw.prepare("SELECT * FROM audit_log WHERE seq = 3").get() as Record<string, unknown>;
    const put = raw.prepare(
      "UPDATE audit_log SET record = ?, prev_hash = ?, hash = ? WHERE seq = ?",
    );
    put.run(b.record, b.prev_hash, b.hash, 2);
    put.run(a.record, a.prev_hash, a.hash, 3);
    raw.close();
    expect(await log.verify()).toMatchObject({ ok: false, first_bad_seq: 2 });
    log.close();
  });

  it("keeps the chain across reopening and across two handles", async () => {
    const { file, log, key } = keyedLog(2);
    const other = new SqliteAuditLog(file, { key });
    other.append(rec(3, { outcome: "approval_granted", approver: "operator" }));
    log.append(rec(4));
    log.close();
    other.close();
    const reopened = new SqliteAuditLog(file, { key });
    expect(await reopened.verify()).toMatchObject({ ok: true, checked: 5 });
    expect((await reopened.tail(10)).map((r) => r.outcome)).toEqual([
      "chain_keyed",
      "executed",
      "executed",
      "approval_granted",
      "executed",
    ]);
    reopened.close();
  });
});

/** A log keyed with a real key file; records 2..n+1 follow the chain_keyed record. */
function keyedLog(n: number) {
  const file = tmp.file(`keyed-${Math.random().toString(36).slice(2)}.db`);
  const keyFile = tmp.file(`keyed-${Math.random().toString(36).slice(2)}.key`);
  const { key, created } = loadOrCreateAuditKey(keyFile);
  const logger = captureLogger();
  const log = new SqliteAuditLog(file, { key, keyCreated: created, logger });
  for (let i = 1; i <= n; i++) log.append(rec(i));
  return { file, keyFile, key, log, logger };
}

function raw(file: string, fn: (db: Database.Database) => void) {
  const db = new Database(file);
  try {
    fn(db);
  } finally {
    db.close();
  }
}

/** Recomputes the whole chain from seq `from` with the unkeyed hash, as a tamperer would. */
function recomputeUnkeyed(db: Database.Database, from = 1) {
  const rows = db.prepare("SELECT * FROM audit_log WHERE seq >= ? ORDER BY seq").all(from) as any[];
  let prev =
    from === 1
      ? GENESIS_HASH
      : (db.prepare("SELECT hash FROM audit_log WHERE seq = ?").get(from - 1) as any).hash;
  for (const r of rows) {
    const hash = chainHash(prev, r.seq, JSON.parse(r.record));
    db.prepare("UPDATE audit_log SET prev_hash = ?, hash = ? WHERE seq = ?").run(prev, hash, r.seq);
    prev = hash;
  }
  db.prepare("UPDATE audit_head SET seq = (SELECT max(seq) FROM audit_log), hash = ?").run(prev);
}

describe("keyed audit chain (HMAC, key outside the database)", () => {
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

  it("detects records truncated from the end with the head row rewritten to match", async () => {
    const { file, log } = keyedLog(6);
    const exported = await log.head();
    raw(file, async (db) => {
      const h3 = (db.prepare("SELECT hash FROM audit_log WHERE seq = 4").get() as any).hash;
      db.prepare("DELETE FROM audit_log WHERE seq > 4").run();
      db.prepare("UPDATE audit_head SET seq = 4, hash = ?").run(h3);
    });
    const v = await log.verify();
    expect(v).toMatchObject({ ok: false, first_bad_seq: 4 });
    expect(v.reason).toMatch(/head row was rewritten/);
    // The head an operator exported before also shows it, naming the missing records.
    const w = await log.verify({ head: exported });
    expect(w.ok).toBe(false);
    log.close();
  });

  it("detects a wiped trail (every row, the head too) against the key", async () => {
    const { file, log, key } = keyedLog(4);
    raw(file, (db) => db.exec("DELETE FROM audit_log; DELETE FROM audit_head;"));
    const v = await log.verify();
    expect(v.ok).toBe(false);
    expect(v.reason).toMatch(/trail is empty, but the key .* exists/);
    // A restart on the wiped database says so at once, and the trail stays flagged.
    const logger = captureLogger();
    const again = new SqliteAuditLog(file, { key, keyCreated: false, logger });
    expect(logger.lines.some((l) => l.level === "error" && /audit trail reset/.test(l.msg!))).toBe(
      true,
    );
    again.append(rec(9));
    expect(await again.verify()).toMatchObject({ ok: false });
    again.close();
    log.close();
  });

  it("detects an edited record whose chain was recomputed without the key", async () => {
    const { file, log } = keyedLog(5);
    raw(file, async (db) => {
      db.prepare(
        "UPDATE audit_log SET record = replace(record, '\"agent\"', '\"someone-else\"') WHERE seq = 3",
      ).run();
      recomputeUnkeyed(db, 3);
    });
    const v = await log.verify();
    expect(v).toMatchObject({ ok: false, first_bad_seq: 3 });
    expect(v.reason).toMatch(/HMAC does not match/);
    log.close();
  });

  it("detects an edited record whose chain was recomputed with a key of the tamperer's own", async () => {
    // The tamperer knows the algorithm (this very code) but not the key: a MAC that ignored its
    // key (a constant one) would verify this forgery.
    const { file, log } = keyedLog(5);
    const theirs = Buffer.alloc(32, 7);
    raw(file, async (db) => {
      db.prepare(
        "UPDATE audit_log SET record = replace(record, '\"agent\"', '\"someone-else\"') WHERE seq = 3",
      ).run();
      const rows = db.prepare("SELECT * FROM audit_log WHERE seq >= 3 ORDER BY seq").all() as any[];
      let prev = (db.prepare("SELECT hash FROM audit_log WHERE seq = 2").get() as any).hash;
      for (const r of rows) {
        const hash = keyedChainHash(theirs, prev, r.seq, JSON.parse(r.record));
        db.prepare("UPDATE audit_log SET prev_hash = ?, hash = ? WHERE seq = ?").run(
          prev,
          hash,
          r.seq,
        );
        prev = hash;
      }
      const last = rows[rows.length - 1].seq;
      db.prepare("UPDATE audit_head SET seq = ?, hash = ?, mac = ?").run(
        last,
        prev,
        headMac(theirs, last, prev),
      );
    });
    const v = await log.verify();
    expect(v).toMatchObject({ ok: false, first_bad_seq: 3 });
    expect(v.reason).toMatch(/HMAC does not match/);
    log.close();
  });

  it("catches a rollback followed by new appends past the exported head (same seq, other hash)", async () => {
    const { file, key, log } = keyedLog(3);
    log.close();
    const old = `${file}.old`;
    copyFileSync(file, old); // a consistent copy (what a backup or an attacker keeps)
    const live = new SqliteAuditLog(file, { key, keyCreated: false, logger: captureLogger() });
    live.append(rec(4));
    live.append(rec(5));
    const exported = await live.head();
    expect((await live.verify({ head: exported })).ok).toBe(true);
    live.close();
    // Rolled back, then written on: the trail reaches the exported seq again, with other records.
    for (const f of [`${file}-wal`, `${file}-shm`]) rmSync(f, { force: true });
    copyFileSync(old, file);
    const again = new SqliteAuditLog(file, { key, keyCreated: false, logger: captureLogger() });
    for (let i = 0; i < 3; i++) await again.append(rec(20 + i, { principal: "after-rollback" }));
    expect((await again.head()).seq).toBeGreaterThan(exported.seq);
    expect((await again.verify()).ok).toBe(true); // consistent on its own...
    const v = await again.verify({ head: exported }); // ...but not the trail the operator exported
    expect(v.ok).toBe(false);
    again.close();
  });

  it("detects a whole trail rewritten without the key (no chain_keyed record)", async () => {
    const { file, log } = keyedLog(3);
    raw(file, async (db) => {
      db.prepare("DELETE FROM audit_log WHERE seq = 1").run();
      db.prepare("UPDATE audit_log SET seq = seq - 1").run();
      recomputeUnkeyed(db, 1);
    });
    const v = await log.verify();
    expect(v.ok).toBe(false);
    expect(v.reason).toMatch(/no chain_keyed record for key/);
    log.close();
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
    const before = new SqliteAuditLog(file, { key: null });
    expect(await before.verify()).toMatchObject({ ok: true, checked: 3 });
    expect((await before.verify()).reason).toMatch(/not keyed/);
    before.close();
    const keyFile = tmp.file(`legacy-${Math.random().toString(36).slice(2)}.key`);
    const { key, created } = loadOrCreateAuditKey(keyFile);
    const log = new SqliteAuditLog(file, { key, keyCreated: created });
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

  it("refuses a different key, a missing key and a key file others can read", async () => {
    const { file, keyFile, log } = keyedLog(2);
    log.close();
    const other = loadOrCreateAuditKey(tmp.file(`other-${Math.random()}.key`)).key;
    expect(() => new SqliteAuditLog(file, { key: other })).toThrow(/holds key/);
    const keyless = new SqliteAuditLog(file, { key: null });
    expect((await keyless.verify()).reason).toMatch(/key file is missing: restore it/);
    await expect(keyless.append(rec(9))).rejects.toThrow(/read-only/);
    keyless.close();
    chmodSync(keyFile, 0o644);
    expect(() => readAuditKey(keyFile)).toThrow(/chmod 600/);
  });
});

describe("redactArgs", () => {
  it("replaces texts and tensors with length and shape summaries", () => {
    const out = redactArgs(
      {
        model: "m",
        texts: ["hello", "secret text"],
        tensors: [{ dtype: "float32", shape: [2, 3], data: [1, 2, 3, 4, 5, 6] }],
        nested: { texts: "abc" },
      },
      ["texts", "tensors"],
    );
    expect(out).toEqual({
      model: "m",
      texts: { redacted: true, count: 2, total_chars: 16 },
      tensors: { redacted: true, count: 1, items: [{ dtype: "float32", shape: [2, 3] }] },
      nested: { texts: { redacted: true, chars: 3 } },
    });
    expect(JSON.stringify(out)).not.toContain("secret");
  });
});
