// Incremental verification from a MAC'd checkpoint (policies/audit_verify.ts): a server verifies
// only the records after the checkpoint, a bounded number per event-loop turn; a checkpoint
// written without the key is caught; records changed before the checkpoint are the full pass's
// to catch.
import Database from "better-sqlite3";
import { afterAll, describe, expect, it } from "vitest";
import { SqliteAuditTrail } from "../../server/stores/audit/sqlite.js";
import { type AuditRecord } from "../../policies/audit.js";
import { loadOrCreateAuditKey } from "../../policies/audit_key.js";
import { AuditVerifier } from "../../policies/audit_verify.js";
import { tempDir } from "./helpers.js";

const tmp = tempDir();
afterAll(() => tmp.cleanup());

const rec = (i: number): AuditRecord => ({
  time: new Date(Date.UTC(2025, 0, 1, 0, 0, i % 60)).toISOString(),
  principal: "agent",
  tool: "run_inference",
  args_digest: "ab".repeat(32),
  outcome: "executed",
  duration_ms: i,
});

/** A keyed trail of n records (plus chain_keyed), and a counter of records hashed per step. */
function trail(n: number) {
  const file = tmp.file(`verify-${Math.random().toString(36).slice(2)}.db`);
  const { key } = loadOrCreateAuditKey(tmp.file(`key-${Math.random().toString(36).slice(2)}`));
  const steps: number[] = [];
  const open = () => new SqliteAuditTrail(file, { key, onRowsHashed: (rows) => steps.push(rows) });
  const log = new SqliteAuditTrail(file, { key, keyCreated: true });
  for (let i = 1; i <= n; i++) log.append(rec(i));
  log.close();
  return { file, open, steps };
}

/**
 * A trail of 300 verified records and 5 appended after the checkpoint, with a raw handle on its
 * database (for forging the checkpoint) and the last record's seq and hash.
 */
async function verifiedThenAppended() {
  const t = trail(300);
  const log = t.open();
  await new AuditVerifier(log, { chunkRows: 64 }).run();
  for (let i = 0; i < 5; i++) log.append(rec(i));
  const db = new Database(t.file);
  const last = db.prepare("SELECT seq, hash FROM audit_log ORDER BY seq DESC LIMIT 1").get() as {
    seq: number;
    hash: string;
  };
  return { log, db, last };
}

describe("AuditVerifier", () => {
  it("verifies in bounded steps, stores a checkpoint, then verifies only the newer records", async () => {
    const t = trail(1000);
    const log = t.open();
    const v = new AuditVerifier(log, { chunkRows: 100 });
    expect(await v.status()).toMatchObject({ ok: true, verified_seq: 0, head_seq: 1001 });
    const done = await v.run();
    expect(done).toMatchObject({ ok: true, checked: 1001, verified_seq: 1001, in_progress: false });
    expect(done.verified_at).toMatch(/^\d{4}-/);
    expect(Math.max(...t.steps)).toBeLessThanOrEqual(100);
    expect(t.steps.reduce((a, b) => a + b, 0)).toBe(1001);

    for (let i = 0; i < 30; i++) log.append(rec(i));
    t.steps.length = 0;
    // A new verifier (a restarted server) starts from the stored checkpoint.
    const again = new AuditVerifier(log, { chunkRows: 100 });
    expect(await again.status()).toMatchObject({ ok: true, verified_seq: 1001, head_seq: 1031 });
    expect(await again.run()).toMatchObject({ ok: true, verified_seq: 1031 });
    expect(t.steps.reduce((a, b) => a + b, 0)).toBe(30);
    log.close();
  });

  it("catches a checkpoint written without the key, and so does the full verify", async () => {
    // Someone who can write the database moves the checkpoint past records not yet verified.
    const { log, db, last } = await verifiedThenAppended();
    db.prepare("UPDATE audit_checkpoint SET seq = ?, hash = ?, verified_at = ?").run(
      last.seq,
      last.hash,
      "2030-01-01T00:00:00.000Z",
    );
    db.close();
    const v = new AuditVerifier(log);
    expect(await v.status()).toMatchObject({ ok: false });
    expect((await v.status()).reason).toMatch(/checkpoint.*MAC/);
    expect(await v.run()).toMatchObject({ ok: false });
    expect(await log.verify()).toMatchObject({ ok: false });
    expect((await log.verify()).reason).toMatch(/checkpoint/);
    log.close();
  });

  it("leaves records changed before the checkpoint to the full verify, which catches them", async () => {
    const t = trail(200);
    const log = t.open();
    await new AuditVerifier(log).run();
    const db = new Database(t.file);
    const row = db.prepare("SELECT record FROM audit_log WHERE seq = 50").get() as {
      record: string;
    };
    db.prepare("UPDATE audit_log SET record = ? WHERE seq = 50").run(
      row.record.replace('"agent"', '"mallory"'),
    );
    db.close();
    log.append(rec(1));
    t.steps.length = 0;
    // The incremental pass reads only record 202: it cannot see the change at 50 ...
    expect(await new AuditVerifier(log).run()).toMatchObject({ ok: true, verified_seq: 202 });
    expect(t.steps.reduce((a, b) => a + b, 0)).toBe(1);
    // ... the full pass (tpu-mcp audit verify) does.
    expect(await log.verify()).toMatchObject({ ok: false, first_bad_seq: 50 });
    log.close();
  });

  it("reports a record removed after the checkpoint", async () => {
    const t = trail(100);
    const log = t.open();
    await new AuditVerifier(log).run();
    for (let i = 0; i < 10; i++) log.append(rec(i));
    const db = new Database(t.file);
    db.prepare("DELETE FROM audit_log WHERE seq = 105").run();
    db.close();
    expect(await new AuditVerifier(log).run()).toMatchObject({ ok: false, first_bad_seq: 105 });
    log.close();
  });
});

