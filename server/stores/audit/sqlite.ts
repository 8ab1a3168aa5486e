// The audit trail's store: one record per decision, appended to SQLite and chained with
// HMAC-SHA256 under a key kept outside the database (audit_key.ts), so an edited, deleted,
// reordered or recomputed record is detectable by whoever holds the key; each is mirrored as a
// pino line so logs shipped elsewhere anchor the chain too. The first keyed record
// ("chain_keyed") pins everything before it; a trail without it while the key exists was wiped or
// replaced. `head()` is what an operator exports to prove later that nothing was rolled back.
//
// This file holds the appends (one by one, group commit, repeated refusals counted through
// audit_refusals.ts); the port is policies/audit.ts's, the record's canonical form
// audit_record.ts's, the verification walk and checkpoint audit_chain.ts's, the reading side
// audit_query.ts's (all in policies/); contract.ts holds the cases both backends pass.

import { ephemeralAuditKey, type AuditKey } from "../../../policies/audit_key.js";
import {
  AuditChain,
  chainMac,
  GENESIS_HASH,
  headMac,
  type AuditCheckpoint,
  type AuditHead,
  type AuditVerifyResult,
  type VerifyCursor,
} from "../../../policies/audit_chain.js";
import {
  readHead,
  searchRecords,
  signedDecisionRecords,
  tailRecords,
  type AuditSearch,
} from "../../../policies/audit_query.js";
import {
  canonicalWithSeq,
  prepareRecord,
  type AuditRecord,
  type PreparedRecord,
  type StoredAuditRecord,
} from "../../../policies/audit_record.js";
import {
  exportHashAt,
  exportTrail,
  type ExportOptions,
  type ExportSummary,
} from "../../../policies/audit_export.js";
import { RefusalWindows, type RefusalScope } from "../../../policies/audit_refusals.js";
import { resolveDb, type SqliteDb } from "../../../policies/sqlite.js";
import type { Statement, Transaction } from "better-sqlite3";

import type { Alongside, AuditTrail, PolicyLogger, VerifyStep } from "../../../policies/audit.js";

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
  /**
   * How long repeats of a refusal are counted before their aggregate is written
   * (`policy.audit.refusal_window_s`); default 60 s, 0: every refusal recorded on its own.
   */
  refusalWindowMs?: number;
  /** The clock of the refusal windows (tests); default Date.now. */
  now?: () => number;
}

export class SqliteAuditTrail implements AuditTrail {
  private readonly db: SqliteDb;
  private readonly owned: boolean;
  private readonly logger?: PolicyLogger;
  private readonly key: AuditKey | null;
  /** Whether the trail must contain a chain_keyed record for the key (false for ephemeral keys). */
  private readonly anchored: boolean;
  private readonly chain: AuditChain;
  private readonly refusals: RefusalWindows;

