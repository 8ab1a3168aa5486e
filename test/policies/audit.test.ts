import Database from "better-sqlite3";
import { afterAll, describe, expect, it } from "vitest";
import { redactArgs, SqliteAuditLog, type AuditRecord } from "../../policies/audit.js";
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
  it("chains records and emits each as one log line", () => {
    const { log, logger } = filled(5);
    const tail = log.tail(2);
    expect(tail.map((r) => r.seq)).toEqual([4, 5]);
    expect(tail[1]!.prev_hash).toBe(tail[0]!.hash);
    expect(log.verify()).toEqual({ ok: true, checked: 5, reason: "5 records chain correctly" });
    expect(logger.lines).toHaveLength(5);
    expect(logger.lines[0]!.obj).toMatchObject({ audit: { seq: 1, outcome: "executed" } });
    log.close();
  });

  it("detects an edited record at its seq", () => {
    const { file, log } = filled(5);
    const raw = new Database(file);
    raw
      .prepare(
        "UPDATE audit_log SET record = replace(record, '\"agent\"', '\"someone-else\"') WHERE seq = 3",
      )
      .run();
    raw.close();
    expect(log.verify()).toMatchObject({ ok: false, checked: 2, first_bad_seq: 3 });
    log.close();
  });

  it("detects a deleted record", () => {
    const { file, log } = filled(5);
    const raw = new Database(file);
    raw.prepare("DELETE FROM audit_log WHERE seq = 2").run();
    raw.close();
    const v = log.verify();
    expect(v).toMatchObject({ ok: false, first_bad_seq: 2 });
    expect(v.reason).toMatch(/missing/);
    log.close();
  });

  it("detects records removed from the end", () => {
    const { file, log } = filled(5);
    const raw = new Database(file);
    raw.prepare("DELETE FROM audit_log WHERE seq >= 4").run();
    raw.close();
    expect(log.verify()).toMatchObject({ ok: false, first_bad_seq: 4 });
    log.close();
  });

  it("detects reordered records", () => {
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
    expect(log.verify()).toMatchObject({ ok: false, first_bad_seq: 2 });
    log.close();
  });

  it("keeps the chain across reopening and across two handles", () => {
    const { file, log } = filled(2);
    const other = new SqliteAuditLog(file);
    other.append(rec(3, { outcome: "approval_granted", approver: "operator" }));
    log.append(rec(4));
    log.close();
    other.close();
    const reopened = new SqliteAuditLog(file);
    expect(reopened.verify()).toMatchObject({ ok: true, checked: 4 });
    expect(reopened.tail(10).map((r) => r.outcome)).toEqual([
      "executed",
      "executed",
      "approval_granted",
      "executed",
    ]);
    reopened.close();
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
