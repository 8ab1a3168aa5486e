// Benchmark reports, persisted so that `baseline_id` comparisons and tpu://benchmarks/{id}
// survive restarts, and so that cost estimates can learn from past runs.
import { randomBytes } from "node:crypto";
import { workKey, type CallRecord } from "../../policies/estimate.js";
import { resolveDb, type SqliteDb } from "../../policies/sqlite.js";

/** Measured calls kept per (model, device kind): enough for every shape a deployment repeats. */
export const CALLS_KEPT = 200;
/** Of one work, the newest few (an estimate takes the median of three). */
export const REPEATS_KEPT = 3;
/** Rows kept on disk: enough to fill the list after repeats are dropped. */
export const ROWS_KEPT = CALLS_KEPT * REPEATS_KEPT;

export interface StoredReport {
  id: string;
  principal: string;
  model: string;
  device: string;
  created_at: string;
  report: Record<string, unknown>;
}

export interface HistoryRecord {
  batch: number;
  seq_len: number | null;
  dtype?: string;
  mode?: string;
  latency_ms: number;
}

/**
 * Benchmark reports and measured calls. Every read and write returns a promise: SQLite
 * (reports.db, SqliteReports) answers inside the call; the shared store
 * (server/app/postgres/reports.ts) serves every replica's.
 */
export interface Reports {
  put(
    principal: string,
    model: string,
    device: string,
    report: Record<string, unknown>,
  ): Promise<StoredReport>;
  get(id: string): Promise<StoredReport | undefined>;
  list(limit?: number): Promise<StoredReport[]>;
  /** Mean forward latency per configuration observed for a model on a device kind, newest reports first. */
  history(model: string, device: string): Promise<HistoryRecord[]>;
  /** Keeps a call the gate measured (its work and device-seconds) for later estimates. */
  recordCall(call: CallRecord): Promise<void>;
  /** The newest measured calls of a model on a device kind. */
  calls(model: string, device: string): Promise<CallRecord[]>;
  /**
   * Whether this process measured a call of `kind` of the model on the device kind since it
   * opened the store (its workers ran one: a model's first check on a fresh worker is cold).
   * Another process's calls, in a shared store, say nothing of this one's workers.
   */
  measuredHere(model: string, device: string, kind: CallRecord["kind"]): boolean;
  close(): void | Promise<void>;
}

export class SqliteReports implements Reports {
  private readonly db: SqliteDb;
  private readonly owned: boolean;
  /** When this process opened the store: calls since then ran on its workers (one per data dir). */
  private readonly openedAt = Date.now();
  constructor(pathOrDb: string | SqliteDb) {
    ({ db: this.db, owned: this.owned } = resolveDb(pathOrDb));
    this.db.exec(`CREATE TABLE IF NOT EXISTS benchmark_reports (
      id TEXT PRIMARY KEY, principal TEXT NOT NULL, model TEXT NOT NULL, device TEXT NOT NULL,
      created_at TEXT NOT NULL, report TEXT NOT NULL);
      CREATE TABLE IF NOT EXISTS measured_calls (
      id INTEGER PRIMARY KEY, model TEXT NOT NULL, device TEXT NOT NULL, kind TEXT NOT NULL,
      work TEXT NOT NULL, seconds REAL NOT NULL, at INTEGER NOT NULL, estimate_s REAL);
      CREATE INDEX IF NOT EXISTS measured_by_model ON measured_calls (model, device, id);`);
    // A table from before the estimate was kept gains its column (older rows: none).
    const cols = this.db.prepare("PRAGMA table_info(measured_calls)").all() as { name: string }[];
    if (!cols.some((c) => c.name === "estimate_s"))
      this.db.exec("ALTER TABLE measured_calls ADD COLUMN estimate_s REAL");
  }

  async put(
    principal: string,
    model: string,
    device: string,
    report: Record<string, unknown>,
  ): Promise<StoredReport> {
    const stored: StoredReport = {
      id: `bench_${randomBytes(10).toString("hex")}`,
      principal,
      model,
      device,
      created_at: new Date().toISOString(),
      report: { ...report },
    };
    stored.report.report_id = stored.id;
    this.historyCache.delete(`${model}\u0000${device}`);
    this.db
      .prepare(`INSERT INTO benchmark_reports VALUES (?, ?, ?, ?, ?, ?)`)
      .run(stored.id, principal, model, device, stored.created_at, JSON.stringify(stored.report));
    return stored;
  }

  async get(id: string): Promise<StoredReport | undefined> {
    const r = this.db.prepare(`SELECT * FROM benchmark_reports WHERE id = ?`).get(id) as any;
    return r ? { ...r, report: JSON.parse(r.report) } : undefined;
  }

  async list(limit = 50): Promise<StoredReport[]> {
    const rows = this.db
      .prepare(`SELECT * FROM benchmark_reports ORDER BY created_at DESC LIMIT ?`)
      .all(limit) as any[];
    return rows.map((r) => ({ ...r, report: JSON.parse(r.report) }));
  }

  // Estimates read history on every costly call (and on inference, the hot path): parse the
  // stored reports once per (model, device) and again only after a new report arrives.
  private readonly historyCache = new Map<string, HistoryRecord[]>();

  async history(model: string, device: string): Promise<HistoryRecord[]> {
    const key = `${model}\u0000${device}`;
    let h = this.historyCache.get(key);
    if (!h) {
      h = this.readHistory(model, device);
      this.historyCache.set(key, h);
    }
    return h;
  }

