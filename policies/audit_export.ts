// `tpu-mcp audit export`: the trail from a seq or a time onward, as JSON lines or OCSF events,
// each record with its keyed chain fields and the keyless export chain (audit_export_proof.ts)
// that a receiver without the key recomputes; the last line is the head. Reads only, in one
// snapshot, so the segment and its head agree while the server keeps appending.

import {
  canonicalBody,
  EXPORT_GENESIS,
  exportLink,
  type ExportedRecord,
} from "./audit_export_proof.js";
import type { AuditRecord } from "./audit_record.js";
import type { SqliteDb } from "./sqlite.js";

export type ExportFormat = "jsonl" | "ocsf";

export interface ExportOptions {
  /** The first record: a seq (integer ≥ 1) or an ISO time (the first record at or after it). */
  since: number | string;
  format: ExportFormat;
  /** The key that chains the trail (named in the head line; null when unkeyed). */
  keyId: string | null;
  /** What the head line says the export was made at. */
  now?: () => Date;
}

export interface ExportSummary {
  records: number;
  first_seq: number | null;
  head: { seq: number; hash: string; export_hash: string };
}

interface Row {
  seq: number;
  record: string;
  prev_hash: string;
  hash: string;
}

/** JSON with every non-ASCII character escaped: safe on a terminal, and the same value parsed. */
export function asciiJson(v: unknown): string {
  return JSON.stringify(v).replace(
    /[\u007f-\uffff]/g,
    (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`,
  );
}

/**
 * The export hash after record `seq` and every record before it: the keyless chain's head
 * (`tpu-mcp audit head`). Walks the trail from record 1 (one SHA-256 per record).
 */
export function exportHashAt(db: SqliteDb, seq: number): string {
  let prev = EXPORT_GENESIS;
  const rows = db
    .prepare("SELECT * FROM audit_log WHERE seq <= ? ORDER BY seq")
    .iterate(seq) as Iterable<Row>;
  for (const r of rows) prev = link(prev, r);
  return prev;
}

function link(prev: string, r: Row): string {
  const rec = JSON.parse(r.record) as Record<string, unknown>;
  return exportLink(prev, r.prev_hash, r.hash, canonicalBody({ ...rec, seq: r.seq }));
}

/** The first seq to export for `since` (null: no record at or after it). */
function firstSeq(db: SqliteDb, since: number | string): number | null {
  if (typeof since === "number") {
    const r = db.prepare("SELECT min(seq) AS s FROM audit_log WHERE seq >= ?").get(since) as {
      s: number | null;
    };
    return r.s;
  }
  const r = db
    .prepare("SELECT min(seq) AS s FROM audit_log WHERE json_extract(record, '$.time') >= ?")
    .get(new Date(since).toISOString()) as { s: number | null };
  return r.s;
}

/** Parses `--since`: a seq or an ISO time; throws with what to give instead. */
export function parseSince(text: string): number | string {
  if (/^\d+$/.test(text)) {
    const n = Number(text);
    if (n >= 1) return n;
  }
  if (/^\d{4}-\d{2}-\d{2}/.test(text) && !Number.isNaN(Date.parse(text))) return text;
  throw new Error(
    `--since ${text}: give a record's seq (an integer ≥ 1) or an ISO time such as 2026-12-01T00:00:00Z`,
  );
}

const SUCCESS = new Set(["allowed", "executed", "approval_granted", "chain_keyed"]);
const FAILURE = new Set(["denied", "failed", "approval_denied", "approval_expired", "interrupted"]);
const PRODUCT = { name: "tpu-mcp", vendor_name: "tpu-mcp" };

/** An OCSF API Activity (6003) event for one record; the proof fields stay in `unmapped`. */
function ocsfEvent(p: ExportedRecord): Record<string, unknown> {
  const r = p.record as unknown as AuditRecord;
  const statusId = SUCCESS.has(r.outcome) ? 1 : FAILURE.has(r.outcome) ? 2 : 99;
  return {
    class_uid: 6003,
    class_name: "API Activity",
    category_uid: 6,
    category_name: "Application Activity",
    activity_id: 99,
    activity_name: r.outcome,
    type_uid: 600399,
    severity_id: statusId === 2 ? 3 : 1,
    time: Date.parse(r.time),
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

/**
 * Writes the export line by line through `write` (one JSON text per call, no newline) and
 * returns what it holds. Runs in one read transaction of `db`.
 */
export function exportTrail(
  db: SqliteDb,
  opts: ExportOptions,
  write: (line: string) => void,
): ExportSummary {
  return db.transaction(() => {
    const from = firstSeq(db, opts.since);
    const head = db.prepare("SELECT seq, hash FROM audit_head WHERE id = 1").get() as
      { seq: number; hash: string } | undefined;
    let prev = exportHashAt(db, (from ?? (head?.seq ?? 0) + 1) - 1);
    let records = 0;
    let lastSeq = from === null ? (head?.seq ?? 0) : from - 1;
    let lastHash = head?.hash ?? EXPORT_GENESIS;
    if (from !== null) {
      const rows = db
        .prepare("SELECT * FROM audit_log WHERE seq >= ? ORDER BY seq")
        .iterate(from) as Iterable<Row>;
      for (const r of rows) {
        const record = JSON.parse(r.record) as Record<string, unknown>;
        const exportHash = exportLink(
          prev,
          r.prev_hash,
          r.hash,
          canonicalBody({ ...record, seq: r.seq }),
        );
        const p: ExportedRecord = {
          seq: r.seq,
          record,
          prev_hash: r.prev_hash,
          hash: r.hash,
          export_prev: prev,
          export_hash: exportHash,
        };
        write(asciiJson(opts.format === "ocsf" ? ocsfEvent(p) : { type: "audit_record", ...p }));
        prev = exportHash;
        lastSeq = r.seq;
        lastHash = r.hash;
        records++;
      }
    }
    const h = {
      seq: lastSeq,
      hash: lastHash,
      export_hash: prev,
      key_id: opts.keyId,
      first_seq: from,
      records,
      exported_at: (opts.now?.() ?? new Date()).toISOString(),
    };
    write(
      asciiJson(
        opts.format === "ocsf"
          ? {
              class_uid: 6003,
              category_uid: 6,
              activity_id: 99,
              activity_name: "audit_export_head",
              type_uid: 600399,
              severity_id: 1,
              time: Date.parse(h.exported_at),
              status_id: 1,
              metadata: { version: "1.1.0", product: PRODUCT, log_name: "audit" },
              unmapped: { tpu_mcp_audit_head: h },
            }
          : { type: "audit_head", ...h },
      ),
    );
    return {
      records,
      first_seq: from,
      head: { seq: lastSeq, hash: lastHash, export_hash: prev },
    };
  })();
}
