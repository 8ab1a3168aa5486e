// An exported trail's every field is proven, not only its proof fields (issue 43, row 2). The
// attack: `audit verify-export` read only `unmapped.tpu_mcp_audit`, so an OCSF event of the agent
// rewritten to actor "operator", operation "approvals approve", status Success still verified
// as "unmodified", and so did a jsonl line with an extra field or a duplicate key placed before
// the real one. Here the real CLI exports a trail written through the real store, in both
// formats; each edit below is made to one line, as data, and each is refused by the verifier the
// CLI runs, naming the line and the field. The untouched exports verify.
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { beforeAll, afterAll, describe, expect, it } from "vitest";
import { asciiJson } from "../../policies/audit_export_line.js";
import { verifyExport } from "../../policies/audit_export_proof.js";
import { SqliteAuditTrail } from "../../server/stores/audit/sqlite.js";
import { loadOrCreateAuditKey } from "../../policies/audit_key.js";
import { writeConfig } from "../helpers/server.js";
import { cleanupTemp, cli, tempDir } from "./helpers.js";

type Obj = Record<string, any>;
/** One edit of one line: the parsed line to change in place, or the line's text to rewrite. */
type Edit = { obj: (o: Obj) => void } | { text: (t: string) => string };

const dir = tempDir();
const config = writeConfig({}, dir);
const T0 = Date.parse("2026-12-07T12:00:00.000Z");
let head: string;
const lines: Record<"jsonl" | "ocsf", string[]> = { jsonl: [], ocsf: [] };

// Record 1 is the chain_keyed record; 2 the agent's refused call; 3 its executed call; 4 the
// operator's approval.
const REFUSED = 1; // the line of record 2
const EXECUTED = 2; // the line of record 3

beforeAll(async () => {
  const { key, created } = loadOrCreateAuditKey(join(dir, "data", "audit.key"));
  const log = new SqliteAuditTrail(join(dir, "data", "policy.db"), { key, keyCreated: created });
  const base = { tool: "run_inference", args_digest: "ab".repeat(32) };
  await log.appendDurable({
    ...base,
    time: new Date(T0).toISOString(),
    principal: "agent",
    outcome: "denied",
    code: "approval_required",
    reason: "run_inference on this model needs an operator's approval",
  });
  await log.appendDurable({
    ...base,
    time: new Date(T0 + 1000).toISOString(),
    principal: "agent",
    outcome: "executed",
    duration_ms: 412,
  });
  await log.appendDurable({
    time: new Date(T0 + 2000).toISOString(),
    principal: "operator",
    tool: "approvals",
    args_digest: null,
    outcome: "approval_granted",
    reason: "approved apr_1",
  });
  log.close();
  const h = await cli(config, "audit", "head");
  expect(h.code, h.stderr).toBe(0);
  head = JSON.parse(h.stdout).export_hash as string;
  for (const format of ["jsonl", "ocsf"] as const) {
    const out = join(dir, `export.${format}`);
    const e = await cli(
      config,
      "audit",
      "export",
      "--since",
      "1",
      "--format",
      format,
      "--out",
      out,
    );
    expect(e.code, e.stderr).toBe(0);
    lines[format] = readFileSync(out, "utf8").trimEnd().split("\n");
  }
});
afterAll(() => cleanupTemp());

/** The export with one line edited. */
function edited(format: "jsonl" | "ocsf", at: number, edit: Edit): string[] {
  const out = [...lines[format]];
  if ("text" in edit) out[at] = edit.text(out[at]!);
  else {
    const o = JSON.parse(out[at]!) as Obj;
    edit.obj(o);
    out[at] = asciiJson(o);
  }
  expect(out[at]).not.toBe(lines[format][at]);
  return out;
}

