// Group commit of the audit trail (SqliteAuditTrail.appendDurable) and the gate's use of it: the
// records of concurrent calls share commits, yet every answered call's records are committed
// (visible to another connection, as after a crash) before the gate hands back its answer.
import Database from "better-sqlite3";
import { afterAll, describe, expect, it } from "vitest";
import { SqliteAuditTrail } from "../../server/stores/audit/sqlite.js";
import { type AuditRecord } from "../../policies/audit.js";
import { parsePolicyConfig } from "../../policies/config.js";
import { Gate } from "../../policies/gate/gate.js";
import { SqliteApprovalQueue } from "../../server/stores/approvals/sqlite.js";
import { SqliteBudgetLedger } from "../../policies/limits/budget.js";
import { ConcurrencyLimiter } from "../../policies/limits/concurrency.js";
import { RateLimiter } from "../../policies/limits/rate.js";
import type { Principal } from "../../policies/scopes.js";
import { captureLogger, tempDir } from "./helpers.js";
import { TOOL_POLICIES } from "../../tools/registry.js";

const tmp = tempDir();
afterAll(() => tmp.cleanup());

const rec = (i: number): AuditRecord => ({
  time: new Date(0).toISOString(),
  principal: "p",
  tool: "run_inference",
  args_digest: `d${i}`,
  outcome: "executed",
});

/** Records as another process would read them (a new connection to the same file). */
function readBack(file: string): { seq: number; record: string }[] {
  const db = new Database(file, { readonly: true });
  try {
    return db.prepare("SELECT seq, record FROM audit_log ORDER BY seq").all() as {
      seq: number;
      record: string;
    }[];
  } finally {
    db.close();
  }
}

describe("audit group commit", () => {
  it("commits records appended in one turn together, chained in order, each resolved after its commit", async () => {
    const file = tmp.file("group.db");
    const audit = new SqliteAuditTrail(file);
    let commits = 0;
    const probe = new Database(file, { readonly: true });
    const version = () => probe.pragma("data_version", { simple: true }) as number;
    const v0 = version();
    const all = Array.from({ length: 32 }, (_, i) => audit.appendDurable(rec(i)));
    // Nothing is written before the turn ends…
    expect(readBack(file)).toHaveLength(0);
    const stored = await Promise.all(all);
    // …then all 32 in one commit (data_version moves once per foreign commit).
    commits = version() - v0;
    expect(commits).toBe(1);
    expect(stored.map((s) => s.seq)).toEqual(Array.from({ length: 32 }, (_, i) => i + 1));
    expect(readBack(file).map((r) => JSON.parse(r.record).args_digest)).toEqual(
      Array.from({ length: 32 }, (_, i) => `d${i}`),
    );
    // Interleaved with a synchronous append (as the CLI's approvals make), the chain holds.
    audit.append(rec(100));
    await audit.appendDurable(rec(101));
    expect(await audit.verify()).toMatchObject({ ok: true, checked: 34 });
    probe.close();
    audit.close();
  });

  it("rejects every queued record when the commit fails", async () => {
    const audit = new SqliteAuditTrail(tmp.file("fail.db"));
    audit.close();
    await expect(audit.appendDurable(rec(1))).rejects.toThrow();
  });
});

