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
import { asciiJson, headLine, recordLine, type ExportFormat } from "./audit_export_line.js";
import type { ChainRow } from "./audit_chain.js";
import type { SqliteDb } from "./sqlite.js";

export type { ExportFormat };

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

type Row = ChainRow;

/**
 * The export hash after record `seq` and every record before it: the keyless chain's head
 * (`tpu-mcp audit head`). Walks the trail from record 1 (one SHA-256 per record).
 */
export function exportHashAt(db: SqliteDb, seq: number): string {
  let prev = EXPORT_GENESIS;
  const rows = db
    .prepare("SELECT * FROM audit_log WHERE seq <= ? ORDER BY seq")
    .iterate(seq) as Iterable<Row>;
  for (const r of rows) prev = exportLinkOf(prev, r);
  return prev;
}

/** The keyless chain's next hash after `prev`, for one stored row (any backend's). */
export function exportLinkOf(prev: string, r: Row): string {
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

/**
 * The lines of one export, in order: each stored row given to `add` becomes its line, `finish`
 * writes the head line. Backend-neutral (SQLite's exportTrail below, Postgres's
 * server/stores/audit/postgres.ts), so every store exports the same bytes.
 */
export class ExportWriter {
  private records = 0;
  private lastSeq: number;
  private lastHash: string;

  /**
   * `prev`: the export hash after record `from - 1`; `head`: the trail's head row, which is
   * where an export with no record at or after `since` ends.
   */
  constructor(
    private prev: string,
    private readonly from: number | null,
    head: { seq: number; hash: string } | undefined,
    private readonly opts: ExportOptions,
    private readonly write: (line: string) => void,
  ) {
    this.lastSeq = from === null ? (head?.seq ?? 0) : from - 1;
    this.lastHash = head?.hash ?? EXPORT_GENESIS;
  }

  add(r: Row): void {
    const record = JSON.parse(r.record) as Record<string, unknown>;
    const exportHash = exportLink(
      this.prev,
      r.prev_hash,
      r.hash,
      canonicalBody({ ...record, seq: r.seq }),
    );
    const p: ExportedRecord = {
      seq: r.seq,
      record,
      prev_hash: r.prev_hash,
      hash: r.hash,
      export_prev: this.prev,
      export_hash: exportHash,
    };
    this.write(asciiJson(recordLine(p, this.opts.format)));
    this.prev = exportHash;
    this.lastSeq = r.seq;
    this.lastHash = r.hash;
    this.records++;
  }

  finish(): ExportSummary {
    const opts = this.opts;
    const h = {
      seq: this.lastSeq,
      hash: this.lastHash,
      export_hash: this.prev,
      key_id: opts.keyId,
      first_seq: this.from,
      records: this.records,
      exported_at: (opts.now?.() ?? new Date()).toISOString(),
    };
    this.write(asciiJson(headLine(h, opts.format)));
    return {
      records: this.records,
      first_seq: this.from,
      head: { seq: this.lastSeq, hash: this.lastHash, export_hash: this.prev },
    };
  }
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
    const prev = exportHashAt(db, (from ?? (head?.seq ?? 0) + 1) - 1);
    const out = new ExportWriter(prev, from, head, opts, write);
    if (from !== null) {
      const rows = db
        .prepare("SELECT * FROM audit_log WHERE seq >= ? ORDER BY seq")
        .iterate(from) as Iterable<Row>;
      for (const r of rows) out.add(r);
    }
    return out.finish();
  })();
}
