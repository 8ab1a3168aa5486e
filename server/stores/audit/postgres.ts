// The audit trail on Postgres (`AuditTrail`, policies/audit.ts), shared by every replica: ONE
// chain with one head row (docs/storage.md says why), its records byte for byte what
// SqliteAuditTrail writes. A record's canonical text and its HMAC link (audit_record.ts,
// audit_chain.ts), the verification's checks (ChainRules), the export's lines (ExportWriter) and
// the refusal aggregates (audit_refusals.ts) are the same code as SQLite's, so `tpu-mcp audit
// verify`, `audit verify-export` and a sink's receiver check either backend the same way.
//
// - Appends: this process's records are queued in call order and chained in batches (group
//   commit), each batch one transaction that takes the head row FOR UPDATE: records from every
//   replica form one total order, and one replica's records keep its call order.
// - Refusal coalescing across replicas: one row per open window (audit_refusal_windows, keyed by
//   the window's key of audit_refusals.ts). A repeat increments its row (one UPDATE, no head
//   lock); a refusal that finds no open window is appended under the head lock, which checks
//   the row again, so two replicas never open one window twice. A window that ended is written
//   as its aggregate by whichever replica finds it first (the DELETE that takes it is atomic
//   with the aggregate's append); the counts live in the database, so a replica that stops
//   loses none of them. Windows are timed by the replicas' clocks (`storage check` reports skew).
// - Verification checkpoint: one MAC'd row (audit_checkpoint) that only moves forward, shared by
//   every replica's background verifier.
// - onAppended tells of THIS replica's appends only; other replicas' records are not pushed. The
//   streaming sink reads them back (readRange) when this replica's next record shows the gap.
import type { AuditKey } from "../../../policies/audit_key.js";
import { ephemeralAuditKey } from "../../../policies/audit_key.js";
import {
  ChainRules,
  chainMac,
  GENESIS_HASH,
  headMac,
  type AuditCheckpoint,
  type AuditHead,
  type AuditVerifyResult,
  type ChainRow,
  type CheckpointRow,
  type HeadRow,
  type VerifyCursor,
} from "../../../policies/audit_chain.js";
import {
  canonicalWithSeq,
  prepareRecord,
  type AuditRecord,
  type PreparedRecord,
  type StoredAuditRecord,
} from "../../../policies/audit_record.js";
import {
  ExportWriter,
  exportLinkOf,
  type ExportOptions,
  type ExportSummary,
} from "../../../policies/audit_export.js";
import { EXPORT_GENESIS } from "../../../policies/audit_export_proof.js";
import type { AuditSearch } from "../../../policies/audit_query.js";
import {
  aggregateRecord,
  MAX_OPEN,
  MAX_TOOLS,
  repeatKey,
  scopeOf,
  type RefusalScope,
  type WindowCounts,
} from "../../../policies/audit_refusals.js";
import type { Alongside, AuditTrail, PolicyLogger, VerifyStep } from "../../../policies/audit.js";
import { currentClient, queryable, withClient } from "../pg/ambient.js";
import { inTransaction, type PgClient, type PgPool } from "../pg/pool.js";

export interface PgAuditOptions {
  /** This replica's id, stored beside each record it appends (not part of the record or hash). */
  replica: string;
  logger?: PolicyLogger;
  /**
   * The chain key, as SqliteAuditTrail's: absent, a random key of this process and no anchor
   * (tests); null, read-only (an unkeyed trail can be verified, nothing appended).
   */
  key?: AuditKey | null;
  /** The key is new: start the keyed chain (a chain_keyed record) if the trail has none for it. */
  keyCreated?: boolean;
  /** Told how many records each verification step read and hashed (tests count work). */
  onRowsHashed?: (rows: number) => void;
  /** `policy.audit.refusal_window_s` in ms; default 60 s, 0: every refusal recorded on its own. */
  refusalWindowMs?: number;
  /** The refusal windows' clock (tests); default Date.now. */
  now?: () => number;
  /** Rows read per query by a full walk, an export or the signed decisions (default 5,000). */
  pageRows?: number;
  /** How often this replica looks for ended refusal windows (default a quarter window, ≤ 1 s). */
  sweepMs?: number;
  /** Records chained per transaction at most (default 500). */
  maxBatch?: number;
}

interface RawRow {
  seq: string | number;
  record: string;
  prev_hash: string;
  hash: string;
}

