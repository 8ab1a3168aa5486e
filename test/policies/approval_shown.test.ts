// What an approver is shown of a request (approval_shown.ts) and the hash a decision's audit
// record carries: every field the approver sees moves the hash, the request's later life (its
// decision, expiry, use) does not, and the gate's decision records the hash of the request as it
// stood undecided. Real SQLite stores.
import { createHash } from "node:crypto";
import { afterAll, describe, expect, it } from "vitest";
import { shownApproval, shownSha256 } from "../../policies/approval_shown.js";
import type { ApprovalRecord } from "../../policies/approval_record.js";
import { SqliteApprovalQueue } from "../../server/stores/approvals/sqlite.js";
import { SqliteAuditTrail } from "../../server/stores/audit/sqlite.js";
import { canonicalJson } from "../../policies/digest.js";
import { decideApproval } from "../../policies/gate/approval_flow.js";
import type { Principal } from "../../policies/scopes.js";
import { captureLogger, FakeClock, tempDir } from "./helpers.js";

const tmp = tempDir();
afterAll(() => tmp.cleanup());

const rec: ApprovalRecord = {
  id: `apr_${"a".repeat(32)}`,
  principal: "agent",
  tool: "run_benchmark",
  args_digest: "d".repeat(64),
  args_preview: { model: "tiny-gpt2", iterations: 5 },
  estimate: { device_seconds: 3, memory_bytes: 1e6, compile_s: 0, weight_bytes: 1e6, fits: true },
  assurance: "token",
  status: "pending",
  created_at: "2026-12-01T10:00:00.000Z",
  expires_at: "2026-12-01T10:15:00.000Z",
  decided_by: null,
  decided_at: null,
  reason: null,
  used_at: null,
  policy_version: "pv_1",
  rule: "every run_benchmark call",
};

describe("what an approver is shown", () => {
  const base = shownSha256(shownApproval(rec));

  it("is hashed as the SHA-256 of its canonical JSON", () => {
    const shown = shownApproval(rec);
    expect(base).toBe(createHash("sha256").update(canonicalJson(shown)).digest("hex"));
    expect(shown).toEqual({
      approval_id: rec.id,
      requested_by: "agent",
      tool: "run_benchmark",
      args: rec.args_preview,
      args_digest: rec.args_digest,
      estimate: rec.estimate,
      rule: "every run_benchmark call",
      assurance: "token",
      policy_version: "pv_1",
      requested_at: rec.created_at,
    });
  });

  // Each field the approver is shown, changed on the record: the hash changes with it.
  const changes: [string, Partial<ApprovalRecord>][] = [
    ["id", { id: `apr_${"b".repeat(32)}` }],
    ["principal", { principal: "mallory" }],
    ["tool", { tool: "load_model" }],
    ["args", { args_preview: { model: "tiny-gpt2", iterations: 6 } }],
    ["args digest", { args_digest: "e".repeat(64) }],
    ["estimate", { estimate: { ...rec.estimate!, device_seconds: 4 } }],
    ["rule", { rule: "run_benchmark over 10 device-seconds" }],
    ["assurance", { assurance: "passkey" }],
    ["policy version", { policy_version: "pv_2" }],
    ["request time", { created_at: "2026-12-01T10:00:01.000Z" }],
  ];
  for (const [what, change] of changes)
    it(`changes with the ${what}`, () => {
      expect(shownSha256(shownApproval({ ...rec, ...change }))).not.toBe(base);
    });

  it("does not change with the request's decision, expiry or use", () => {
    const decided: ApprovalRecord = {
      ...rec,
      status: "used",
      expires_at: "2026-12-01T10:30:00.000Z",
      decided_by: "operator",
      decided_at: "2026-12-01T10:01:00.000Z",
      reason: "fine",
      used_at: "2026-12-01T10:02:00.000Z",
    };
    expect(shownSha256(shownApproval(decided))).toBe(base);
  });

  it("is what a decision's audit record hashes: the request as it stood undecided", async () => {
    const file = tmp.file("shown.db");
    const clock = new FakeClock();
    const approvals = new SqliteApprovalQueue(file, { clock: clock.now });
    const audit = new SqliteAuditTrail(file, { logger: captureLogger() });
    const operator: Principal = { id: "operator", scopes: ["approvals:grant"], via: "token" };
    for (const decision of ["approve", "deny"] as const) {
      const req = await approvals.create({
        principal: "agent",
        tool: "run_benchmark",
        args_digest: `${decision}`.padEnd(64, "0"),
        args_preview: { model: "tiny-gpt2", decision },
        estimate: rec.estimate,
        ttl_s: 900,
        policy_version: "pv_1",
        rule: "every run_benchmark call",
      });
      await decideApproval({ approvals, audit, clock: clock.now }, req.id, operator, decision);
      const [last] = await audit.tail(1);
      expect(last).toMatchObject({ approval_id: req.id, approver: "operator" });
      expect(last!.shown_sha256).toBe(shownSha256(shownApproval(req)));
    }
  });
});