describe("the checkpoint and the full verify (issue 33)", () => {
  it("a full verify compares the trail with the checkpoint: a partial rollback is caught", async () => {
    const t = trail(100);
    const log = t.open();
    // What a backup (or an attacker) kept at record 101: its rows and its head, MAC'd by the server.
    const db = new Database(t.file);
    const head = db.prepare("SELECT * FROM audit_head").get() as Record<string, unknown>;
    db.close();
    for (let i = 0; i < 50; i++) log.append(rec(i));
    expect(await new AuditVerifier(log).run()).toMatchObject({ ok: true, verified_seq: 151 });
    // Rolled back to the backup: the records after it gone, the head restored. Consistent on its
    // own, but the checkpoint says record 151 was verified.
    const raw = new Database(t.file);
    raw.prepare("DELETE FROM audit_log WHERE seq > 101").run();
    const cols = Object.keys(head);
    raw.prepare(`UPDATE audit_head SET ${cols.map((c) => `${c} = @${c}`).join(", ")}`).run(head);
    raw.close();
    const v = await log.verify();
    expect(v).toMatchObject({ ok: false, first_bad_seq: 151 });
    expect(v.reason).toMatch(/differs from the verification checkpoint/);
    log.close();
  });

  it("the checkpoint's MAC covers its seq and hash: moving only those is caught", async () => {
    // The checkpoint moved past records not yet verified, its verified_at and MAC left as they were.
    const { log, db, last } = await verifiedThenAppended();
    db.prepare("UPDATE audit_checkpoint SET seq = ?, hash = ?").run(last.seq, last.hash);
    db.close();
    expect((await log.readCheckpoint()).forged?.reason).toMatch(/checkpoint.*MAC/);
    const v = new AuditVerifier(log);
    expect(await v.status()).toMatchObject({ ok: false });
    expect(await log.verify()).toMatchObject({ ok: false });
    log.close();
  });

  it("a long pass stores its checkpoint every checkpointEvery records, before its end", async () => {
    const t = trail(1000);
    const log = t.open();
    const v = new AuditVerifier(log, { chunkRows: 100, checkpointEvery: 200 });
    // The pass is stopped (a server shutting down) after about half the trail.
    const stopAt = t.steps.length + 5;
    const stopping = setInterval(() => t.steps.length >= stopAt && v.close(), 0);
    try {
      await v.run();
    } finally {
      clearInterval(stopping);
    }
    const cp = (await log.readCheckpoint()).checkpoint;
    expect(cp?.seq).toBeGreaterThanOrEqual(200);
    expect(cp?.seq).toBeLessThan(1001);
    log.close();
  });
});

describe("SqliteAuditTrail.search (the console's audit page)", () => {
  it("returns the first matches, oldest first, among the last `window` records", async () => {
    const t = trail(0);
    const log = t.open();
    for (let i = 1; i <= 300; i++)
      log.append({
        ...rec(i),
        principal: i % 3 ? "agent" : "reader",
        outcome: i % 2 ? "executed" : "allowed",
      });
    const window = await log.tail(100);
    expect(await log.search({ window: 100, limit: 10 })).toEqual({
      records: window.slice(0, 10),
      scanned: 100,
    });
    const want = window.filter((r) => r.principal === "reader" && r.outcome === "executed");
    expect(
      (await log.search({ window: 100, limit: 5, principal: "reader", outcome: "executed" }))
        .records,
    ).toEqual(want.slice(0, 5));
    expect((await log.search({ window: 100, limit: 5, tool: "nothing" })).records).toEqual([]);
    log.close();
  });
});