const rowOf = (r: RawRow): ChainRow => ({
  seq: Number(r.seq),
  record: r.record,
  prev_hash: r.prev_hash,
  hash: r.hash,
});

const storedOf = (r: ChainRow): StoredAuditRecord => ({
  ...(JSON.parse(r.record) as AuditRecord),
  seq: r.seq,
  prev_hash: r.prev_hash,
  hash: r.hash,
});

const ROW = "seq, record, prev_hash, hash";

/** A window's row as stored. */
interface WindowRow {
  key: string;
  scope: RefusalScope;
  first_seq: string;
  principal: string;
  tool: string;
  args_digest: string | null;
  code: string;
  ends_ms: string;
  count: string;
  since: string | null;
  until: string | null;
  tools: Record<string, number | string>;
}

function countsOf(w: WindowRow): WindowCounts {
  return {
    first: {
      principal: w.principal,
      tool: w.tool,
      args_digest: w.args_digest,
      code: w.code,
      seq: Number(w.first_seq),
    },
    scope: w.scope,
    count: Number(w.count),
    since: w.since ?? undefined,
    until: w.until ?? undefined,
    tools: new Map(Object.entries(w.tools).map(([k, v]) => [k, Number(v)])),
  };
}

// The tool a repeat is counted under: its own while the window names fewer than MAX_TOOLS, else
// "(other)" (RefusalWindows' rule). Evaluated on the row as locked, so concurrent counts agree.
const TOOL_NAME = `(CASE WHEN tools ? $3::text OR (SELECT count(*) FROM jsonb_object_keys(tools)) < ${MAX_TOOLS} THEN $3::text ELSE '(other)' END)`;
const COUNT_REPEAT = `UPDATE audit_refusal_windows
  SET count = count + 1, since = COALESCE(since, $2), until = $2,
      tools = tools || jsonb_build_object(${TOOL_NAME}, COALESCE((tools ->> ${TOOL_NAME})::bigint, 0) + 1)
  WHERE key = $1 AND ends_ms > $4
  RETURNING ends_ms`;

type Pending = {
  prepared: PreparedRecord;
  /** Set for a refusal that may open (or, under the lock, join) a window. */
  window?: { key: string; scope: RefusalScope };
  alongside?: Alongside;
  resolve: (r: StoredAuditRecord | null) => void;
  reject: (e: unknown) => void;
};

/**
 * The asynchronous `AuditTrail` of the storage port (every method a promise, the signed decisions
 * an async iterable, one atomic verifyStep), on Postgres.
 */
export class PgAuditTrail implements AuditTrail {
  private readonly key: AuditKey | null;
  private readonly anchored: boolean;
  private readonly rules: ChainRules;
  private readonly logger?: PolicyLogger;
  private readonly windowMs: number;
  private readonly now: () => number;
  private readonly pageRows: number;
  private readonly maxBatch: number;
  private readonly listeners = new Set<(records: readonly StoredAuditRecord[]) => void>();
  private queue: Pending[] = [];
  private sweepWanted: "due" | "all" | null = null;
  private sweepWaiters: { resolve: () => void; reject: (e: unknown) => void }[] = [];
  private draining: Promise<void> | null = null;
  private timer?: NodeJS.Timeout;
  private closed = false;
  private warnedFull = false;
  /** What this replica counted into windows not yet ended: window key → its end and count. */
  private readonly counted = new Map<string, { endsAt: number; n: number }>();

  private constructor(
    private readonly pool: PgPool,
    private readonly opts: PgAuditOptions,
  ) {
    this.key = opts.key === undefined ? ephemeralAuditKey() : opts.key;
    this.anchored = opts.key !== undefined;
    this.rules = new ChainRules(this.key, this.anchored);
    this.logger = opts.logger;
    this.windowMs = opts.refusalWindowMs ?? 60_000;
    this.now = opts.now ?? Date.now;
    this.pageRows = Math.max(1, opts.pageRows ?? 5000);
    this.maxBatch = Math.max(1, opts.maxBatch ?? 500);
  }

  /**
   * The trail on a migrated database (schema.ts). With an anchored key: a trail chained under
   * another key is refused; one with no chain_keyed record for the key gets one when the key is
   * new (`keyCreated`), else the reset is logged and `audit verify` fails on it (as SQLite's).
   */
  static async open(pool: PgPool, opts: PgAuditOptions): Promise<PgAuditTrail> {
    const t = new PgAuditTrail(pool, opts);
    if (t.key && t.anchored) await t.startChain(t.key, opts.keyCreated === true);
    if (t.windowMs > 0) {
      const every = opts.sweepMs ?? Math.min(1000, Math.max(50, Math.floor(t.windowMs / 4)));
      t.timer = setInterval(() => void t.sweepIfDue(), every);
      t.timer.unref();
    }
    return t;
  }

