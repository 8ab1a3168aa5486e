// The audit trail: one record per decision, hash-chained so an edited, deleted or reordered
// record is detectable, and mirrored as a pino line so logs shipped elsewhere anchor the chain.

import { canonicalJson, sha256Hex } from "./digest.js";
import type { CostEstimate } from "./estimate.js";
import { resolveDb, type SqliteDb } from "./sqlite.js";

export type AuditOutcome =
  | "allowed"
  | "denied"
  | "approval_requested"
  | "approval_granted"
  | "approval_denied"
  | "approval_expired"
  | "executed"
  | "failed";

export interface AuditRecord {
  time: string;
  principal: string;
  tool: string;
  args_digest: string | null;
  /** Arguments with bulky or sensitive fields replaced by summaries (see redactArgs). */
  args?: unknown;
  estimate?: CostEstimate | null;
  outcome: AuditOutcome;
  reason?: string;
  code?: string;
  duration_ms?: number;
  approval_id?: string;
  approver?: string;
}

export interface StoredAuditRecord extends AuditRecord {
  seq: number;
  prev_hash: string;
  hash: string;
}

export interface AuditVerifyResult {
  ok: boolean;
  checked: number;
  first_bad_seq?: number;
  reason: string;
}

export interface AuditLog {
  append(record: AuditRecord): StoredAuditRecord;
  /**
   * Group commit: resolves once the record is committed, in one transaction with the other
   * records appended in the same event-loop turn (concurrent calls share a commit). Optional;
   * the gate falls back to `append`.
   */
  appendDurable?(record: AuditRecord): Promise<StoredAuditRecord>;
  tail(n: number): StoredAuditRecord[];
  verify(): AuditVerifyResult;
  close(): void;
}

/** The part of a pino logger the policies use; a pino Logger satisfies it. */
export interface PolicyLogger {
  info(obj: object, msg?: string): void;
  warn(obj: object, msg?: string): void;
  error(obj: object, msg?: string): void;
}

export const GENESIS_HASH = "0".repeat(64);

export function chainHash(prevHash: string, seq: number, record: AuditRecord): string {
  return sha256Hex(prevHash + canonicalJson({ ...record, seq }));
}

function summarise(v: unknown): unknown {
  if (typeof v === "string") return { redacted: true, chars: v.length };
  if (Array.isArray(v)) {
    if (v.every((x) => typeof x === "string")) {
      return {
        redacted: true,
        count: v.length,
        total_chars: v.reduce((s: number, x: string) => s + x.length, 0),
      };
    }
    const shapes = v.slice(0, 16).map((x) => {
      const t = (x ?? {}) as Record<string, unknown>;
      return Array.isArray(t.shape)
        ? { dtype: t.dtype ?? null, shape: t.shape }
        : { type: typeof x };
    });
    return { redacted: true, count: v.length, items: shapes };
  }
  if (v && typeof v === "object") {
    const t = v as Record<string, unknown>;
    if (Array.isArray(t.shape)) return { redacted: true, dtype: t.dtype ?? null, shape: t.shape };
    return { redacted: true, keys: Object.keys(t).length };
  }
  return { redacted: true };
}

/** Replaces the named arguments (at any depth) with length/shape summaries. */
export function redactArgs(args: unknown, names: readonly string[]): unknown {
  const set = new Set(names);
  const walk = (v: unknown): unknown => {
    if (Array.isArray(v)) return v.map(walk);
    if (v && typeof v === "object" && !ArrayBuffer.isView(v)) {
      const out: Record<string, unknown> = {};
      for (const [k, x] of Object.entries(v as Record<string, unknown>)) {
        if (x === undefined) continue;
        out[k] = set.has(k) ? summarise(x) : walk(x);
      }
      return out;
    }
    if (ArrayBuffer.isView(v)) return { redacted: true, bytes: v.byteLength };
    return v;
  };
  return walk(args);
}

interface Row {
  seq: number;
  record: string;
  prev_hash: string;
  hash: string;
}

export class SqliteAuditLog implements AuditLog {
  private readonly db: SqliteDb;
  private readonly owned: boolean;
  private readonly logger?: PolicyLogger;

  constructor(pathOrDb: string | SqliteDb, opts: { logger?: PolicyLogger } = {}) {
    ({ db: this.db, owned: this.owned } = resolveDb(pathOrDb));
    this.logger = opts.logger;
    // audit_head remembers the last seq and hash, so removing records from the end also shows.
    this.db.exec(`CREATE TABLE IF NOT EXISTS audit_log (
      seq INTEGER PRIMARY KEY,
      record TEXT NOT NULL,
      prev_hash TEXT NOT NULL,
      hash TEXT NOT NULL
    );
    CREATE TABLE IF NOT EXISTS audit_head (
      id INTEGER PRIMARY KEY CHECK (id = 1),
      seq INTEGER NOT NULL,
      hash TEXT NOT NULL
    );`);
  }

  // Prepared once: every tool call appends at least twice, and preparing costs more than running.
  private tx?: ((clean: AuditRecord) => StoredAuditRecord) & {
    immediate: (clean: AuditRecord) => StoredAuditRecord;
  };
  private appendTx() {
    if (this.tx) return this.tx;
    const headStmt = this.db.prepare("SELECT seq, hash FROM audit_head WHERE id = 1");
    const insertStmt = this.db.prepare(
      "INSERT INTO audit_log (seq, record, prev_hash, hash) VALUES (?, ?, ?, ?)",
    );
    const headUpsert = this.db.prepare(
      "INSERT INTO audit_head (id, seq, hash) VALUES (1, ?, ?) ON CONFLICT(id) DO UPDATE SET seq = excluded.seq, hash = excluded.hash",
    );
    this.tx = this.db.transaction((clean: AuditRecord): StoredAuditRecord => {
      const head = headStmt.get() as { seq: number; hash: string } | undefined;
      const seq = (head?.seq ?? 0) + 1;
      const prev = head?.hash ?? GENESIS_HASH;
      const hash = chainHash(prev, seq, clean);
      insertStmt.run(seq, canonicalJson(clean), prev, hash);
      headUpsert.run(seq, hash);
      return { ...clean, seq, prev_hash: prev, hash };
    }) as any;
    return this.tx!;
  }

