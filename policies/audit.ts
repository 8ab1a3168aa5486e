// The audit trail: one record per decision, chained with HMAC-SHA256 under a key kept outside the
// database, so an edited, deleted, reordered or recomputed record is detectable by whoever holds
// the key, and mirrored as a pino line so logs shipped elsewhere anchor the chain too. The first
// keyed record ("chain_keyed") pins everything before it; a trail without it while the key
// exists was wiped or replaced. `head()` is what an operator exports to prove later that nothing
// was rolled back.

import { createHmac } from "node:crypto";
import { ephemeralAuditKey, type AuditKey } from "./audit_key.js";
import { canonicalJson, sha256Hex } from "./digest.js";
import type { CostEstimate } from "./estimate.js";
import { resolveDb, type SqliteDb } from "./sqlite.js";
import type { Statement, Transaction } from "better-sqlite3";

export type AuditOutcome =
  | "allowed"
  | "denied"
  | "approval_requested"
  | "approval_granted"
  | "approval_denied"
  | "approval_expired"
  | "executed"
  | "failed"
  /** The first record under a key: from here on every record is HMAC'd with that key. */
  | "chain_keyed";

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
  /** On chain_keyed records: the id of the key that chains the records from here on. */
  key_id?: string;
  /** The worker(s) of a pool the call ran on (comma-separated). */
  worker?: string;
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

/**
 * How far verification has got: records 1..seq chain correctly, the last with `hash`. Stored
 * MAC'd with the audit key (a checkpoint someone without the key writes is caught), so that a
 * server verifies only the records after it.
 */
export interface AuditCheckpoint {
  seq: number;
  hash: string;
  /** The chain_keyed record's seq when it is at or before `seq` (null: not yet keyed). */
  keyed_from: number | null;
  verified_at: string;
}

/** A verification in progress (see SqliteAuditLog.walk). */
export interface VerifyCursor {
  expectedSeq: number;
  prev: string;
  keyed: boolean;
  keyedFrom: number | null;
  foreignKey: string | null;
  /** Records verified so far, those before a checkpoint included. */
  checked: number;
}

/** The last record's position and hash: an operator stores it elsewhere (`tpu-mcp audit head`). */
export interface AuditHead {
  seq: number;
  hash: string;
  /** The time of the record at `seq` (null for an empty trail). */
  time: string | null;
  key_id: string | null;
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
  head(): AuditHead;
  verify(opts?: { head?: AuditHead }): AuditVerifyResult;
  close(): void;
}

/** The part of a pino logger the policies use; a pino Logger satisfies it. */
export interface PolicyLogger {
  info(obj: object, msg?: string): void;
  warn(obj: object, msg?: string): void;
  error(obj: object, msg?: string): void;
}

export const GENESIS_HASH = "0".repeat(64);

/** The unkeyed chain of trails written before the key existed (kept to verify them). */
export function chainHash(prevHash: string, seq: number, record: AuditRecord): string {
  return sha256Hex(prevHash + canonicalJson({ ...record, seq }));
}

export function keyedChainHash(
  key: Buffer,
  prevHash: string,
  seq: number,
  record: AuditRecord,
): string {
  return chainMac(key, prevHash, canonicalJson({ ...record, seq }));
}

/** The keyed link: HMAC-SHA256 of the previous hash and the record's canonical text with seq. */
function chainMac(key: Buffer, prevHash: string, canonicalWithSeqText: string): string {
  return createHmac("sha256", key)
    .update(prevHash + canonicalWithSeqText, "utf8")
    .digest("hex");
}

/** A record made ready to chain: undefined members dropped, each member formatted once. */
export interface PreparedRecord {
  clean: AuditRecord;
  /** Canonical `"name":value` texts of its members, sorted by name (no `seq`). */
  members: string[];
  /** Where `"seq":N` sorts among them. */
  seqAt: number;
}

/** Throws (PolicyError) for a record with no JSON form, before it can join a batch. */
export function prepareRecord(record: AuditRecord): PreparedRecord {
  const clean = withoutUndefined(record) as AuditRecord;
  const rec = clean as unknown as Record<string, unknown>;
  const keys = Object.keys(rec).filter((k) => k !== "seq");
  keys.sort();
  const members = keys.map((k) => `${JSON.stringify(k)}:${canonicalJson(rec[k])}`);
  const seqAt = keys.findIndex((k) => k > "seq");
  return { clean, members, seqAt: seqAt === -1 ? keys.length : seqAt };
}

