// Reading the trail for people: the last records (`tpu-mcp audit tail`), a filtered window (the
// console's audit page) and the head an operator exports. Reads only, and never a verification:
// that is audit_chain.ts's walk, run off the request path (audit_verify.ts).

import { GENESIS_HASH, type AuditHead } from "./audit_chain.js";
import type { AuditOutcome, AuditRecord, StoredAuditRecord } from "./audit_record.js";
import type { SqliteDb } from "./sqlite.js";

interface Row {
  seq: number;
  record: string;
  prev_hash: string;
  hash: string;
}

export interface AuditSearch {
  window: number;
  limit: number;
  principal?: string;
  tool?: string;
  outcome?: AuditOutcome;
}

function stored(r: Row): StoredAuditRecord {
  return {
    ...(JSON.parse(r.record) as AuditRecord),
    seq: r.seq,
    prev_hash: r.prev_hash,
    hash: r.hash,
  };
}

/** The last `n` records, oldest first. */
export function tailRecords(db: SqliteDb, n: number): StoredAuditRecord[] {
  const rows = db
    .prepare("SELECT * FROM audit_log ORDER BY seq DESC LIMIT ?")
    .all(Math.max(0, Math.floor(n))) as Row[];
  return rows.reverse().map(stored);
}

/** Records carrying passkey evidence, oldest first, read one at a time. */
export function* signedDecisionRecords(db: SqliteDb): IterableIterator<StoredAuditRecord> {
  const q = db.prepare(
    "SELECT * FROM audit_log WHERE json_extract(record, '$.evidence') IS NOT NULL ORDER BY seq",
  );
  for (const r of q.iterate() as IterableIterator<Row>) yield stored(r);
}

/**
 * The first `limit` records, oldest first, among the last `window` that match the filters
 * (filtered in SQLite: only the matches are parsed), and how many records the window held.
 */
export function searchRecords(
  db: SqliteDb,
  q: AuditSearch,
): { records: StoredAuditRecord[]; scanned: number } {
  const window = Math.max(0, Math.floor(q.window));
  // The window's first seq and size from the index alone; then only its matching rows are read.
  const w = db
    .prepare(
      "SELECT min(seq) AS lo, count(*) AS n FROM (SELECT seq FROM audit_log ORDER BY seq DESC LIMIT ?)",
    )
    .get(window) as { lo: number | null; n: number };
  const where = ["seq >= ?"];
  const params: unknown[] = [w.lo ?? Number.MAX_SAFE_INTEGER];
  for (const [field, value] of [
    ["principal", q.principal],
    ["tool", q.tool],
    ["outcome", q.outcome],
  ] as const) {
    if (value === undefined) continue;
    where.push(`json_extract(record, '$.${field}') = ?`);
    params.push(value);
  }
  const rows = db
    .prepare(`SELECT * FROM audit_log WHERE ${where.join(" AND ")} ORDER BY seq LIMIT ?`)
    .all(...params, Math.max(0, Math.floor(q.limit))) as Row[];
  return { records: rows.map(stored), scanned: w.n };
}

/** The last record's position, hash and time; `keyId` is the anchored key's id (or null). */
export function readHead(db: SqliteDb, keyId: string | null): AuditHead {
  const h = db.prepare("SELECT seq, hash FROM audit_head WHERE id = 1").get() as
    { seq: number; hash: string } | undefined;
  if (!h) return { seq: 0, hash: GENESIS_HASH, time: null, key_id: keyId };
  const r = db.prepare("SELECT record FROM audit_log WHERE seq = ?").get(h.seq) as
    { record: string } | undefined;
  const time = r ? ((JSON.parse(r.record) as AuditRecord).time ?? null) : null;
  return { seq: h.seq, hash: h.hash, time, key_id: keyId };
}
