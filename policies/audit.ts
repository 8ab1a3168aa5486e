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
}

export class SqliteAuditLog implements AuditLog {
  private readonly db: SqliteDb;
  private readonly owned: boolean;
  private readonly logger?: PolicyLogger;
  private readonly key: AuditKey | null;
  /** Whether the trail must contain a chain_keyed record for the key (false for ephemeral keys). */
  private readonly anchored: boolean;

  constructor(pathOrDb: string | SqliteDb, opts: AuditLogOptions = {}) {
    ({ db: this.db, owned: this.owned } = resolveDb(pathOrDb));
    this.logger = opts.logger;
    this.key = opts.key === undefined ? ephemeralAuditKey() : opts.key;
    this.anchored = opts.key !== undefined;
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

  verify(opts: { head?: AuditHead } = {}): AuditVerifyResult {
    let expectedSeq = 1;
    let prev = GENESIS_HASH;
    let checked = 0;
    const key = this.key;
    // Before the chain_keyed record, records carry the unkeyed hash; from it on, the keyed one.
    let keyed = !this.anchored;
    let keyedFrom: number | null = keyed ? 1 : null;
    let foreignKey: string | null = null;
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
      if (r.record !== canonicalJson(rec))
        return bad(r.seq, `record ${r.seq} was modified (not in canonical form)`);
      if (!keyed && rec.outcome === "chain_keyed") {
        if (!key) foreignKey = rec.key_id ?? "?";
        else if (rec.key_id !== key.id)
          return bad(
            r.seq,
            `record ${r.seq} starts a chain under key ${rec.key_id}, but the key file holds key ${key.id}`,
          );
        else {
          keyed = true;
          keyedFrom = r.seq;
        }
      }
      if (foreignKey) {
        return bad(
          r.seq,
          `the trail is chained with key ${foreignKey} from record ${r.seq} on, and the key file is missing: restore it to verify`,
        );
      }
      if (keyed) {
        if (keyedChainHash(key!.key, prev, r.seq, rec) !== r.hash)
          return bad(
            r.seq,
            `record ${r.seq} was modified or rewritten (its HMAC does not match: the chain was recomputed without the key)`,
          );
      } else if (chainHash(prev, r.seq, rec) !== r.hash) {
        if (key && keyedChainHash(key.key, prev, r.seq, rec) === r.hash)
          return bad(
            r.seq,
            `record ${r.seq} is keyed but no chain_keyed record precedes it: the start of the trail was removed`,
          );
        return bad(r.seq, `record ${r.seq} was modified (hash does not match its content)`);
      }
      prev = r.hash;
      expectedSeq++;
      checked++;
    }
    const head = this.db.prepare("SELECT seq, hash, mac FROM audit_head WHERE id = 1").get() as
      { seq: number; hash: string; mac: string | null } | undefined;
    const lastSeq = expectedSeq - 1;
    if (head && head.seq > lastSeq) {
      return bad(lastSeq + 1, `records ${lastSeq + 1}..${head.seq} are missing from the end`);
    }
    if (head && (head.seq !== lastSeq || head.hash !== prev)) {
      return bad(lastSeq, `the head (seq ${head.seq}) does not match the last record ${lastSeq}`);
    }
    if (!head && checked > 0) return bad(1, "audit head is missing");
    if (this.anchored && key && !keyed) {
      return bad(
        lastSeq + 1,
        checked === 0
          ? `the trail is empty, but the key ${key.id} (created ${key.created_at}) exists: the trail was wiped or the database replaced`
          : `no chain_keyed record for key ${key.id} (created ${key.created_at}): the trail was reset or rewritten without the key`,
      );
    }
    if (head && keyed && key && lastSeq >= (keyedFrom ?? 1)) {
      if (head.mac !== headMac(key.key, head.seq, head.hash))
        return bad(
          lastSeq,
          `the head row was rewritten (its MAC does not match): records after ${lastSeq} were probably removed`,
        );
    }
    if (opts.head) {
      const h = opts.head;
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
    const note = !key
      ? " (not keyed: no key file, hashes only)"
      : keyedFrom && keyedFrom > 1
        ? ` (records 1..${keyedFrom - 1} predate the key and are pinned by record ${keyedFrom})`
        : "";
    const against = opts.head ? `, and include the exported head #${opts.head.seq}` : "";
    return {
      ok: true,
      checked,
      reason:
        checked === 0 ? `empty log${note}` : `${checked} records chain correctly${against}${note}`,
    };
  }

  close(): void {
    if (this.owned && this.db.open) this.db.close();
  }
}