  /** The seq of the last chain_keyed record and its key (null when there is none). */
  private async lastKeyed(c: PgPool | PgClient): Promise<{ seq: number; key_id: string } | null> {
    const r = await c.query(
      `SELECT seq, (record::jsonb) ->> 'key_id' AS key_id FROM audit_records
       WHERE (record::jsonb) ->> 'outcome' = 'chain_keyed' ORDER BY seq DESC LIMIT 1`,
    );
    const row = r.rows[0] as { seq: string; key_id: string } | undefined;
    return row ? { seq: Number(row.seq), key_id: row.key_id } : null;
  }

  /** Reads only, unless the chain must start: then under the head lock, which checks again. */
  private async startChain(key: AuditKey, created: boolean): Promise<void> {
    const foreign = (k: { key_id: string }) =>
      new Error(
        `the audit trail is chained with key ${k.key_id}, but ${key.path} holds key ${key.id}: give every replica the deployment's audit key (or archive the database and the key together to start a new trail)`,
      );
    const found = await this.lastKeyed(this.pool);
    if (found && found.key_id !== key.id) throw foreign(found);
    if (found) return;
    if (!created) {
      const head = await this.headRow();
      this.logger?.error(
        { audit_key: key.id, key_created_at: key.created_at, records: head?.seq ?? 0 },
        "audit trail reset: the key exists but the trail has no chain_keyed record for it; run `tpu-mcp audit verify`",
      );
      return;
    }
    const stored = await inTransaction(this.pool, async (c) => {
      const head = await lockHead(c);
      const again = await this.lastKeyed(c);
      if (again && again.key_id !== key.id) throw foreign(again);
      if (again) return null; // another replica started it meanwhile
      const chain = chainer(key, head);
      const s = chain.add(
        prepareRecord({
          time: new Date().toISOString(),
          principal: "tpu-mcp",
          tool: "audit",
          args_digest: null,
          outcome: "chain_keyed",
          key_id: key.id,
          reason:
            head.seq > 0
              ? `records 1..${head.seq} predate the key: they are hash-chained only, and pinned by this record`
              : "new trail",
        }),
      );
      await chain.write(c, this.opts.replica);
      return s;
    });
    if (stored) this.logger?.info({ audit: stored }, `audit ${stored.outcome} ${stored.tool}`);
  }

  // ---- appends -------------------------------------------------------------------------------

  append(record: AuditRecord): Promise<StoredAuditRecord> {
    return this.enqueue(record) as Promise<StoredAuditRecord>;
  }

  /** Committed with the records queued beside it (group commit); `alongside` in its transaction. */
  appendDurable(record: AuditRecord, alongside?: Alongside): Promise<StoredAuditRecord> {
    return this.enqueue(record, { alongside }) as Promise<StoredAuditRecord>;
  }

  /**
   * A refusal, recorded or counted into its window's row (the rule of audit_refusals.ts, across
   * replicas); null when counted.
   */
  async appendRefusal(
    record: AuditRecord,
    opts: { per?: RefusalScope } = {},
  ): Promise<StoredAuditRecord | null> {
    const key = this.windowMs > 0 ? repeatKey(record, opts.per) : null;
    if (key === null) return this.append(record);
    if (this.closed) throw new Error("the audit trail is closed");
    // An open window: one UPDATE, no head lock (the common case of a flood).
    const r = await this.pool.query(COUNT_REPEAT, [key, record.time, record.tool, this.now()]);
    if (r.rowCount === 1) {
      this.noteCounted(key, Number(r.rows[0].ends_ms));
      return null;
    }
    return this.enqueue(record, { window: { key, scope: scopeOf(record, opts.per)! } });
  }

  private enqueue(
    record: AuditRecord,
    extra: { alongside?: Alongside; window?: Pending["window"] } = {},
  ): Promise<StoredAuditRecord | null> {
    if (this.closed) return Promise.reject(new Error("the audit trail is closed"));
    if (!this.key)
      return Promise.reject(new Error("the audit key is missing: this audit log is read-only"));
    let prepared: PreparedRecord;
    try {
      // Undefined fields dropped, so the stored JSON and the hashed canonical form agree.
      prepared = prepareRecord(record);
    } catch (e) {
      return Promise.reject(e);
    }
    return new Promise((resolve, reject) => {
      this.queue.push({ prepared, ...extra, resolve, reject });
      this.kick();
    });
  }

