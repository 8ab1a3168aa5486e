// The text of an export's lines, jsonl or OCSF: one function per kind of line, used by the
// exporter (audit_export.ts), the streaming sink (audit_sink.ts) and the verifier
// (audit_export_proof.ts), which recomputes every line from its proof fields and compares the
// whole text, so no field a receiver reads can differ from the record it was mapped from.
// Standalone like the verifier: no imports but types.

import type { ExportedHead, ExportedRecord } from "./audit_export_proof.js";

export type ExportFormat = "jsonl" | "ocsf";

/** JSON with every non-ASCII character escaped: safe on a terminal, and the same value parsed. */
export function asciiJson(v: unknown): string {
  return JSON.stringify(v).replace(
    /[\u007f-\uffff]/g,
    (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`,
  );
}

const SUCCESS = new Set(["allowed", "executed", "approval_granted", "chain_keyed"]);
const FAILURE = new Set(["denied", "failed", "approval_denied", "approval_expired", "interrupted"]);
const PRODUCT = { name: "tpu-mcp", vendor_name: "tpu-mcp" };

/** The fields of a record an OCSF event maps (read from an untrusted line: any JSON). */
interface Mapped {
  time?: unknown;
  principal?: unknown;
  tool?: unknown;
  outcome?: unknown;
  code?: unknown;
  reason?: unknown;
  duration_ms?: unknown;
}

/** The proof fields alone, in the export's order (a line read back may hold others). */
function proofFields(p: ExportedRecord): ExportedRecord {
  return {
    seq: p.seq,
    record: p.record,
    prev_hash: p.prev_hash,
    hash: p.hash,
    export_prev: p.export_prev,
    export_hash: p.export_hash,
  };
}

/** An OCSF API Activity (6003) event for one record; the proof fields stay in `unmapped`. */
function ocsfEvent(p: ExportedRecord): Record<string, unknown> {
  const r = p.record as Mapped;
  const outcome = r.outcome as string;
  const statusId = SUCCESS.has(outcome) ? 1 : FAILURE.has(outcome) ? 2 : 99;
  return {
    class_uid: 6003,
    class_name: "API Activity",
    category_uid: 6,
    category_name: "Application Activity",
    activity_id: 99,
    activity_name: r.outcome,
    type_uid: 600399,
    severity_id: statusId === 2 ? 3 : 1,
    time: Date.parse(r.time as string),
    status_id: statusId,
    status: statusId === 1 ? "Success" : statusId === 2 ? "Failure" : "Other",
    ...(r.code !== undefined ? { status_code: r.code } : {}),
    ...(r.reason !== undefined ? { status_detail: r.reason } : {}),
    ...(r.duration_ms !== undefined ? { duration: r.duration_ms } : {}),
    actor: { user: { uid: r.principal, type_id: 99 } },
    api: { operation: r.tool, service: { name: "tpu-mcp" } },
    metadata: { version: "1.1.0", product: PRODUCT, log_name: "audit", uid: String(p.seq) },
    unmapped: { tpu_mcp_audit: p },
  };
}

/** A record's line, as a value (asciiJson of it is the text). */
export function recordLine(p: ExportedRecord, format: ExportFormat): Record<string, unknown> {
  const q = proofFields(p);
  return format === "ocsf" ? ocsfEvent(q) : { type: "audit_record", ...q };
}

/** The head's fields as the export writes them. */
export interface HeadFields extends ExportedHead {
  key_id: string | null;
  first_seq: number | null;
  records: number;
  exported_at: string;
}

/** The export's last line, as a value. */
export function headLine(h: HeadFields, format: ExportFormat): Record<string, unknown> {
  const head = {
    seq: h.seq,
    hash: h.hash,
    export_hash: h.export_hash,
    key_id: h.key_id,
    first_seq: h.first_seq,
    records: h.records,
    exported_at: h.exported_at,
  };
  if (format !== "ocsf") return { type: "audit_head", ...head };
  return {
    class_uid: 6003,
    category_uid: 6,
    activity_id: 99,
    activity_name: "audit_export_head",
    type_uid: 600399,
    severity_id: 1,
    time: Date.parse(h.exported_at),
    status_id: 1,
    metadata: { version: "1.1.0", product: PRODUCT, log_name: "audit" },
    unmapped: { tpu_mcp_audit_head: head },
  };
}