  constructor(pathOrDb: string | SqliteDb, opts: AuditLogOptions = {}) {
    ({ db: this.db, owned: this.owned } = resolveDb(pathOrDb));
    this.logger = opts.logger;
    this.key = opts.key === undefined ? ephemeralAuditKey() : opts.key;
    this.anchored = opts.key !== undefined;
    this.chain = new AuditChain(this.db, this.key, this.anchored, opts.onRowsHashed);
    let warnedFull = false;
    this.refusals = new RefusalWindows((r) => this.appendNow(r), {
      windowMs: opts.refusalWindowMs ?? 60_000,
      now: opts.now,
      onLost: (rec, err) =>
        this.logger?.error({ err: String(err), audit: rec }, "audit append failed (aggregate)"),
      onFull: () => {
        if (warnedFull) return;
        warnedFull = true;
        this.logger?.warn(
          {},
          "audit: too many refusal windows open; recording refusals one by one",
        );
      },
    });
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
    this.appendNow({
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

  private tx?: Transaction<
    (records: PreparedRecord[], alongside?: Alongside[]) => StoredAuditRecord[]
  >;
  private appendTx(key: AuditKey) {
    this.tx ??= this.db.transaction((records: PreparedRecord[], alongside?: Alongside[]) => {
      // SQLite's writes alongside are synchronous (a promise could not join this transaction).
      for (const fn of alongside ?? [])
        if (fn() instanceof Promise)
          throw new Error("an audit append's alongside write must be synchronous with SQLite");
      return this.chainInsert(key, records);
    });
    return this.tx;
  }

  // Every method answers inside the call (SQLite is synchronous) and resolves at once: records
  // are chained in call order, and a listener is told before the caller's next step.
  async append(record: AuditRecord): Promise<StoredAuditRecord> {
    return this.appendNow(record);
  }

  /** append(), synchronously (the refusal windows' aggregates, the chain's anchor). */
  private appendNow(record: AuditRecord): StoredAuditRecord {
    if (!this.key) throw new Error("the audit key is missing: this audit log is read-only");
    // Undefined fields dropped, so the stored JSON and the hashed canonical form agree.
    const prepared = prepareRecord(record);
    // IMMEDIATE: the server and the CLI may append at once; each must see the other's head.
    const [stored] = this.appendTx(this.key).immediate([prepared]);
    this.logger?.info({ audit: stored }, `audit ${stored.outcome} ${stored.tool}`);
    this.tell([stored]);
    return stored;
  }

  // Group commit. A commit (BEGIN IMMEDIATE … COMMIT, one WAL write) costs several times what
  // one more row in it costs, and every tool call appends twice, so under concurrency records
  // queued in the same event-loop turn are chained and committed together. Each caller still
  // gets its answer only after its own record is committed (durable against a server crash:
  // WAL with synchronous=NORMAL), and a lone caller waits one setImmediate, not a timer.
  private queued: Array<{
    prepared: PreparedRecord;
    alongside?: Alongside;
    resolve: (r: StoredAuditRecord) => void;
    reject: (e: unknown) => void;
  }> = [];
  private flushScheduled = false;

  appendDurable(record: AuditRecord, alongside?: Alongside): Promise<StoredAuditRecord> {
    let prepared: PreparedRecord;
    try {
      prepared = prepareRecord(record);
    } catch (e) {
      return Promise.reject(e);
    }
    return new Promise((resolve, reject) => {
      this.queued.push({ prepared, alongside, resolve, reject });
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
      const alongside = batch.flatMap((b) => (b.alongside ? [b.alongside] : []));
      stored = this.appendTx(this.key).immediate(
        batch.map((b) => b.prepared),
        alongside,
      );
    } catch (e) {
      for (const b of batch) b.reject(e);
      return;
    }
    const log = this.logger;
    batch.forEach((b, i) => {
      log?.info({ audit: stored[i] }, `audit ${stored[i].outcome} ${stored[i].tool}`);
      b.resolve(stored[i]);
    });
    this.tell(stored);
  }

  private readonly listeners = new Set<(records: readonly StoredAuditRecord[]) => void>();

  onAppended(fn: (records: readonly StoredAuditRecord[]) => void): () => void {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }

  /** A listener's failure is logged, never the append's: the record is committed. */
  private tell(records: readonly StoredAuditRecord[]): void {
    for (const fn of this.listeners)
      try {
        fn(records);
      } catch (e) {
        this.logger?.error({ err: String(e) }, "audit append listener failed");
      }
  }

  async readRange(from: number, to: number): Promise<StoredAuditRecord[]> {
    const rows = this.db
      .prepare(
        "SELECT seq, record, prev_hash, hash FROM audit_log WHERE seq >= ? AND seq <= ? ORDER BY seq LIMIT 10000",
      )
      .all(from, to) as { seq: number; record: string; prev_hash: string; hash: string }[];
    return rows.map((r) => ({
      ...(JSON.parse(r.record) as AuditRecord),
      seq: r.seq,
      prev_hash: r.prev_hash,
      hash: r.hash,
    }));
  }

  async appendRefusal(
    record: AuditRecord,
    opts: { per?: RefusalScope } = {},
  ): Promise<StoredAuditRecord | null> {
    return this.refusals.record(record, opts.per);
  }

  /** Repeated refusals counted but not yet written (their windows are still open). */
  pendingRefusals(): number {
    return this.refusals.pending();
  }

  async tail(n: number): Promise<StoredAuditRecord[]> {
    return tailRecords(this.db, n);
  }

  /** Decisions signed with a passkey, oldest first (`tpu-mcp audit verify` re-checks them). */
  async *signedDecisions(): AsyncIterable<StoredAuditRecord> {
    yield* signedDecisionRecords(this.db);
  }

  /**
   * The first `limit` records, oldest first, among the last `window` that match the filters
   * (filtered in SQLite: only the matches are parsed), and how many records the window held.
   */
  async search(q: AuditSearch): Promise<{ records: StoredAuditRecord[]; scanned: number }> {
    return searchRecords(this.db, q);
  }

  async head(): Promise<AuditHead> {
    return this.headNow();
  }

  private headNow(): AuditHead {
    return readHead(this.db, this.key && this.anchored ? this.key.id : null);
  }

  /**
   * The head with the keyless export chain's hash at it (`tpu-mcp audit head`): what a receiver
   * of an export is handed out of band. Hashes every record once (SHA-256, no key).
   */
  async exportHead(): Promise<AuditHead & { export_hash: string }> {
    return this.snapshot(() => {
      const h = this.headNow();
      return { ...h, export_hash: exportHashAt(this.db, h.seq) };
    });
  }

  /** `tpu-mcp audit export`: the records from `since` on and the head, one line per `write`. */
  async export(
    opts: Omit<ExportOptions, "keyId">,
    write: (line: string) => void,
  ): Promise<ExportSummary> {
    return exportTrail(this.db, { ...opts, keyId: this.headNow().key_id }, write);
  }

  /**
   * Full verification from the first record (the CLI's `audit verify`): every record parsed,
   * canonicalised and HMAC'd, then the head and the verification checkpoint. Costs time in
   * proportion to the trail; a server verifies incrementally instead (audit_verify.ts).
   */
  async verify(opts: { head?: AuditHead } = {}): Promise<AuditVerifyResult> {
    return this.chain.verify(opts);
  }

  // The incremental verifier's steps (audit_verify.ts), walked over this store's chain.
  async cursorAt(cp: AuditCheckpoint | null): Promise<VerifyCursor> {
    return this.chain.cursorAt(cp);
  }

  /** Up to `maxRows` records after `cur` and, at the end of the trail, the head: one snapshot. */
  async verifyStep(cur: VerifyCursor, maxRows: number): Promise<VerifyStep> {
    return this.snapshot(() => {
      const before = cur.checked;
      const bad = this.walk(cur, maxRows);
      const read = cur.checked - before;
      if (bad) return { bad, read, end: true };
      if (read < maxRows) return { bad: this.checkEnd(cur), read, end: true };
      return { bad: null, read, end: false };
    });
  }

  walk(cur: VerifyCursor, maxRows: number): AuditVerifyResult | null {
    return this.chain.walk(cur, maxRows);
  }

  checkEnd(cur: VerifyCursor, exported?: AuditHead): AuditVerifyResult | null {
    return this.chain.checkEnd(cur, exported);
  }

  success(cur: VerifyCursor, exported?: AuditHead): AuditVerifyResult {
    return this.chain.success(cur, exported);
  }

  async readCheckpoint(): Promise<{
    checkpoint?: AuditCheckpoint;
    forged?: { seq: number; reason: string };
  }> {
    return this.chain.readCheckpoint();
  }

  async writeCheckpoint(cur: VerifyCursor, verifiedAt: string): Promise<AuditCheckpoint | null> {
    return this.chain.writeCheckpoint(cur, verifiedAt);
  }

  /** Runs `fn` in one read transaction (rows and head from one snapshot). */
  snapshot<T>(fn: () => T): T {
    return this.db.transaction(fn)();
  }

  /** Ends every open refusal window now, writing the aggregate of each that counted repeats. */
  async flushRefusals(): Promise<void> {
    this.refusals.close();
  }

  /** Writes the counts of the open refusal windows, then closes the database if it owns it. */
  close(): void {
    if (this.db.open) this.refusals.close();
    if (this.owned && this.db.open) this.db.close();
  }
}