  /** One drain at a time: batches commit in call order; what arrives meanwhile is the next batch. */
  private kick(): void {
    if (this.draining) return;
    this.draining = (async () => {
      // A lone caller waits one turn, so the records of one turn share a commit.
      await new Promise((r) => setImmediate(r));
      try {
        while (this.queue.length > 0 || this.sweepWanted) {
          const batch = this.queue.splice(0, this.maxBatch);
          const sweep = this.sweepWanted;
          const waiters = sweep ? this.sweepWaiters.splice(0) : [];
          this.sweepWanted = null;
          try {
            const { results, appended } = await this.commit(batch, sweep);
            for (const s of appended)
              this.logger?.info({ audit: s }, `audit ${s.outcome} ${s.tool}`);
            batch.forEach((b, i) => b.resolve(results[i]!));
            for (const w of waiters) w.resolve();
            this.tell(appended);
          } catch (e) {
            for (const b of batch) b.reject(e);
            for (const w of waiters) w.reject(e);
          }
        }
      } finally {
        this.draining = null;
      }
    })();
  }

  /**
   * One transaction under the head's row lock: the ended windows' aggregates (when sweeping),
   * then the batch in order, each refusal checked against its window's row.
   */
  private async commit(
    batch: Pending[],
    sweep: "due" | "all" | null,
  ): Promise<{ results: (StoredAuditRecord | null)[]; appended: StoredAuditRecord[] }> {
    const key = this.key;
    if (!key) throw new Error("the audit key is missing: this audit log is read-only");
    const now = this.now();
    return inTransaction(this.pool, async (c) => {
      const chain = chainer(key, await lockHead(c));
      if (sweep) {
        const ended = await c.query(
          "DELETE FROM audit_refusal_windows WHERE ends_ms <= $1 RETURNING *",
          [sweep === "all" ? Number.MAX_SAFE_INTEGER : now],
        );
        const rows = (ended.rows as WindowRow[]).sort(
          (a, b) =>
            Number(a.ends_ms) - Number(b.ends_ms) || Number(a.first_seq) - Number(b.first_seq),
        );
        for (const w of rows) this.emitWindow(chain, w, now);
        if (sweep === "all") this.counted.clear();
      }
      const results: (StoredAuditRecord | null)[] = [];
      for (const p of batch) {
        if (p.alongside) await withClient(c, p.alongside);
        results.push(p.window ? await this.refusal(c, chain, p, now) : chain.add(p.prepared));
      }
      await chain.write(c, this.opts.replica);
      return { results, appended: chain.appended };
    });
  }

