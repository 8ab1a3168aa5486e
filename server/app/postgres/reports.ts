// Benchmark reports and measured calls on the shared store, so `baseline_id`, tpu://benchmarks/{id}
// and the estimates' history are every replica's. Estimates read history on the hot path: each
// replica keeps what it read for a few seconds (another replica's new report or measured call is
// seen at most that late), its own writes apply to it at once, and its measured calls are written
// once a second in one statement, as SQLite's are (tools/stores/reports.ts).
import { randomBytes } from "node:crypto";
import { workKey, type CallRecord } from "../../../policies/estimate.js";
import {
  condense,
  historyOf,
  ROWS_KEPT,
  type HistoryRecord,
  type Reports,
  type StoredReport,
} from "../../../tools/stores/reports.js";
import type { PgPool } from "../../stores/pg/pool.js";

/** How long a replica answers history from what it read (ms). */
const FRESH_MS = 5_000;

interface Cached<T> {
  value: T;
  at: number;
}

export class PgReports implements Reports {
  /** What this replica measured itself: `model\0device\0kind`. */
  private readonly here = new Set<string>();
  private readonly historyCache = new Map<string, Cached<HistoryRecord[]>>();
  private readonly callCache = new Map<string, Cached<CallRecord[]>>();
  private pendingCalls: CallRecord[] = [];
  private flushing?: Promise<void>;

  constructor(
    private readonly pool: PgPool,
    private readonly freshMs = FRESH_MS,
  ) {}

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
    await this.pool.query("INSERT INTO benchmark_reports VALUES ($1, $2, $3, $4, $5, $6)", [
      stored.id,
      principal,
      model,
      device,
      stored.created_at,
      JSON.stringify(stored.report),
    ]);
    this.historyCache.delete(`${model}\u0000${device}`);
    return stored;
  }

  async get(id: string): Promise<StoredReport | undefined> {
    const r = (await this.pool.query("SELECT * FROM benchmark_reports WHERE id = $1", [id]))
      .rows[0];
    return r ? { ...r, report: JSON.parse(r.report) } : undefined;
  }

  async list(limit = 50): Promise<StoredReport[]> {
    const rows = (
      await this.pool.query("SELECT * FROM benchmark_reports ORDER BY created_at DESC LIMIT $1", [
        limit,
      ])
    ).rows;
    return rows.map((r) => ({ ...r, report: JSON.parse(r.report) }));
  }

  private fresh<T>(c: Cached<T> | undefined): c is Cached<T> {
    return c !== undefined && Date.now() - c.at < this.freshMs;
  }

  async history(model: string, device: string): Promise<HistoryRecord[]> {
    const key = `${model}\u0000${device}`;
    const c = this.historyCache.get(key);
    if (this.fresh(c)) return c.value;
    const rows = (
      await this.pool.query(
        "SELECT report FROM benchmark_reports WHERE model = $1 AND device = $2 ORDER BY created_at DESC LIMIT 20",
        [model, device],
      )
    ).rows as { report: string }[];
    const value = historyOf(rows.map((r) => r.report));
    this.historyCache.set(key, { value, at: Date.now() });
    return value;
  }

  async recordCall(call: CallRecord): Promise<void> {
    this.here.add(`${call.model}\u0000${call.device}\u0000${call.kind}`);
    const list = await this.calls(call.model, call.device);
    list.unshift({ ...call, key: workKey(call.kind, call.work) });
    condense(list);
    this.pendingCalls.push(call);
    if (this.pendingCalls.length === 1) setTimeout(() => void this.flushCalls(), 1000).unref();
  }

  /** Only this replica's own calls: another replica's ran on its workers, not on these. */
  measuredHere(model: string, device: string, kind: CallRecord["kind"]): boolean {
    return this.here.has(`${model}\u0000${device}\u0000${kind}`);
  }

  /** Newest first; of one work only the newest few (what SQLite's answers). */
  async calls(model: string, device: string): Promise<CallRecord[]> {
    const key = `${model}\u0000${device}`;
    const c = this.callCache.get(key);
    if (this.fresh(c)) return c.value;
    const rows = (
      await this.pool.query(
        `SELECT kind, work, seconds, at, estimate_s FROM measured_calls
         WHERE model = $1 AND device = $2 ORDER BY id DESC LIMIT $3`,
        [model, device, ROWS_KEPT],
      )
    ).rows as {
      kind: CallRecord["kind"];
      work: string;
      seconds: number;
      at: string;
      estimate_s: number | null;
    }[];
    // This replica's calls not yet written stay in its list.
    const pending = this.pendingCalls
      .filter((p) => p.model === model && p.device === device)
      .reverse()
      .map((p) => ({ ...p, key: workKey(p.kind, p.work) }));
    const list: CallRecord[] = pending.concat(
      rows.map((r) => {
        const work = JSON.parse(r.work);
        return {
          kind: r.kind,
          model,
          device,
          work,
          seconds: r.seconds,
          at: Number(r.at),
          ...(r.estimate_s !== null ? { estimate_s: r.estimate_s } : {}),
          key: workKey(r.kind, work),
        };
      }),
    );
    condense(list);
    this.callCache.set(key, { value: list, at: Date.now() });
    return list;
  }

  /** Writes the measured calls queued so far (and prunes what no list can hold any more). */
  async flushCalls(): Promise<void> {
    await this.flushing;
    if (this.pendingCalls.length === 0) return;
    const rows = this.pendingCalls;
    this.pendingCalls = [];
    this.flushing = (async () => {
      await this.pool.query(
        `INSERT INTO measured_calls (model, device, kind, work, seconds, at, estimate_s)
         SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::float8[], $6::bigint[], $7::float8[])`,
        [
          rows.map((c) => c.model),
          rows.map((c) => c.device),
          rows.map((c) => c.kind),
          rows.map((c) => JSON.stringify(c.work)),
          rows.map((c) => c.seconds),
          rows.map((c) => c.at),
          rows.map((c) => c.estimate_s ?? null),
        ],
      );
      for (const k of new Set(rows.map((c) => `${c.model}\u0000${c.device}`))) {
        const [model, device] = k.split("\u0000");
        await this.pool.query(
          `DELETE FROM measured_calls WHERE model = $1 AND device = $2 AND id <= (
             SELECT id FROM measured_calls WHERE model = $1 AND device = $2 ORDER BY id DESC LIMIT 1 OFFSET $3)`,
          [model, device, ROWS_KEPT],
        );
      }
    })()
      .catch(() => {
        // The database is unreachable: estimates in this replica still have its list.
      })
      .finally(() => (this.flushing = undefined));
    await this.flushing;
  }

  async close(): Promise<void> {
    await this.flushCalls();
  }
}