  append(record: AuditRecord): StoredAuditRecord {
    // Drop undefined fields so the stored JSON and the hashed canonical form agree.
    const clean = JSON.parse(canonicalJson(record)) as AuditRecord;
    const tx = this.appendTx();
    // IMMEDIATE: the server and the CLI may append at once; each must see the other's head.
    const stored = tx.immediate(clean);
    this.logger?.info({ audit: stored }, `audit ${stored.outcome} ${stored.tool}`);
    return stored;
  }

  // Group commit. A commit (BEGIN IMMEDIATE … COMMIT, one WAL write) costs several times what
  // one more row in it costs, and every tool call appends twice, so under concurrency records
  // queued in the same event-loop turn are chained and committed together. Each caller still
  // gets its answer only after its own record is committed (durable against a server crash:
  // WAL with synchronous=NORMAL), and a lone caller waits one setImmediate, not a timer.
  private queued: Array<{
    clean: AuditRecord;
    resolve: (r: StoredAuditRecord) => void;
    reject: (e: unknown) => void;
  }> = [];
  private flushScheduled = false;
  private manyTx?: ((batch: AuditRecord[]) => StoredAuditRecord[]) & {
    immediate: (batch: AuditRecord[]) => StoredAuditRecord[];
  };

  appendDurable(record: AuditRecord): Promise<StoredAuditRecord> {
    let clean: AuditRecord;
    try {
      clean = JSON.parse(canonicalJson(record)) as AuditRecord;
    } catch (e) {
      return Promise.reject(e);
    }
    return new Promise((resolve, reject) => {
      this.queued.push({ clean, resolve, reject });
      if (!this.flushScheduled) {
        this.flushScheduled = true;
        setImmediate(() => this.flush());
      }
    });
  }

  private flush(): void {
    this.flushScheduled = false;
    const batch = this.queued.splice(0);
    if (batch.length === 0) return;
    let stored: StoredAuditRecord[];
    try {
      if (!this.manyTx) {
        const one = this.appendTx();
        this.manyTx = this.db.transaction((records: AuditRecord[]) =>
          records.map((r) => one(r)),
        ) as any;
      }
      stored = this.manyTx!.immediate(batch.map((b) => b.clean));
    } catch (e) {
      for (const b of batch) b.reject(e);
      return;
    }
    batch.forEach((b, i) => {
      this.logger?.info({ audit: stored[i] }, `audit ${stored[i].outcome} ${stored[i].tool}`);
      b.resolve(stored[i]);
    });
  }

  tail(n: number): StoredAuditRecord[] {
    const rows = this.db
      .prepare("SELECT * FROM audit_log ORDER BY seq DESC LIMIT ?")
      .all(Math.max(0, Math.floor(n))) as Row[];
    return rows.reverse().map((r) => ({
      ...(JSON.parse(r.record) as AuditRecord),
      seq: r.seq,
      prev_hash: r.prev_hash,
      hash: r.hash,
    }));
  }

  verify(): AuditVerifyResult {
    let expectedSeq = 1;
    let prev = GENESIS_HASH;
    let checked = 0;
    const bad = (seq: number, reason: string): AuditVerifyResult => ({
      ok: false,
      checked,
      first_bad_seq: seq,
      reason,
    });
    for (const r of this.db
      .prepare("SELECT * FROM audit_log ORDER BY seq")
      .iterate() as Iterable<Row>) {
      if (r.seq !== expectedSeq)
        return bad(expectedSeq, `record ${expectedSeq} is missing (next present is ${r.seq})`);
      if (r.prev_hash !== prev)
        return bad(
          r.seq,
          `record ${r.seq} does not follow record ${r.seq - 1} (prev_hash differs)`,
        );
      let rec: AuditRecord;
      try {
        rec = JSON.parse(r.record) as AuditRecord;
      } catch {
        return bad(r.seq, `record ${r.seq} is not valid JSON`);
      }
      if (chainHash(prev, r.seq, rec) !== r.hash || r.record !== canonicalJson(rec)) {
        return bad(r.seq, `record ${r.seq} was modified (hash does not match its content)`);
      }
      prev = r.hash;
      expectedSeq++;
      checked++;
    }
    const head = this.db.prepare("SELECT seq, hash FROM audit_head WHERE id = 1").get() as
      { seq: number; hash: string } | undefined;
    const lastSeq = expectedSeq - 1;
    if (head && head.seq > lastSeq) {
      return bad(lastSeq + 1, `records ${lastSeq + 1}..${head.seq} are missing from the end`);
    }
    if (head && (head.seq !== lastSeq || head.hash !== prev)) {
      return bad(lastSeq, `the head (seq ${head.seq}) does not match the last record ${lastSeq}`);
    }
    if (!head && checked > 0) return bad(1, "audit head is missing");
    return {
      ok: true,
      checked,
      reason: checked === 0 ? "empty log" : `${checked} records chain correctly`,
    };
  }

  close(): void {
    if (this.owned && this.db.open) this.db.close();
  }
}
