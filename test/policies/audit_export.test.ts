// The audit export and its keyless verifier (issue 31, item 4): 100,000 records written through
// the real store (group commit: one transaction) export and verify against the head; removing,
// editing, reordering or cutting lines fails it at the seq that broke, also when the tamperer
// recomputes the keyless chain after the edit (then only the head given out of band catches it).
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SqliteAuditTrail } from "../../server/stores/audit/sqlite.js";
import { type AuditRecord } from "../../policies/audit.js";
import {
  canonicalBody,
  exportLink,
  verifyExport,
  type ExportedRecord,
} from "../../policies/audit_export_proof.js";
import { asciiJson } from "../../policies/audit_export_line.js";
import { loadOrCreateAuditKey } from "../../policies/audit_key.js";
import { canonicalJson } from "../../policies/digest.js";
import { tempDir } from "./helpers.js";

const tmp = tempDir();
afterAll(() => tmp.cleanup());

const N = 100_000;
// After now: the chain_keyed record (stamped now) comes first in time as well as in seq.
const T0 = Date.now() + 1000;
const rec = (i: number): AuditRecord => ({
  time: new Date(T0 + i * 1000).toISOString(),
  principal: i % 7 === 0 ? "reader" : "agent",
  tool: i % 3 === 0 ? "load_model" : "run_inference",
  args_digest: (i % 256).toString(16).padStart(2, "0").repeat(32),
  args: { model: "tiny-gpt2", texts: { redacted: true, count: 1 }, note: "é\u009b" },
  outcome: i % 5 === 0 ? "denied" : "executed",
  ...(i % 5 === 0 ? { code: "rate_limited", reason: "over the limit" } : { duration_ms: i % 97 }),
});

type Line = Record<string, unknown>;
const parse = (lines: string[]) => lines.map((l) => JSON.parse(l) as Line);
// The tamperer writes the exporter's own text (ASCII JSON): the verifier compares whole lines.
const dump = (objs: Line[]) => objs.map((o) => asciiJson(o));

/** What someone without the key can do after an edit: recompute the keyless chain and head line. */
function rechain(objs: Line[], from: number): Line[] {
  let prev =
    (objs[from - 1]?.export_hash as string | undefined) ?? (objs[from]!.export_prev as string);
  for (let i = from; i < objs.length; i++) {
    const o = objs[i]!;
    if (o.type === "audit_head") {
      objs[i] = { ...o, seq: objs[i - 1]!.seq, export_hash: prev };
      continue;
    }
    const r = o as unknown as ExportedRecord;
    const link = exportLink(prev, r.prev_hash, r.hash, canonicalBody({ ...r.record, seq: r.seq }));
    objs[i] = { ...o, export_prev: prev, export_hash: link };
    prev = link;
  }
  return objs;
}