/**
 * The canonical JSON of a prepared record as stored, and with `seq` in its sorted place as
 * hashed: the same text `canonicalJson({...record, seq})` (keyedChainHash, verify) writes.
 */
export function canonicalWithSeq(
  p: PreparedRecord,
  seq: number,
): { stored: string; hashed: string } {
  const withSeq = [...p.members];
  withSeq.splice(p.seqAt, 0, `"seq":${seq}`);
  return { stored: `{${p.members.join(",")}}`, hashed: `{${withSeq.join(",")}}` };
}

/** A copy without undefined members (what JSON would keep), so stored and hashed forms agree. */
function withoutUndefined(v: unknown): unknown {
  if (Array.isArray(v)) return v.map((x) => (x === undefined ? null : withoutUndefined(x)));
  if (v && typeof v === "object" && !(v instanceof Date)) {
    const out: Record<string, unknown> = {};
    for (const k of Object.keys(v)) {
      const x = (v as Record<string, unknown>)[k];
      if (x !== undefined) out[k] = withoutUndefined(x);
    }
    return out;
  }
  return v;
}

function headMac(key: Buffer, seq: number, hash: string): string {
  return createHmac("sha256", key).update(`audit-head\u0000${seq}\u0000${hash}`).digest("hex");
}

function checkpointMac(key: Buffer, cp: AuditCheckpoint): string {
  return createHmac("sha256", key)
    .update(
      `audit-checkpoint\u0000${cp.seq}\u0000${cp.hash}\u0000${cp.keyed_from ?? ""}\u0000${cp.verified_at}`,
    )
    .digest("hex");
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

export interface AuditLogOptions {
  logger?: PolicyLogger;
  /**
   * The chain key (see audit_key.ts). Absent: a random key of this process only, and no
   * chain_keyed anchor (tests and throwaway stores). null: no key available; the log can be read
   * and an unkeyed (pre-key) trail verified, but nothing may be appended.
   */
  key?: AuditKey | null;
  /** The key file was made just now: start the keyed chain (migrating an unkeyed trail). */
  keyCreated?: boolean;
  /** Told how many records each verification step read and hashed (tests count work per turn). */
  onRowsHashed?: (rows: number) => void;
}

export class SqliteAuditLog implements AuditLog {
  private readonly db: SqliteDb;
  private readonly owned: boolean;
  private readonly logger?: PolicyLogger;
  private readonly key: AuditKey | null;
  /** Whether the trail must contain a chain_keyed record for the key (false for ephemeral keys). */
  private readonly anchored: boolean;
  private readonly onRowsHashed?: (rows: number) => void;

  constructor(pathOrDb: string | SqliteDb, opts: AuditLogOptions = {}) {
    ({ db: this.db, owned: this.owned } = resolveDb(pathOrDb));
    this.logger = opts.logger;
    this.key = opts.key === undefined ? ephemeralAuditKey() : opts.key;
    this.anchored = opts.key !== undefined;
    this.onRowsHashed = opts.onRowsHashed;
    // audit_head remembers the last seq and hash (with a MAC), so removing records from the end
    // and rewriting the head to match also shows.
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
    // Databases from before the key: the head gains its MAC column (filled on the next append).
    const cols = this.db.prepare("PRAGMA table_info(audit_head)").all() as { name: string }[];
    if (!cols.some((c) => c.name === "mac"))
      this.db.exec("ALTER TABLE audit_head ADD COLUMN mac TEXT");
    if (this.key && this.anchored) this.startChain(this.key, opts.keyCreated === true);
  }

  /** The seq of the chain_keyed record for this key, null when there is none. */
  private keyedSince(key: AuditKey): number | null {
    const row = this.db
      .prepare(
        `SELECT seq, json_extract(record, '$.key_id') AS key_id FROM audit_log
         WHERE json_extract(record, '$.outcome') = 'chain_keyed' ORDER BY seq DESC LIMIT 1`,
      )
      .get() as { seq: number; key_id: string } | undefined;
    if (!row) return null;
    if (row.key_id !== key.id) {
      throw new Error(
        `the audit trail is chained with key ${row.key_id}, but ${key.path} holds key ${key.id}: restore the original key file (or archive the database and the key together to start a new trail)`,
      );
    }
    return row.seq;
  }

  private startChain(key: AuditKey, created: boolean): void {
    if (this.keyedSince(key) !== null) return;
    const head = this.db.prepare("SELECT seq FROM audit_head WHERE id = 1").get() as
      { seq: number } | undefined;
    const count = head?.seq ?? 0;
    if (!created) {
      // The key existed before, yet the trail has no record of it: wiped, or replaced.
      this.logger?.error(
        { audit_key: key.id, key_created_at: key.created_at, records: count },
        "audit trail reset: the key exists but the trail has no chain_keyed record for it; run `tpu-mcp audit verify`",
      );
      return;
    }
    this.append({
      time: new Date().toISOString(),
      principal: "tpu-mcp",
      tool: "audit",
      args_digest: null,
      outcome: "chain_keyed",
      key_id: key.id,
      reason:
        count > 0
          ? `records 1..${count} predate the key: they are hash-chained only, and pinned by this record`
          : "new trail",
    });
  }

  // Prepared once: every tool call appends at least twice, and preparing costs more than running.
  private stmts?: {
    head: Statement;
    insert: Statement;
    upsertHead: Statement;
  };

  /**
   * Chains and inserts `records` after the current head, then moves the head once (one MAC per
   * batch, not per record). Runs inside a transaction (the caller's). Each record is written as
   * canonical JSON once: its members are formatted a single time for both the stored text and the
   * hashed form (the same members with `seq` in its sorted place), identical to
   * `keyedChainHash`, which `verify` uses.
   */
  private chainInsert(key: AuditKey, records: PreparedRecord[]): StoredAuditRecord[] {
    this.stmts ??= {
      head: this.db.prepare("SELECT seq, hash FROM audit_head WHERE id = 1"),
      insert: this.db.prepare(
        "INSERT INTO audit_log (seq, record, prev_hash, hash) VALUES (?, ?, ?, ?)",
      ),
      upsertHead: this.db.prepare(
        "INSERT INTO audit_head (id, seq, hash, mac) VALUES (1, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET seq = excluded.seq, hash = excluded.hash, mac = excluded.mac",
      ),
    };
    const st = this.stmts;
    const head = st.head.get() as { seq: number; hash: string } | undefined;
    let seq = head?.seq ?? 0;
    let prev = head?.hash ?? GENESIS_HASH;
    const out: StoredAuditRecord[] = [];
    for (const p of records) {
      seq += 1;
      const { stored, hashed } = canonicalWithSeq(p, seq);
      const hash = chainMac(key.key, prev, hashed);
      st.insert.run(seq, stored, prev, hash);
      out.push({ ...p.clean, seq, prev_hash: prev, hash });
      prev = hash;
    }
    if (out.length) st.upsertHead.run(seq, prev, headMac(key.key, seq, prev));
    return out;
  }

  private tx?: Transaction<(records: PreparedRecord[]) => StoredAuditRecord[]>;
  private appendTx(key: AuditKey) {
    this.tx ??= this.db.transaction((records: PreparedRecord[]) => this.chainInsert(key, records));
    return this.tx;
  }

  append(record: AuditRecord): StoredAuditRecord {
    if (!this.key) throw new Error("the audit key is missing: this audit log is read-only");
    // Undefined fields dropped, so the stored JSON and the hashed canonical form agree.
    const prepared = prepareRecord(record);
    // IMMEDIATE: the server and the CLI may append at once; each must see the other's head.
    const [stored] = this.appendTx(this.key).immediate([prepared]);
    this.logger?.info({ audit: stored }, `audit ${stored.outcome} ${stored.tool}`);
    return stored;
  }

  // Group commit. A commit (BEGIN IMMEDIATE … COMMIT, one WAL write) costs several times what
  // one more row in it costs, and every tool call appends twice, so under concurrency records
  // queued in the same event-loop turn are chained and committed together. Each caller still
  // gets its answer only after its own record is committed (durable against a server crash:
  // WAL with synchronous=NORMAL), and a lone caller waits one setImmediate, not a timer.
  private queued: Array<{
    prepared: PreparedRecord;
    resolve: (r: StoredAuditRecord) => void;
    reject: (e: unknown) => void;
  }> = [];
  private flushScheduled = false;

  appendDurable(record: AuditRecord): Promise<StoredAuditRecord> {
    let prepared: PreparedRecord;
    try {
      prepared = prepareRecord(record);
    } catch (e) {
      return Promise.reject(e);
    }
    return new Promise((resolve, reject) => {
      this.queued.push({ prepared, resolve, reject });
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
      if (!this.key) throw new Error("the audit key is missing: this audit log is read-only");
      stored = this.appendTx(this.key).immediate(batch.map((b) => b.prepared));
    } catch (e) {
      for (const b of batch) b.reject(e);
      return;
    }
    const log = this.logger;
    batch.forEach((b, i) => {
      log?.info({ audit: stored[i] }, `audit ${stored[i].outcome} ${stored[i].tool}`);
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

  /**
   * The first `limit` records, oldest first, among the last `window` that match the filters
   * (filtered in SQLite: only the matches are parsed), and how many records the window held.
   */
  search(q: {
    window: number;
    limit: number;
    principal?: string;
    tool?: string;
    outcome?: AuditOutcome;
  }): { records: StoredAuditRecord[]; scanned: number } {
    const window = Math.max(0, Math.floor(q.window));
    // The window's first seq and size from the index alone; then only its matching rows are read.
    const w = this.db
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
    const rows = this.db
      .prepare(`SELECT * FROM audit_log WHERE ${where.join(" AND ")} ORDER BY seq LIMIT ?`)
      .all(...params, Math.max(0, Math.floor(q.limit))) as Row[];
    const n = w.n;
    return {
      records: rows.map((r) => ({
        ...(JSON.parse(r.record) as AuditRecord),
        seq: r.seq,
        prev_hash: r.prev_hash,
        hash: r.hash,
      })),
      scanned: n,
    };
  }

  head(): AuditHead {
    const h = this.db.prepare("SELECT seq, hash FROM audit_head WHERE id = 1").get() as
      { seq: number; hash: string } | undefined;
    if (!h) return { seq: 0, hash: GENESIS_HASH, time: null, key_id: this.anchoredKeyId() };
    const r = this.db.prepare("SELECT record FROM audit_log WHERE seq = ?").get(h.seq) as
      { record: string } | undefined;
    const time = r ? ((JSON.parse(r.record) as AuditRecord).time ?? null) : null;
    return { seq: h.seq, hash: h.hash, time, key_id: this.anchoredKeyId() };
  }

  private anchoredKeyId(): string | null {
    return this.key && this.anchored ? this.key.id : null;
  }

  /**
   * Full verification from the first record (the CLI's `audit verify`): every record parsed,
   * canonicalised and HMAC'd, then the head and the verification checkpoint. Costs time in
   * proportion to the trail; a server verifies incrementally instead (audit_verify.ts).
   */
  verify(opts: { head?: AuditHead } = {}): AuditVerifyResult {
    // One read transaction: rows and head from one snapshot, even while another process appends.
    return this.db.transaction(() => {
      const cur = this.cursorAt(null);
      const bad = this.walk(cur, Number.POSITIVE_INFINITY) ?? this.checkEnd(cur, opts.head);
      if (bad) return bad;
      const cp = this.readCheckpoint();
      if (cp.forged) return this.failure(cur, cp.forged.seq, cp.forged.reason);
      if (cp.checkpoint) {
        const r = this.db
          .prepare("SELECT hash FROM audit_log WHERE seq = ?")
          .get(cp.checkpoint.seq) as { hash: string } | undefined;
        if (cp.checkpoint.seq > 0 && r?.hash !== cp.checkpoint.hash)
          return this.failure(
            cur,
            cp.checkpoint.seq,
            `record ${cp.checkpoint.seq} differs from the verification checkpoint: the trail was rewritten after it was verified`,
          );
      }
      return this.success(cur, opts.head);
    })();
  }

  /**
   * Where a verification starts: the first record, or just after a checkpoint (whose MAC the
   * caller has checked), trusting what the checkpoint says about the records before it.
   */
  cursorAt(cp: AuditCheckpoint | null): VerifyCursor {
    if (!cp) {
      const keyed = !this.anchored;
      return {
        expectedSeq: 1,
        prev: GENESIS_HASH,
        keyed,
        keyedFrom: keyed ? 1 : null,
        foreignKey: null,
        checked: 0,
      };
    }
    return {
      expectedSeq: cp.seq + 1,
      prev: cp.hash,
      keyed: !this.anchored || cp.keyed_from !== null,
      keyedFrom: !this.anchored ? 1 : cp.keyed_from,
      foreignKey: null,
      checked: cp.seq,
    };
  }

  /**
   * Verifies up to `maxRows` records after the cursor, moving it; a failure, or null. Between
   * calls other records may be appended: the cursor carries on from where it stopped.
   */
  walk(cur: VerifyCursor, maxRows: number): AuditVerifyResult | null {
    const key = this.key;
    const bad = (seq: number, reason: string) => this.failure(cur, seq, reason);
    const rows = (
      Number.isFinite(maxRows)
        ? this.db
            .prepare("SELECT * FROM audit_log WHERE seq >= ? ORDER BY seq LIMIT ?")
            .iterate(cur.expectedSeq, Math.max(0, Math.floor(maxRows)))
        : this.db
            .prepare("SELECT * FROM audit_log WHERE seq >= ? ORDER BY seq")
            .iterate(cur.expectedSeq)
    ) as Iterable<Row>;
    let hashed = 0;
    try {
      for (const r of rows) {
        hashed++;
        if (r.seq !== cur.expectedSeq)
          return bad(
            cur.expectedSeq,
            `record ${cur.expectedSeq} is missing (next present is ${r.seq})`,
          );
        if (r.prev_hash !== cur.prev)
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
        if (r.record !== canonicalJson(rec))
          return bad(r.seq, `record ${r.seq} was modified (not in canonical form)`);
        if (!cur.keyed && rec.outcome === "chain_keyed") {
          if (!key) cur.foreignKey = rec.key_id ?? "?";
          else if (rec.key_id !== key.id)
            return bad(
              r.seq,
              `record ${r.seq} starts a chain under key ${rec.key_id}, but the key file holds key ${key.id}`,
            );
          else {
            cur.keyed = true;
            cur.keyedFrom = r.seq;
          }
        }
        if (cur.foreignKey) {
          return bad(
            r.seq,
            `the trail is chained with key ${cur.foreignKey} from record ${r.seq} on, and the key file is missing: restore it to verify`,
          );
        }
        if (cur.keyed) {
          if (keyedChainHash(key!.key, cur.prev, r.seq, rec) !== r.hash)
            return bad(
              r.seq,
              `record ${r.seq} was modified or rewritten (its HMAC does not match: the chain was recomputed without the key)`,
            );
        } else if (chainHash(cur.prev, r.seq, rec) !== r.hash) {
          if (key && keyedChainHash(key.key, cur.prev, r.seq, rec) === r.hash)
            return bad(
              r.seq,
              `record ${r.seq} is keyed but no chain_keyed record precedes it: the start of the trail was removed`,
            );
          return bad(r.seq, `record ${r.seq} was modified (hash does not match its content)`);
        }
        cur.prev = r.hash;
        cur.expectedSeq++;
        cur.checked++;
      }
      return null;
    } finally {
      this.onRowsHashed?.(hashed);
    }
  }

  /** After the last record: the head (position, hash, MAC), the key's anchor, an exported head. */
  checkEnd(cur: VerifyCursor, exported?: AuditHead): AuditVerifyResult | null {
    const key = this.key;
    const bad = (seq: number, reason: string) => this.failure(cur, seq, reason);
    const head = this.db.prepare("SELECT seq, hash, mac FROM audit_head WHERE id = 1").get() as
      { seq: number; hash: string; mac: string | null } | undefined;
    const lastSeq = cur.expectedSeq - 1;
    if (head && head.seq > lastSeq) {
      return bad(lastSeq + 1, `records ${lastSeq + 1}..${head.seq} are missing from the end`);
    }
    if (head && (head.seq !== lastSeq || head.hash !== cur.prev)) {
      return bad(lastSeq, `the head (seq ${head.seq}) does not match the last record ${lastSeq}`);
    }
    if (!head && cur.checked > 0) return bad(1, "audit head is missing");
    if (this.anchored && key && !cur.keyed) {
      return bad(
        lastSeq + 1,
        cur.checked === 0
          ? `the trail is empty, but the key ${key.id} (created ${key.created_at}) exists: the trail was wiped or the database replaced`
          : `no chain_keyed record for key ${key.id} (created ${key.created_at}): the trail was reset or rewritten without the key`,
      );
    }
    if (head && cur.keyed && key && lastSeq >= (cur.keyedFrom ?? 1)) {
      if (head.mac !== headMac(key.key, head.seq, head.hash))
        return bad(
          lastSeq,
          `the head row was rewritten (its MAC does not match): records after ${lastSeq} were probably removed`,
        );
    }
    if (exported) {
      const h = exported;
      if (h.key_id && key && this.anchored && h.key_id !== key.id)
        return bad(h.seq, `the exported head names key ${h.key_id}, the key file holds ${key.id}`);
      if (h.seq > lastSeq)
        return bad(
          lastSeq + 1,
          `the exported head is record ${h.seq}, but the trail ends at ${lastSeq}: records ${lastSeq + 1}..${h.seq} were removed`,
        );
      if (h.seq > 0) {
        const r = this.db.prepare("SELECT hash FROM audit_log WHERE seq = ?").get(h.seq) as
          { hash: string } | undefined;
        if (!r || r.hash !== h.hash)
          return bad(
            h.seq,
            `record ${h.seq} differs from the exported head: the trail was rewritten since the export`,
          );
      }
    }
    return null;
  }

  private failure(cur: VerifyCursor, seq: number, reason: string): AuditVerifyResult {
    return { ok: false, checked: cur.checked, first_bad_seq: seq, reason };
  }

  success(cur: VerifyCursor, exported?: AuditHead): AuditVerifyResult {
    const note = !this.key
      ? " (not keyed: no key file, hashes only)"
      : cur.keyedFrom && cur.keyedFrom > 1
        ? ` (records 1..${cur.keyedFrom - 1} predate the key and are pinned by record ${cur.keyedFrom})`
        : "";
    const against = exported ? `, and include the exported head #${exported.seq}` : "";
    return {
      ok: true,
      checked: cur.checked,
      reason:
        cur.checked === 0
          ? `empty log${note}`
          : `${cur.checked} records chain correctly${against}${note}`,
    };
  }

  /** Runs `fn` in one read transaction (rows and head from one snapshot). */
  snapshot<T>(fn: () => T): T {
    return this.db.transaction(fn)();
  }

  /**
   * The stored verification checkpoint: `checkpoint` when its MAC holds, `forged` when it does
   * not (someone without the key wrote it), neither when there is none (or no key to check it).
   */
  readCheckpoint(): {
    checkpoint?: AuditCheckpoint;
    forged?: { seq: number; reason: string };
  } {
    const key = this.key;
    if (!key) return {};
    const exists = this.db
      .prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'audit_checkpoint'")
      .get();
    if (!exists) return {};
    const row = this.db.prepare("SELECT * FROM audit_checkpoint WHERE id = 1").get() as
      (AuditCheckpoint & { mac: string }) | undefined;
    if (!row) return {};
    const cp: AuditCheckpoint = {
      seq: row.seq,
      hash: row.hash,
      keyed_from: row.keyed_from,
      verified_at: row.verified_at,
    };
    if (row.mac !== checkpointMac(key.key, cp))
      return {
        forged: {
          seq: Math.max(1, row.seq),
          reason: `the verification checkpoint (record ${row.seq}) was rewritten: its MAC does not match the key; run \`tpu-mcp audit verify\``,
        },
      };
    return { checkpoint: cp };
  }

  /** Stores the cursor as the verified checkpoint, MAC'd with the key (nothing without a key). */
  writeCheckpoint(cur: VerifyCursor, verifiedAt: string): AuditCheckpoint | null {
    const key = this.key;
    if (!key) return null;
    const cp: AuditCheckpoint = {
      seq: cur.expectedSeq - 1,
      hash: cur.prev,
      keyed_from: this.anchored ? cur.keyedFrom : null,
      verified_at: verifiedAt,
    };
    this.db.exec(`CREATE TABLE IF NOT EXISTS audit_checkpoint (
      id INTEGER PRIMARY KEY CHECK (id = 1),
      seq INTEGER NOT NULL,
      hash TEXT NOT NULL,
      keyed_from INTEGER,
      verified_at TEXT NOT NULL,
      mac TEXT NOT NULL
    )`);
    this.db
      .prepare(
        "INSERT INTO audit_checkpoint (id, seq, hash, keyed_from, verified_at, mac) VALUES (1, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET seq = excluded.seq, hash = excluded.hash, keyed_from = excluded.keyed_from, verified_at = excluded.verified_at, mac = excluded.mac",
      )
      .run(cp.seq, cp.hash, cp.keyed_from, cp.verified_at, checkpointMac(key.key, cp));
    return cp;
  }

  close(): void {
    if (this.owned && this.db.open) this.db.close();
  }
}
