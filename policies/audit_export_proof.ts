// What a receiver of an exported audit trail checks without the server's key. The trail's own
// chain is HMAC'd (audit_chain.ts): without the key nobody can tell whether a record's body
// matches its hash. So the export adds a second, keyless chain over the same records —
// export_hash(n) = SHA-256 of export_hash(n-1), the record's prev_hash and hash, and its canonical
// body (the exact text the server HMAC'd) — computed from record 1, so the head of a trail has
// one export hash whatever segment is exported. A receiver given that head out of band checks
// that the lines it got are a gap-free, unedited, in-order run of the chain ending at it.
//
// The chain proves the proof fields; every other field of a line (the OCSF fields a SIEM indexes:
// actor, operation, status, time, uid...) is recomputed from them with the exporter's own
// function (audit_export_line.ts) and the whole line compared, so none can be rewritten either,
// and a field added or a key written twice is refused.
//
// Standalone on purpose: only node:crypto and two import-free modules (the line format,
// json_diff.ts), no server state, so a receiver can run the bundled `dist/verify-export.mjs` and
// check an export with no data dir and no key.

import { createHash } from "node:crypto";
import {
  asciiJson,
  headLine,
  recordLine,
  type ExportFormat,
  type HeadFields,
} from "./audit_export_line.js";
import { duplicateKey, jsonDifference } from "./json_diff.js";

export const EXPORT_GENESIS = "0".repeat(64);
const LINK_TAG = "tpu-mcp-audit-export/1";

/** Canonical JSON: object keys sorted, no spaces, -0 as 0 (the server's canonicalJson for records). */
export function canonicalBody(v: unknown): string {
  if (v === null) return "null";
  if (typeof v === "number") return Object.is(v, -0) ? "0" : String(v);
  if (typeof v === "string" || typeof v === "boolean") return JSON.stringify(v);
  if (Array.isArray(v))
    return `[${v.map((x) => (x === undefined ? "null" : canonicalBody(x))).join(",")}]`;
  if (typeof v === "object") {
    const o = v as Record<string, unknown>;
    const keys = Object.keys(o)
      .filter((k) => o[k] !== undefined)
      .sort();
    return `{${keys.map((k) => `${JSON.stringify(k)}:${canonicalBody(o[k])}`).join(",")}}`;
  }
  throw new Error(`a ${typeof v} has no JSON form`);
}

/** One link of the keyless chain. `body`: the record's canonical JSON with its seq. */
export function exportLink(
  prevExport: string,
  prevHash: string,
  hash: string,
  body: string,
): string {
  return createHash("sha256")
    .update(`${LINK_TAG}\n${prevExport}\n${prevHash}\n${hash}\n${body}`, "utf8")
    .digest("hex");
}

/** The proof fields of one exported record (in a jsonl line, or an OCSF event's `unmapped`). */
export interface ExportedRecord {
  seq: number;
  record: Record<string, unknown>;
  prev_hash: string;
  hash: string;
  export_prev: string;
  export_hash: string;
}

/** The export's last line: the head it ends at. */
export interface ExportedHead {
  seq: number;
  hash: string;
  export_hash: string;
}

export interface ExportVerifyResult {
  ok: boolean;
  records: number;
  first_seq: number | null;
  last_seq: number | null;
  first_bad_seq?: number;
  reason: string;
}

const HEX64 = /^[0-9a-f]{64}$/;

/** A line's proof fields and format, wherever it puts them; null for a line that is neither. */
function parseLine(
  obj: Record<string, unknown>,
):
  | { kind: "record"; r: ExportedRecord; format: ExportFormat }
  | { kind: "head"; h: HeadFields; format: ExportFormat }
  | null {
  const unmapped = (obj.unmapped ?? {}) as Record<string, unknown>;
  if (obj.type === "audit_record")
    return { kind: "record", r: obj as unknown as ExportedRecord, format: "jsonl" };
  const rec = unmapped.tpu_mcp_audit as ExportedRecord | undefined;
  if (rec && typeof rec === "object") return { kind: "record", r: rec, format: "ocsf" };
  if (obj.type === "audit_head")
    return { kind: "head", h: obj as unknown as HeadFields, format: "jsonl" };
  const head = unmapped.tpu_mcp_audit_head as HeadFields | undefined;
  if (head && typeof head === "object") return { kind: "head", h: head, format: "ocsf" };
  return null;
}

/** A value as a message shows it: ASCII JSON, cut short. */
function show(v: unknown): string {
  const t = v === undefined ? "nothing" : asciiJson(v);
  return t.length > 80 ? `${t.slice(0, 77)}...` : t;
}

/**
 * Why `text` (a line, parsed as `obj`) is not exactly the line `expected` the exporter writes
 * for its proof fields, naming the field; null when it is.
 */
function lineDiffers(text: string, obj: unknown, expected: Record<string, unknown>): string | null {
  const want = asciiJson(expected);
  if (text === want) return null;
  let dup: string | null = null;
  try {
    dup = duplicateKey(text);
  } catch {
    // Nested past the stack: the text comparison below still refuses it.
  }
  if (dup) return `the key ${dup} appears twice (a reader may take either)`;
  const d = jsonDifference(obj, JSON.parse(want));
  if (d?.kind === "unknown") return `unknown field ${d.path} (the export writes no such field)`;
  if (d?.kind === "missing") return `field ${d.path} is missing`;
  if (d?.kind === "value")
    return `${d.path || "the line"} is ${show(d.actual)}, but the record's proof fields give ${show(d.expected)}`;
  let at = 0;
  while (text[at] === want[at]) at++;
  return `its text differs from the export's at character ${at + 1} (key order, spacing or escapes)`;
}