describe("the gate with group commit", () => {
  const agent: Principal = { id: "agent", scopes: ["inference:run"], via: "stdio" };

  function gateOn(file: string) {
    const config = parsePolicyConfig(
      { limits: { concurrency: { run_inference: 64 } } } as any,
      TOOL_POLICIES,
    );
    const audit = new SqliteAuditTrail(file);
    const gate = new Gate({
      tools: TOOL_POLICIES,
      config,
      approvals: new SqliteApprovalQueue(file),
      audit,
      limiter: new ConcurrencyLimiter(config.limits),
      rateLimiter: new RateLimiter(100_000),
      budget: new SqliteBudgetLedger(file, config.limits.budget),
      logger: captureLogger(),
    });
    return { gate, audit };
  }

  it("has every answered call's allowed and executed records committed when it answers", async () => {
    const file = tmp.file("gate.db");
    const { gate, audit } = gateOn(file);
    const answered: number[] = [];
    await Promise.all(
      Array.from({ length: 24 }, (_, i) =>
        gate
          .run({ principal: agent, tool: "run_inference", args: { model: "m", i } }, async () => i)
          .then((v) => {
            // At the moment of the answer, another connection already sees this call's records.
            const seen = readBack(file).map((r) => JSON.parse(r.record));
            const mine = seen.filter((r) => r.args_digest && r.outcome === "executed");
            answered.push(v);
            expect(mine.length).toBeGreaterThanOrEqual(answered.length);
          }),
      ),
    );
    const outcomes = (await audit.tail(100)).map((r) => r.outcome);
    expect(outcomes.filter((o) => o === "allowed")).toHaveLength(24);
    expect(outcomes.filter((o) => o === "executed")).toHaveLength(24);
    expect((await audit.verify()).ok).toBe(true);
  });

  it("refuses to run a call whose allowed record cannot be committed (fail closed)", async () => {
    const { gate, audit } = gateOn(tmp.file("closed.db"));
    audit.close();
    const admin: Principal = { id: "admin", scopes: ["admin"], via: "stdio" };
    let ran = false;
    await expect(
      gate.run({ principal: admin, tool: "load_model", args: { model: "m" } }, async () => {
        ran = true;
      }),
    ).rejects.toThrow();
    expect(ran).toBe(false);
  });

  it("cancels and refuses an inference whose allowed record cannot be committed (it may have started)", async () => {
    const { gate, audit } = gateOn(tmp.file("closed-infer.db"));
    audit.close();
    let signalled: AbortSignal | undefined;
    const answer = gate.run(
      { principal: agent, tool: "run_inference", args: { model: "m" } },
      (signal) => {
        signalled = signal;
        // Work that would answer only after the commit has been tried.
        return new Promise((resolve) => setTimeout(() => resolve("logits"), 50));
      },
    );
    await expect(answer).rejects.toThrow(/not open|closed/i);
    expect(signalled?.aborted).toBe(true);
  });

  it("answers an inference only once both of its records are committed, with the allowed one first", async () => {
    const file = tmp.file("order.db");
    const { gate, audit } = gateOn(file);
    const v = await gate.run(
      { principal: agent, tool: "run_inference", args: { model: "m" } },
      async () => "fast", // resolves before the allowed record's commit turn
    );
    expect(v).toBe("fast");
    const seen = readBack(file).map((r) => JSON.parse(r.record).outcome);
    expect(seen).toEqual(["allowed", "executed"]);
    audit.close();
  });
});

describe("the record text written once per record", () => {
  it("equals canonical JSON as stored and with seq as hashed, wherever seq sorts", async () => {
    const { canonicalWithSeq, prepareRecord } = await import("../../policies/audit_record.js");
    const { canonicalJson } = await import("../../policies/digest.js");
    const records: Record<string, unknown>[] = [
      { ...rec(1), reason: "r", worker: undefined, estimate: { b: 1, a: [1, -0, 2.5] } },
      { a: 1 }, // every key before "seq"
      { zz: "x", time: "t" }, // every key after
      {},
      { "s\u00e9q": 1, seq: 99, sep: [undefined, { x: undefined, y: null }] },
    ];
    for (const r of records) {
      const p = prepareRecord(r as unknown as AuditRecord);
      const { stored, hashed } = canonicalWithSeq(p, 42);
      const { seq: _drop, ...withoutSeq } = r;
      expect(stored).toBe(canonicalJson(withoutSeq));
      expect(hashed).toBe(canonicalJson({ ...withoutSeq, seq: 42 }));
    }
  });

  it("refuses a record with no JSON form alone, not the records committed with it", async () => {
    const audit = new SqliteAuditTrail(tmp.file("bad.db"));
    const good = audit.appendDurable(rec(1));
    const bad = audit.appendDurable({ ...rec(2), duration_ms: Number.NaN });
    await expect(bad).rejects.toThrow(/finite/);
    await expect(good).resolves.toMatchObject({ seq: 1 });
    expect(await audit.verify()).toMatchObject({ ok: true, checked: 1 });
    audit.close();
  });
});