  /** Under the head lock: counted into a window another append opened meanwhile, or recorded. */
  private async refusal(
    c: PgClient,
    chain: Chainer,
    p: Pending,
    now: number,
  ): Promise<StoredAuditRecord | null> {
    const { key, scope } = p.window!;
    const rec = p.prepared.clean;
    const w = (
      await c.query("SELECT * FROM audit_refusal_windows WHERE key = $1 FOR UPDATE", [key])
    ).rows[0] as WindowRow | undefined;
    if (w && Number(w.ends_ms) > now) {
      const r = await c.query(COUNT_REPEAT, [key, rec.time, rec.tool, now]);
      this.noteCounted(key, Number(r.rows[0].ends_ms));
      return null;
    }
    if (w) {
      // Its window ended and nobody has written it yet: its aggregate comes first.
      await c.query("DELETE FROM audit_refusal_windows WHERE key = $1", [key]);
      this.emitWindow(chain, w, now);
    }
    const stored = chain.add(p.prepared);
    const open = await c.query("SELECT count(*) AS n FROM audit_refusal_windows");
    if (Number(open.rows[0].n) >= MAX_OPEN) {
      if (!this.warnedFull) {
        this.warnedFull = true;
        this.logger?.warn(
          {},
          "audit: too many refusal windows open; recording refusals one by one",
        );
      }
      return stored;
    }
    await c.query(
      `INSERT INTO audit_refusal_windows
         (key, scope, first_seq, principal, tool, args_digest, code, ends_ms)
       VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
      [
        key,
        scope,
        stored.seq,
        rec.principal,
        rec.tool,
        rec.args_digest,
        rec.code,
        now + this.windowMs,
      ],
    );
    return stored;
  }

  private emitWindow(chain: Chainer, w: WindowRow, now: number): void {
    this.counted.delete(w.key);
    const counts = countsOf(w);
    if (counts.count > 0) chain.add(prepareRecord(aggregateRecord(counts, this.windowMs, now)));
  }

  private noteCounted(key: string, endsAt: number): void {
    const c = this.counted.get(key);
    if (c && c.endsAt === endsAt) c.n++;
    else this.counted.set(key, { endsAt, n: 1 });
  }

  /** Asks the drain to write the ended windows ("due") or every window ("all"). */
  private sweep(kind: "due" | "all"): Promise<void> {
    return new Promise((resolve, reject) => {
      if (this.sweepWanted !== "all") this.sweepWanted = kind;
      this.sweepWaiters.push({ resolve, reject });
      this.kick();
    });
  }

  /** The timer: looks (no lock) for a window that ended, and has it written if there is one. */
  private async sweepIfDue(): Promise<void> {
    if (this.closed || this.sweepWanted || !this.key) return;
    try {
      const r = await this.pool.query(
        "SELECT 1 FROM audit_refusal_windows WHERE ends_ms <= $1 LIMIT 1",
        [this.now()],
      );
      if (r.rowCount) await this.sweep("due");
    } catch (e) {
      this.logger?.error({ err: String(e) }, "audit: could not write the ended refusal windows");
    }
  }

  /** Writes the aggregates of the windows that have ended now (the timer does it on its own). */
  flushDueRefusals(): Promise<void> {
    return this.sweep("due");
  }

  /** Writes every open window's aggregate now, whichever replica opened it. */
  flushRefusals(): Promise<void> {
    return this.sweep("all");
  }

  /**
   * The repeats THIS replica counted into windows that have not ended (in memory); the counts of
   * every replica are in audit_refusal_windows (`openRefusals`).
   */
  pendingRefusals(): number {
    const now = this.now();
    let n = 0;
    for (const [k, c] of this.counted) {
      if (c.endsAt <= now) this.counted.delete(k);
      else n += c.n;
    }
    return n;
  }

  /** Repeats counted by every replica into windows not yet written. */
  async openRefusals(): Promise<number> {
    const r = await queryable(this.pool).query(
      "SELECT COALESCE(sum(count), 0) AS n FROM audit_refusal_windows",
    );
    return Number(r.rows[0].n);
  }

  onAppended(fn: (records: readonly StoredAuditRecord[]) => void): () => void {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }

  /** A listener's failure is logged, never the append's: the records are committed. */
  private tell(records: readonly StoredAuditRecord[]): void {
    if (records.length === 0) return;
    for (const fn of this.listeners)
      try {
        fn(records);
      } catch (e) {
        this.logger?.error({ err: String(e) }, "audit append listener failed");
      }
  }

  // ---- reads ---------------------------------------------------------------------------------

  /** The connection of the snapshot (or other transaction) in progress, else the pool. */
  private get db(): PgPool | PgClient {
    return queryable(this.pool);
  }

  /**
   * Runs `fn` in one REPEATABLE READ, read-only transaction: every read this trail makes inside
   * it sees one snapshot (rows and head agree while other replicas append).
   */
  async snapshot<T>(fn: () => Promise<T>): Promise<T> {
    if (currentClient()) return fn();
    const c = await this.pool.connect();
    try {
      await c.query("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
      const out = await withClient(c, fn);
      await c.query("COMMIT");
      return out;
    } catch (e) {
      await c.query("ROLLBACK").catch(() => {});
      throw e;
    } finally {
      c.release();
    }
  }

  private async rows(fromSeq: number, limit: number, toSeq?: number): Promise<ChainRow[]> {
    const r =
      toSeq === undefined
        ? await this.db.query(
            `SELECT ${ROW} FROM audit_records WHERE seq >= $1 ORDER BY seq LIMIT $2`,
            [fromSeq, limit],
          )
        : await this.db.query(
            `SELECT ${ROW} FROM audit_records WHERE seq >= $1 AND seq <= $2 ORDER BY seq LIMIT $3`,
            [fromSeq, toSeq, limit],
          );
    return (r.rows as RawRow[]).map(rowOf);
  }

  /** Rows from `fromSeq` (to `toSeq`), page by page. */
  private async *pages(fromSeq: number, toSeq?: number): AsyncIterable<ChainRow> {
    let next = fromSeq;
    for (;;) {
      const page = await this.rows(next, this.pageRows, toSeq);
      for (const r of page) yield r;
      if (page.length < this.pageRows) return;
      next = page[page.length - 1]!.seq + 1;
    }
  }

  private async headRow(): Promise<HeadRow | undefined> {
    const r = await this.db.query("SELECT seq, hash, mac FROM audit_head WHERE id = 1");
    const h = r.rows[0] as { seq: string; hash: string; mac: string | null } | undefined;
    return h && { seq: Number(h.seq), hash: h.hash, mac: h.mac };
  }

  private async hashAt(seq: number): Promise<string | undefined> {
    const r = await this.db.query("SELECT hash FROM audit_records WHERE seq = $1", [seq]);
    return (r.rows[0] as { hash: string } | undefined)?.hash;
  }

  async tail(n: number): Promise<StoredAuditRecord[]> {
    const r = await this.db.query(`SELECT ${ROW} FROM audit_records ORDER BY seq DESC LIMIT $1`, [
      Math.max(0, Math.floor(n)),
    ]);
    return (r.rows as RawRow[]).reverse().map((x) => storedOf(rowOf(x)));
  }

  async readRange(from: number, to: number): Promise<StoredAuditRecord[]> {
    return (await this.rows(from, 10_000, to)).map(storedOf);
  }

  /** Decisions signed with a passkey, oldest first, read a page at a time. */
  async *signedDecisions(): AsyncIterable<StoredAuditRecord> {
    let after = 0;
    for (;;) {
      const r = await this.db.query(
        `SELECT ${ROW} FROM audit_records
         WHERE seq > $1 AND (record::jsonb) ->> 'evidence' IS NOT NULL ORDER BY seq LIMIT $2`,
        [after, this.pageRows],
      );
      const page = (r.rows as RawRow[]).map(rowOf);
      for (const x of page) yield storedOf(x);
      if (page.length < this.pageRows) return;
      after = page[page.length - 1]!.seq;
    }
  }

  /** The first `limit` matches, oldest first, among the last `window` records (SQLite's rule). */
  async search(q: AuditSearch): Promise<{ records: StoredAuditRecord[]; scanned: number }> {
    return this.snapshot(async () => {
      const w = (
        await this.db.query(
          "SELECT min(seq) AS lo, count(*) AS n FROM (SELECT seq FROM audit_records ORDER BY seq DESC LIMIT $1) w",
          [Math.max(0, Math.floor(q.window))],
        )
      ).rows[0] as { lo: string | null; n: string };
      const where = ["seq >= $1"];
      const params: unknown[] = [w.lo === null ? Number.MAX_SAFE_INTEGER : Number(w.lo)];
      for (const [field, value] of [
        ["principal", q.principal],
        ["tool", q.tool],
        ["outcome", q.outcome],
      ] as const) {
        if (value === undefined) continue;
        params.push(value);
        where.push(`(record::jsonb) ->> '${field}' = $${params.length}`);
      }
      params.push(Math.max(0, Math.floor(q.limit)));
      const r = await this.db.query(
        `SELECT ${ROW} FROM audit_records WHERE ${where.join(" AND ")} ORDER BY seq LIMIT $${params.length}`,
        params,
      );
      return { records: (r.rows as RawRow[]).map((x) => storedOf(rowOf(x))), scanned: Number(w.n) };
    });
  }

  async head(): Promise<AuditHead> {
    const keyId = this.key && this.anchored ? this.key.id : null;
    return this.snapshot(async () => {
      const h = await this.headRow();
      if (!h || h.seq === 0)
        return { seq: 0, hash: h?.hash ?? GENESIS_HASH, time: null, key_id: keyId };
      const r = await this.db.query("SELECT record FROM audit_records WHERE seq = $1", [h.seq]);
      const rec = r.rows[0] as { record: string } | undefined;
      const time = rec ? ((JSON.parse(rec.record) as AuditRecord).time ?? null) : null;
      return { seq: h.seq, hash: h.hash, time, key_id: keyId };
    });
  }

  /** The keyless export chain's hash after record `seq` (walks from record 1). */
  private async exportHashAt(seq: number): Promise<string> {
    let prev = EXPORT_GENESIS;
    if (seq < 1) return prev;
    for await (const r of this.pages(1, seq)) prev = exportLinkOf(prev, r);
    return prev;
  }

  /** The head with the keyless export chain's hash at it (`tpu-mcp audit head`). */
  async exportHead(): Promise<AuditHead & { export_hash: string }> {
    return this.snapshot(async () => {
      const h = await this.head();
      return { ...h, export_hash: await this.exportHashAt(h.seq) };
    });
  }

  /** `tpu-mcp audit export`: the records from `since` on and the head, in one snapshot. */
  async export(
    opts: Omit<ExportOptions, "keyId">,
    write: (line: string) => void,
  ): Promise<ExportSummary> {
    const keyId = this.key && this.anchored ? this.key.id : null;
    return this.snapshot(async () => {
      const since = opts.since;
      const f = (
        typeof since === "number"
          ? await this.db.query("SELECT min(seq) AS s FROM audit_records WHERE seq >= $1", [since])
          : await this.db.query(
              `SELECT min(seq) AS s FROM audit_records WHERE ((record::jsonb) ->> 'time') COLLATE "C" >= $1`,
              [new Date(since).toISOString()],
            )
      ).rows[0] as { s: string | null };
      const from = f.s === null ? null : Number(f.s);
      const head = await this.headRow();
      const prev = await this.exportHashAt((from ?? (head?.seq ?? 0) + 1) - 1);
      const out = new ExportWriter(prev, from, head, { ...opts, keyId }, write);
      if (from !== null) for await (const r of this.pages(from)) out.add(r);
      return out.finish();
    });
  }

  // ---- verification ------------------------------------------------------------------------

  /** The whole trail from record 1, then the head, an exported head and the checkpoint. */
  async verify(opts: { head?: AuditHead } = {}): Promise<AuditVerifyResult> {
    return this.snapshot(async () => {
      const cur = this.rules.cursorAt(null);
      const bad =
        (await this.walk(cur, Number.POSITIVE_INFINITY)) ?? (await this.checkEnd(cur, opts.head));
      if (bad) return bad;
      const cp = await this.readCheckpoint();
      if (cp.forged) return this.rules.failure(cur, cp.forged.seq, cp.forged.reason);
      if (cp.checkpoint) {
        const off = this.rules.againstCheckpoint(
          cur,
          cp.checkpoint,
          await this.hashAt(cp.checkpoint.seq),
        );
        if (off) return off;
      }
      return this.rules.success(cur, opts.head);
    });
  }

  async cursorAt(cp: AuditCheckpoint | null): Promise<VerifyCursor> {
    return this.rules.cursorAt(cp);
  }

  /** Up to `maxRows` records after `cur` and, at the end of the trail, the head: one snapshot. */
  async verifyStep(cur: VerifyCursor, maxRows: number): Promise<VerifyStep> {
    return this.snapshot(async () => {
      const before = cur.checked;
      const bad = await this.walk(cur, maxRows);
      const read = cur.checked - before;
      if (bad) return { bad, read, end: true };
      if (read < maxRows) return { bad: await this.checkEnd(cur), read, end: true };
      return { bad: null, read, end: false };
    });
  }

  /** Checks up to `maxRows` records after the cursor (moving it); a failure, or null. */
  private async walk(cur: VerifyCursor, maxRows: number): Promise<AuditVerifyResult | null> {
    let hashed = 0;
    try {
      if (Number.isFinite(maxRows)) {
        for (const r of await this.rows(cur.expectedSeq, Math.max(0, Math.floor(maxRows)))) {
          hashed++;
          const bad = this.rules.step(cur, r);
          if (bad) return bad;
        }
        return null;
      }
      for await (const r of this.pages(cur.expectedSeq)) {
        hashed++;
        const bad = this.rules.step(cur, r);
        if (bad) return bad;
      }
      return null;
    } finally {
      this.opts.onRowsHashed?.(hashed);
    }
  }

  private async checkEnd(
    cur: VerifyCursor,
    exported?: AuditHead,
  ): Promise<AuditVerifyResult | null> {
    const bad = this.rules.end(cur, await this.headRow());
    if (bad || !exported) return bad;
    return this.rules.againstExported(
      cur,
      exported,
      exported.seq > 0 ? await this.hashAt(exported.seq) : undefined,
    );
  }

  async readCheckpoint(): Promise<{
    checkpoint?: AuditCheckpoint;
    forged?: { seq: number; reason: string };
  }> {
    if (!this.key) return {};
    const r = await this.db.query(
      "SELECT seq, hash, keyed_from, verified_at, mac FROM audit_checkpoint WHERE id = 1",
    );
    const row = r.rows[0] as
      | { seq: string; hash: string; keyed_from: string | null; verified_at: string; mac: string }
      | undefined;
    return this.rules.checkpointOf(
      row && {
        seq: Number(row.seq),
        hash: row.hash,
        keyed_from: row.keyed_from === null ? null : Number(row.keyed_from),
        verified_at: row.verified_at,
        mac: row.mac,
      },
    );
  }

  /**
   * Stores the cursor as the verified checkpoint, MAC'd with the key. Replicas verify the one
   * trail side by side: the row only moves forward, so a slower verifier never moves it back.
   */
  async writeCheckpoint(cur: VerifyCursor, verifiedAt: string): Promise<AuditCheckpoint | null> {
    const row: CheckpointRow | null = this.rules.checkpointRow(cur, verifiedAt);
    if (!row) return null;
    await this.pool.query(
      `INSERT INTO audit_checkpoint (id, seq, hash, keyed_from, verified_at, mac)
       VALUES (1, $1, $2, $3, $4, $5)
       ON CONFLICT (id) DO UPDATE SET seq = excluded.seq, hash = excluded.hash,
         keyed_from = excluded.keyed_from, verified_at = excluded.verified_at, mac = excluded.mac
       WHERE audit_checkpoint.seq <= excluded.seq`,
      [row.seq, row.hash, row.keyed_from, row.verified_at, row.mac],
    );
    return {
      seq: row.seq,
      hash: row.hash,
      keyed_from: row.keyed_from,
      verified_at: row.verified_at,
    };
  }

  /**
   * Stops taking records, waits for the queued ones to commit and writes the windows that have
   * ended. Open windows stay counted in the database: any replica's sweep writes them when they
   * end (this one's, after a restart, too). The pool is the caller's.
   */
  async close(): Promise<void> {
    if (this.closed) return;
    if (this.timer) clearInterval(this.timer);
    while (this.draining) await this.draining;
    if (this.key && this.windowMs > 0) await this.flushDueRefusals().catch(() => {});
    this.closed = true;
  }
}

/** Takes the head row for this transaction (every append waits its turn here). */
async function lockHead(c: PgClient): Promise<{ seq: number; hash: string }> {
  const r = await c.query("SELECT seq, hash FROM audit_head WHERE id = 1 FOR UPDATE");
  const h = r.rows[0] as { seq: string; hash: string } | undefined;
  if (!h)
    throw new Error(
      "the audit head row is missing from the database: the trail was tampered with; run `tpu-mcp audit verify`",
    );
  return { seq: Number(h.seq), hash: h.hash };
}

interface Chainer {
  add(p: PreparedRecord): StoredAuditRecord;
  write(c: PgClient, replica: string): Promise<void>;
  readonly appended: StoredAuditRecord[];
}

/**
 * Chains prepared records after `head`, as SqliteAuditTrail does (canonical text with seq, HMAC'd
 * after the previous hash), then writes them in one INSERT and moves the head once, MAC'd.
 */
function chainer(key: AuditKey, head: { seq: number; hash: string }): Chainer {
  let seq = head.seq;
  let prev = head.hash;
  const rows: ChainRow[] = [];
  const appended: StoredAuditRecord[] = [];
  return {
    appended,
    add(p) {
      seq += 1;
      const { stored, hashed } = canonicalWithSeq(p, seq);
      const hash = chainMac(key.key, prev, hashed);
      rows.push({ seq, record: stored, prev_hash: prev, hash });
      const s = { ...p.clean, seq, prev_hash: prev, hash };
      appended.push(s);
      prev = hash;
      return s;
    },
    async write(c, replica) {
      if (rows.length === 0) return;
      await c.query(
        `INSERT INTO audit_records (seq, record, prev_hash, hash, replica)
         SELECT s, r, p, h, $5 FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[]) AS t(s, r, p, h)`,
        [
          rows.map((r) => r.seq),
          rows.map((r) => r.record),
          rows.map((r) => r.prev_hash),
          rows.map((r) => r.hash),
          replica,
        ],
      );
      await c.query("UPDATE audit_head SET seq = $1, hash = $2, mac = $3 WHERE id = 1", [
        seq,
        prev,
        headMac(key.key, seq, prev),
      ]);
    },
  };
}