  private readHistory(model: string, device: string): HistoryRecord[] {
    const rows = this.db
      .prepare(
        `SELECT report FROM benchmark_reports WHERE model = ? AND device = ? ORDER BY created_at DESC LIMIT 20`,
      )
      .all(model, device) as { report: string }[];
    return historyOf(rows.map((r) => r.report));
  }

  // Inference records a call each time: the list in memory is the one estimates read, and rows
  // are written at most once a second in one transaction (a commit per call, or per event-loop
  // turn, would put a disk sync on the hot path).
  private readonly callCache = new Map<string, CallRecord[]>();
  private pendingCalls: CallRecord[] = [];

  async recordCall(call: CallRecord): Promise<void> {
    const list = this.callList(call.model, call.device);
    const keyed = { ...call, key: workKey(call.kind, call.work) };
    list.unshift(keyed);
    condense(list);
    this.pendingCalls.push(call);
    if (this.pendingCalls.length === 1) setTimeout(this.flushCalls, 1000).unref();
  }

  measuredHere(model: string, device: string, kind: CallRecord["kind"]): boolean {
    return this.callList(model, device).some((c) => c.kind === kind && c.at >= this.openedAt);
  }

  /** Newest first; of one work only the newest few, so an estimate reads few on the hot path. */
  async calls(model: string, device: string): Promise<CallRecord[]> {
    return this.callList(model, device);
  }

  private callList(model: string, device: string): CallRecord[] {
    const key = `${model}\u0000${device}`;
    let list = this.callCache.get(key);
    if (!list) {
      const rows = this.db
        .prepare(
          `SELECT kind, work, seconds, at, estimate_s FROM measured_calls WHERE model = ? AND device = ? ORDER BY id DESC LIMIT ?`,
        )
        .all(model, device, ROWS_KEPT) as {
        kind: CallRecord["kind"];
        work: string;
        seconds: number;
        at: number;
        estimate_s: number | null;
      }[];
      list = rows.map((r) => {
        const work = JSON.parse(r.work);
        return {
          kind: r.kind,
          model,
          device,
          work,
          seconds: r.seconds,
          at: r.at,
          ...(r.estimate_s !== null ? { estimate_s: r.estimate_s } : {}),
          key: workKey(r.kind, work),
        };
      });
      condense(list);
      this.callCache.set(key, list);
    }
    return list;
  }

  private readonly flushCalls = (): void => {
    if (this.pendingCalls.length === 0 || !this.db.open) return;
    const rows = this.pendingCalls;
    this.pendingCalls = [];
    const insert = this.db.prepare(
      `INSERT INTO measured_calls (model, device, kind, work, seconds, at, estimate_s) VALUES (?, ?, ?, ?, ?, ?, ?)`,
    );
    // Older rows than any list could hold are never read again.
    const prune = this.db.prepare(
      `DELETE FROM measured_calls WHERE model = ? AND device = ? AND id <= (SELECT id FROM measured_calls WHERE model = ? AND device = ? ORDER BY id DESC LIMIT 1 OFFSET ?)`,
    );
    try {
      this.db.transaction(() => {
        for (const c of rows)
          insert.run(
            c.model,
            c.device,
            c.kind,
            JSON.stringify(c.work),
            c.seconds,
            c.at,
            c.estimate_s ?? null,
          );
        for (const k of new Set(rows.map((c) => `${c.model}\u0000${c.device}`))) {
          const [model, device] = k.split("\u0000");
          prune.run(model, device, model, device, ROWS_KEPT);
        }
      })();
    } catch {
      // A full or read-only disk: estimates in this process still have the list in memory.
    }
  };

  close(): void {
    this.flushCalls();
    if (this.owned && this.db.open) this.db.close();
  }
}

/**
 * Mean forward latency per configuration in stored reports (their JSON, newest first): what
 * estimates learn from a model's benchmarks, whichever store keeps them.
 */
export function historyOf(reports: string[]): HistoryRecord[] {
  const out: HistoryRecord[] = [];
  for (const report of reports) {
    const parsed = JSON.parse(report);
    const configs = (parsed.configs ?? []) as any[];
    for (const c of configs) {
      // Forward passes only: a generate configuration's latency covers many decoding steps
      // (its work is on the configuration, or on the report for older ones).
      if (c?.error || (c?.work ?? parsed.work ?? "forward") !== "forward") continue;
      const mean = c?.latency_ms?.mean ?? c?.latency_ms?.p50;
      if (typeof c?.batch === "number" && typeof mean === "number") {
        out.push({
          batch: c.batch,
          seq_len: c.seq_len ?? null,
          ...(typeof c.dtype === "string" ? { dtype: c.dtype } : {}),
          ...(typeof c.mode === "string" ? { mode: c.mode } : {}),
          latency_ms: mean,
        });
      }
    }
  }
  return out;
}

/** Drops, in place, all but the newest REPEATS_KEPT of each work, and all past CALLS_KEPT. */
export function condense(list: CallRecord[]): void {
  const seen = new Map<string | undefined, number>();
  let n = 0;
  for (const c of list) {
    const k = seen.get(c.key) ?? 0;
    seen.set(c.key, k + 1);
    if (k < REPEATS_KEPT && n < CALLS_KEPT) list[n++] = c;
  }
  list.length = n;
}