/**
 * Whether `lines` (an export, jsonl or OCSF) are a gap-free segment of the chain ending at the
 * head whose export hash is `headExportHash` (given out of band). Stops at the first fault and
 * names its seq.
 */
export function verifyExport(lines: Iterable<string>, headExportHash: string): ExportVerifyResult {
  const want = headExportHash.trim().toLowerCase();
  let records = 0;
  let firstSeq: number | null = null;
  let lastSeq: number | null = null;
  let prevHash: string | null = null;
  let prevExport: string | null = null;
  let head: HeadFields | null = null;
  let lineNo = 0;
  const fail = (seq: number, reason: string): ExportVerifyResult => ({
    ok: false,
    records,
    first_seq: firstSeq,
    last_seq: lastSeq,
    first_bad_seq: seq,
    reason,
  });
  if (!HEX64.test(want))
    return fail(0, "the head must be the 64-hex export_hash printed by `tpu-mcp audit head`");
  for (const raw of lines) {
    lineNo++;
    const text = raw.trim();
    if (text === "") continue;
    const at = (lastSeq ?? 0) + 1;
    if (head) return fail(at, `line ${lineNo} follows the head line: the export was altered`);
    let obj: Record<string, unknown>;
    try {
      obj = JSON.parse(text) as Record<string, unknown>;
    } catch {
      return fail(at, `line ${lineNo} is not valid JSON (record ${at} or after was damaged)`);
    }
    const line = obj && typeof obj === "object" ? parseLine(obj) : null;
    if (!line) return fail(at, `line ${lineNo} is neither an audit record nor the head`);
    if (line.kind === "head") {
      const why = lineDiffers(text, obj, headLine(line.h, line.format));
      if (why) return fail(at, `line ${lineNo} (the head line): ${why}: the line was edited`);
      head = line.h;
      continue;
    }
    const r = line.r;
    if (!Number.isInteger(r.seq) || !r.record || typeof r.record !== "object")
      return fail(at, `line ${lineNo} lacks a seq or a record`);
    if (lastSeq !== null && r.seq !== lastSeq + 1)
      return fail(
        lastSeq + 1,
        r.seq > lastSeq + 1
          ? `record ${lastSeq + 1} is missing or out of place (line ${lineNo} holds record ${r.seq})`
          : `records out of order: record ${r.seq} comes after record ${lastSeq}`,
      );
    if (prevHash !== null && r.prev_hash !== prevHash)
      return fail(r.seq, `record ${r.seq} does not follow record ${r.seq - 1} (prev_hash differs)`);
    if (prevExport !== null && r.export_prev !== prevExport)
      return fail(
        r.seq,
        `record ${r.seq} does not follow record ${r.seq - 1} (export_prev differs)`,
      );
    if (prevExport === null && !HEX64.test(String(r.export_prev)))
      return fail(r.seq, `record ${r.seq} has no export_prev to start the segment from`);
    let body: string;
    try {
      body = canonicalBody({ ...r.record, seq: r.seq });
    } catch (e) {
      return fail(r.seq, `record ${r.seq}: ${(e as Error).message}`);
    }
    // Linked to what this verifier computed, never to what the line claims came before it.
    const link = exportLink(prevExport ?? r.export_prev, String(r.prev_hash), String(r.hash), body);
    if (link !== r.export_hash)
      return fail(
        r.seq,
        `record ${r.seq} was modified (its export_hash does not match its content)`,
      );
    // The proof fields are proven; every other field must be what they map to.
    const why = lineDiffers(text, obj, recordLine(r, line.format));
    if (why) return fail(r.seq, `line ${lineNo} (record ${r.seq}): ${why}: the line was edited`);
    firstSeq ??= r.seq;
    lastSeq = r.seq;
    prevHash = r.hash;
    prevExport = link;
    records++;
  }
  if (records === 0) return fail(0, "the export holds no records");
  if (head && (head.seq !== lastSeq || head.export_hash !== prevExport))
    return fail(
      lastSeq! + 1,
      `the export's head line (record ${head.seq}) does not match its last record ${lastSeq}: records were cut from the end`,
    );
  if (head && (head.first_seq !== firstSeq || head.records !== records))
    return fail(
      firstSeq!,
      `the export's head line says records ${show(head.first_seq)}.. (${show(head.records)}), but the export holds ${firstSeq}..${lastSeq} (${records}): records were cut from the start`,
    );
  if (prevExport !== want)
    return fail(
      lastSeq! + 1,
      `the segment ${firstSeq}..${lastSeq} does not end at the head you were given${head ? "" : " (and it has no head line)"}: records after ${lastSeq} were cut off, or the head belongs to another trail or a later export`,
    );
  return {
    ok: true,
    records,
    first_seq: firstSeq,
    last_seq: lastSeq,
    reason: `records ${firstSeq}..${lastSeq} (${records}) are a gap-free, unmodified segment of the chain ending at the given head`,
  };
}