// [what, format, line, edit, the record the verifier names, the field it names]
const EDITS: Array<[string, "jsonl" | "ocsf", number, Edit, number, RegExp]> = [
  [
    "the agent's refusal rewritten as the operator approving",
    "ocsf",
    REFUSED,
    {
      obj: (o) => {
        o.actor.user.uid = "operator";
        o.api.operation = "approvals approve";
        o.status = "Success";
      },
    },
    2,
    /status is "Success", but the record's proof fields give "Failure"/,
  ],
  [
    "actor.user.uid",
    "ocsf",
    REFUSED,
    { obj: (o) => (o.actor.user.uid = "operator") },
    2,
    /actor\.user\.uid/,
  ],
  [
    "actor.user.type_id",
    "ocsf",
    REFUSED,
    { obj: (o) => (o.actor.user.type_id = 1) },
    2,
    /actor\.user\.type_id/,
  ],
  [
    "api.operation",
    "ocsf",
    REFUSED,
    { obj: (o) => (o.api.operation = "approvals approve") },
    2,
    /api\.operation/,
  ],
  [
    "api.service.name",
    "ocsf",
    REFUSED,
    { obj: (o) => (o.api.service.name = "other") },
    2,
    /api\.service\.name/,
  ],
  ["status", "ocsf", REFUSED, { obj: (o) => (o.status = "Success") }, 2, /status is "Success"/],
  ["status_id", "ocsf", REFUSED, { obj: (o) => (o.status_id = 1) }, 2, /status_id is 1/],
  ["status_code", "ocsf", REFUSED, { obj: (o) => (o.status_code = "ok") }, 2, /status_code/],
  [
    "status_detail",
    "ocsf",
    REFUSED,
    { obj: (o) => (o.status_detail = "approved") },
    2,
    /status_detail/,
  ],
  [
    "status_code removed",
    "ocsf",
    REFUSED,
    { obj: (o) => delete o.status_code },
    2,
    /field status_code is missing/,
  ],
  [
    "activity_name",
    "ocsf",
    REFUSED,
    { obj: (o) => (o.activity_name = "allowed") },
    2,
    /activity_name/,
  ],
  ["activity_id", "ocsf", REFUSED, { obj: (o) => (o.activity_id = 1) }, 2, /activity_id/],
  ["severity_id", "ocsf", REFUSED, { obj: (o) => (o.severity_id = 1) }, 2, /severity_id/],
  ["class_uid", "ocsf", REFUSED, { obj: (o) => (o.class_uid = 3002) }, 2, /class_uid/],
  ["type_uid", "ocsf", REFUSED, { obj: (o) => (o.type_uid = 300201) }, 2, /type_uid/],
  ["time", "ocsf", REFUSED, { obj: (o) => (o.time += 3_600_000) }, 2, /time is \d+/],
  [
    "metadata.uid",
    "ocsf",
    REFUSED,
    { obj: (o) => (o.metadata.uid = "4") },
    2,
    /metadata\.uid is "4"/,
  ],
  [
    "metadata.product.name",
    "ocsf",
    REFUSED,
    { obj: (o) => (o.metadata.product.name = "x") },
    2,
    /metadata\.product\.name/,
  ],
  ["duration", "ocsf", EXECUTED, { obj: (o) => (o.duration = 1) }, 3, /duration is 1/],
  [
    "a field added (OCSF)",
    "ocsf",
    REFUSED,
    { obj: (o) => (o.is_alert = false) },
    2,
    /unknown field is_alert/,
  ],
  [
    "a field added inside unmapped's proof",
    "ocsf",
    REFUSED,
    { obj: (o) => (o.unmapped.tpu_mcp_audit.approved = true) },
    2,
    /unknown field unmapped\.tpu_mcp_audit\.approved/,
  ],
  [
    "a duplicate actor before the real one (OCSF)",
    "ocsf",
    REFUSED,
    { text: (t) => `{"actor":{"user":{"uid":"operator","type_id":99}},${t.slice(1)}` },
    2,
    /the key actor appears twice/,
  ],
  [
    "a field added (jsonl)",
    "jsonl",
    REFUSED,
    { obj: (o) => (o.approved_by = "operator") },
    2,
    /unknown field approved_by/,
  ],
  [
    "a duplicate record before the real one (jsonl)",
    "jsonl",
    REFUSED,
    {
      text: (t) =>
        `{"record":${asciiJson({ ...JSON.parse(t).record, principal: "operator", outcome: "allowed" })},${t.slice(1)}`,
    },
    2,
    /the key record appears twice/,
  ],
  [
    "a duplicate principal inside the record (jsonl)",
    "jsonl",
    REFUSED,
    { text: (t) => t.replace('"principal":"agent"', '"principal":"operator","principal":"agent"') },
    2,
    /the key record\.principal appears twice/,
  ],
  [
    "the same line re-serialised with spaces",
    "jsonl",
    REFUSED,
    { text: (t) => JSON.stringify(JSON.parse(t), null, 1).replace(/\n/g, "") },
    2,
    /its text differs from the export's at character \d+/,
  ],
];

describe("verify-export proves every field of every line", () => {
  it("verifies the untouched exports, jsonl and OCSF, through the CLI", async () => {
    for (const format of ["jsonl", "ocsf"] as const) {
      const v = await cli(
        config,
        "audit",
        "verify-export",
        join(dir, `export.${format}`),
        "--head",
        head,
      );
      expect(v.code, v.stdout + v.stderr).toBe(0);
      expect(v.stdout).toMatch(/^ok: records 1\.\.4 \(4\)/);
    }
  });

  it("an OCSF export's indexed fields are proven: the attack's rewrite is BROKEN through the CLI", async () => {
    const [, format, at, edit] = EDITS[0]!;
    const file = join(dir, "attack.ocsf");
    writeFileSync(file, edited(format, at, edit).join("\n") + "\n");
    const v = await cli(config, "audit", "verify-export", file, "--head", head);
    expect(v.code, v.stdout + v.stderr).toBe(1);
    expect(v.stdout).toContain(
      `BROKEN at record #2: line 2 (record 2): status is "Success", but the record's proof fields give "Failure": the line was edited`,
    );
  });

  it.each(EDITS)("refuses an edit: %s (%s)", (_what, format, at, edit, seq, field) => {
    const v = verifyExport(edited(format, at, edit), head);
    expect(v.ok, v.reason).toBe(false);
    expect(v.first_bad_seq).toBe(seq);
    expect(v.reason).toMatch(new RegExp(`^line ${at + 1} \\(record ${seq}\\): `));
    expect(v.reason).toMatch(field);
  });

  it("refuses an edited head line, and a head line whose counts do not match the segment", () => {
    const last = lines.ocsf.length - 1;
    const time = verifyExport(edited("ocsf", last, { obj: (o) => (o.time += 1) }), head);
    expect(time).toMatchObject({ ok: false });
    expect(time.reason).toMatch(/^line 5 \(the head line\): time is \d+, but/);
    const extra = verifyExport(edited("jsonl", last, { obj: (o) => (o.note = "x") }), head);
    expect(extra.reason).toMatch(/^line 5 \(the head line\): unknown field note/);
    // The first records cut, the head line (which says 1.. (4)) kept.
    const cut = verifyExport(lines.jsonl.slice(2), head);
    expect(cut).toMatchObject({ ok: false, first_bad_seq: 3 });
    expect(cut.reason).toMatch(
      /head line says records 1\.\. \(4\), but the export holds 3\.\.4 \(2\)/,
    );
  });
});