describe("audit export of 100,000 records", () => {
  let log: SqliteAuditTrail;
  let lines: string[];
  let head: { seq: number; hash: string; export_hash: string };
  const timings: Record<string, number> = {};

  beforeAll(async () => {
    const { key, created } = loadOrCreateAuditKey(tmp.file("audit.key"));
    log = new SqliteAuditTrail(tmp.file("policy.db"), { key, keyCreated: created });
    let t = performance.now();
    // Appended in one event-loop turn: the store's group commit chains them in one transaction.
    await Promise.all(Array.from({ length: N }, (_, i) => log.appendDurable(rec(i + 1))));
    timings.append_ms = performance.now() - t;
    t = performance.now();
    lines = [];
    log.export({ since: 1, format: "jsonl" }, (l) => lines.push(l));
    timings.export_ms = performance.now() - t;
    t = performance.now();
    head = await log.exportHead();
    timings.head_ms = performance.now() - t;
    console.log(`audit export figures (${N + 1} records): ${JSON.stringify(timings)}`);
  }, 600_000);
  afterAll(() => log?.close());

  it("verifies end to end against the head, and the keyed chain still verifies", async () => {
    expect(lines).toHaveLength(N + 2); // chain_keyed + N records + the head line
    expect(head.seq).toBe(N + 1);
    const t = performance.now();
    const v = verifyExport(lines, head.export_hash);
    console.log(`verify-export of ${N + 1} records: ${Math.round(performance.now() - t)} ms`);
    expect(v).toMatchObject({ ok: true, records: N + 1, first_seq: 1, last_seq: N + 1 });
    const last = JSON.parse(lines.at(-1)!) as Line;
    expect(last).toMatchObject({ type: "audit_head", seq: N + 1, hash: head.hash });
    expect(last.export_hash).toBe(head.export_hash);
    // Every line is ASCII (terminal-safe) and the body the export hashes is the one the key MAC'd.
    expect(lines.every((l) => /^[\x20-\x7e]*$/.test(l))).toBe(true);
    const r = JSON.parse(lines[5]!) as ExportedRecord;
    expect(canonicalBody({ ...r.record, seq: r.seq })).toBe(
      canonicalJson({ ...r.record, seq: r.seq }),
    );
    expect((await log.verify()).ok).toBe(true);
  });

  it("a later segment (--since a seq or a time) verifies against the same head", () => {
    const bySeq: string[] = [];
    log.export({ since: 60_001, format: "jsonl" }, (l) => bySeq.push(l));
    expect(verifyExport(bySeq, head.export_hash)).toMatchObject({ ok: true, first_seq: 60_001 });
    const byTime: string[] = [];
    log.export({ since: new Date(T0 + 99_000 * 1000).toISOString(), format: "ocsf" }, (l) =>
      byTime.push(l),
    );
    // rec(i) is record i + 1 (record 1 is chain_keyed).
    expect(verifyExport(byTime, head.export_hash)).toMatchObject({
      ok: true,
      first_seq: 99_001,
      records: N + 1 - 99_001 + 1,
    });
  });

  it("OCSF events carry the mapped fields and keep the proof in unmapped", () => {
    const ocsf: string[] = [];
    log.export({ since: N - 1, format: "ocsf" }, (l) => ocsf.push(l));
    const e = JSON.parse(ocsf[0]!) as Line;
    expect(e).toMatchObject({
      class_uid: 6003,
      category_uid: 6,
      type_uid: 600399,
      actor: { user: { uid: expect.any(String) } },
      api: { operation: expect.any(String), service: { name: "tpu-mcp" } },
      metadata: { uid: String(N - 1), product: { name: "tpu-mcp" } },
    });
    expect(typeof e.time).toBe("number");
    expect(["Success", "Failure"]).toContain(e.status);
    expect((e.unmapped as Line).tpu_mcp_audit).toMatchObject({ seq: N - 1 });
    expect(verifyExport(ocsf, head.export_hash).ok).toBe(true);
  });

  const k = 54_321; // the line of record k (line 0 is record 1)
  const seqAt = (i: number) => i + 1;
  const cases: Array<[string, () => string[], number, RegExp]> = [
    ["one line removed", () => lines.filter((_, i) => i !== k), seqAt(k), /record \d+ is missing/],
    [
      "one line edited",
      () =>
        lines.map((l, i) =>
          i === k ? l.replace('"agent"', '"someone-else"').replace('"reader"', '"x"') : l,
        ),
      seqAt(k),
      /was modified/,
    ],
    [
      "two lines swapped",
      () => lines.map((l, i) => (i === k ? lines[k + 1]! : i === k + 1 ? lines[k]! : l)),
      seqAt(k),
      /missing or out of place|out of order/,
    ],
    [
      "the last 10 records and the head line cut off",
      () => lines.slice(0, -11),
      N + 1 - 9,
      /does not end at the head you were given \(and it has no head line\)/,
    ],
    [
      "the last 10 records cut, the head line kept",
      () => [...lines.slice(0, -11), lines.at(-1)!],
      N + 1 - 9,
      /head line .* does not match its last record/,
    ],
    [
      "one line edited and the keyless chain recomputed after it (head line too)",
      () => {
        const objs = parse(lines);
        const r = objs[k]!.record as Line;
        objs[k] = { ...objs[k]!, record: { ...r, principal: "someone-else" } };
        return dump(rechain(objs, k));
      },
      N + 2,
      /does not end at the head you were given/,
    ],
    [
      "one line edited with its own export_hash recomputed",
      () => {
        const objs = parse(lines);
        const r = objs[k]!.record as Line;
        objs[k] = { ...objs[k]!, record: { ...r, principal: "someone-else" } };
        return dump(rechain(objs.slice(0, k + 1), k)).concat(lines.slice(k + 1));
      },
      seqAt(k + 1),
      /record \d+ does not follow record \d+ \(export_prev differs\)/,
    ],
    [
      "one line removed, the rest renumbered and rechained",
      () => {
        const objs = parse(lines.filter((_, i) => i !== k));
        for (let i = k; i < objs.length - 1; i++) {
          objs[i] = { ...objs[i]!, seq: (objs[i]!.seq as number) - 1 };
        }
        return dump(rechain(objs, k));
      },
      seqAt(k),
      /record \d+ does not follow record \d+ \(prev_hash differs\)/,
    ],
  ];

  it.each(cases)("fails: %s", (_name, tamper, badSeq, reason) => {
    const v = verifyExport(tamper(), head.export_hash);
    expect(v.ok).toBe(false);
    expect(v.reason).toMatch(reason);
    expect(v.first_bad_seq).toBe(badSeq);
  });

  it("fails against another head, and on a head that is not a hash", () => {
    expect(verifyExport(lines, "ab".repeat(32))).toMatchObject({ ok: false });
    expect(verifyExport(lines, "not-a-hash").reason).toMatch(/64-hex export_hash/);
  });
});
