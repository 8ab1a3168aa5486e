// SHARED: stored outputs (tpu://outputs/{id}/{index}) in Postgres, so an output produced through
// one replica is read back through any other (a 2026-07-28 client's next request may reach
// another replica behind the load balancer). The same promises as MemoryOutputs
// (tools/stores/outputs.ts), across replicas:
// - Bound to the principal: a read names the principal in its WHERE, so another principal's read
//   finds nothing, as a missing or expired id does.
// - A time to live on the database's clock (one clock for every replica): a read never returns an
//   expired output, and every put deletes the expired rows (with their tensors) before it evicts.
// - One bound in bytes for the whole deployment, oldest first. A put writes its tensors first,
//   outside any lock, then takes one advisory lock for the eviction: it deletes the expired rows
//   and the oldest other outputs until what stays plus its own fits, and commits (which releases
//   the lock). Under READ COMMITTED each statement after the lock sees every put committed
//   before it, so two replicas' puts never both count on the same room: the committed total is
//   at most the bound at every moment. The lock is held for the eviction only, not for the
//   upload of the bytes, so puts of large outputs from several replicas overlap.
// - Tensors exactly: dtype, shape (JSON) and the raw bytes (BYTEA), one row per tensor in order.
// The tables are UNLOGGED (schema.ts): an output is a cache, so its bytes are not written twice
// through the WAL; a crash of the database (or a failover to a standby) empties them, as a
// restart empties a replica's memory.
import type { TensorData, TensorDtype } from "../../../runtime/types.js";
import {
  newOutputId,
  tensorBytes,
  type Outputs,
  type StoredOutput,
  type StoredOutputInfo,
} from "../../../tools/stores/outputs.js";
import { inTransaction, NOW_MS, type PgPool } from "../../stores/pg/pool.js";

/** Advisory lock of the outputs' eviction (one for the deployment: the bound is one). */
const EVICT_LOCK = 7_806_000_001;

export interface PgOutputsOptions {
  /** The deployment's bound on the kept outputs' bytes (inference.outputs_max_bytes). */
  maxBytes: number;
  /** How long an output is kept (ms); default 30 min. */
  ttlMs?: number;
  /** This replica's id: the replica that produced an output (for the operator). */
  replica: string;
}

interface OutputRow {
  id: string;
  principal: string;
  model: string;
  bytes: string;
  created_ms: string;
}

export class PgOutputs implements Outputs {
  private readonly maxBytes: number;
  private readonly ttlMs: number;
  private readonly replica: string;

  constructor(
    private readonly pool: PgPool,
    opts: PgOutputsOptions,
  ) {
    this.maxBytes = opts.maxBytes;
    this.ttlMs = opts.ttlMs ?? 30 * 60_000;
    this.replica = opts.replica;
  }

  async put(principal: string, model: string, tensors: TensorData[]): Promise<StoredOutput> {
    const id = newOutputId();
    const bytes = tensorBytes(tensors);
    // Larger than the whole bound: named, never kept, and nothing evicted for it.
    if (bytes > this.maxBytes)
      return { id, principal, model, tensors, created_at: Date.now(), bytes };
    const created = await inTransaction(this.pool, async (c) => {
      const r = await c.query(
        `INSERT INTO stored_outputs (id, principal, model, bytes, replica, created_ms, expires_ms)
         VALUES ($1, $2, $3, $4, $5, ${NOW_MS}, ${NOW_MS} + $6) RETURNING created_ms`,
        [id, principal, model, bytes, this.replica, this.ttlMs],
      );
      if (tensors.length > 0) {
        const values: unknown[] = [id];
        const rows = tensors.map((t, i) => {
          values.push(i, t.dtype, JSON.stringify(t.shape), t.data);
          const n = values.length;
          return `($1, $${n - 3}, $${n - 2}, $${n - 1}::jsonb, $${n})`;
        });
        await c.query(
          `INSERT INTO stored_output_tensors (output_id, idx, dtype, shape, data) VALUES ${rows.join(", ")}`,
          values,
        );
      }
      // Serialized across replicas from here to the commit: see the file's comment.
      await c.query("SELECT pg_advisory_xact_lock($1)", [EVICT_LOCK]);
      await c.query(`DELETE FROM stored_outputs WHERE expires_ms <= ${NOW_MS} AND id <> $1`, [id]);
      // The newest others whose running total (newest first) fits beside this one stay.
      await c.query(
        `DELETE FROM stored_outputs WHERE id IN (
           SELECT id FROM (
             SELECT id, SUM(bytes) OVER (ORDER BY seq DESC) AS newer FROM stored_outputs
             WHERE id <> $1) o
           WHERE newer > $2)`,
        [id, this.maxBytes - bytes],
      );
      return Number((r.rows[0] as { created_ms: string }).created_ms);
    });
    return { id, principal, model, tensors, created_at: created, bytes };
  }

  async get(id: string, principal: string): Promise<StoredOutput | undefined> {
    const r = await this.pool.query(
      `SELECT o.id, o.principal, o.model, o.bytes, o.created_ms, t.dtype, t.shape, t.data
       FROM stored_outputs o LEFT JOIN stored_output_tensors t ON t.output_id = o.id
       WHERE o.id = $1 AND o.principal = $2 AND o.expires_ms > ${NOW_MS}
       ORDER BY t.idx`,
      [id, principal],
    );
    const rows = r.rows as (OutputRow & {
      dtype: TensorDtype | null;
      shape: number[] | null;
      data: Buffer | null;
    })[];
    if (rows.length === 0) return undefined;
    return {
      ...info(rows[0]!),
      tensors: rows
        .filter((t) => t.dtype !== null)
        .map((t) => ({ dtype: t.dtype!, shape: t.shape!, data: t.data! })),
    };
  }

  async list(principal: string): Promise<StoredOutputInfo[]> {
    const r = await this.pool.query(
      `SELECT o.id, o.principal, o.model, o.bytes, o.created_ms,
         COALESCE(json_agg(json_build_object('dtype', t.dtype, 'shape', t.shape) ORDER BY t.idx)
           FILTER (WHERE t.idx IS NOT NULL), '[]') AS tensors
       FROM stored_outputs o LEFT JOIN stored_output_tensors t ON t.output_id = o.id
       WHERE o.principal = $1 AND o.expires_ms > ${NOW_MS}
       GROUP BY o.id ORDER BY o.seq`,
      [principal],
    );
    return (r.rows as (OutputRow & { tensors: Omit<TensorData, "data">[] })[]).map((o) => ({
      ...info(o),
      tensors: o.tensors,
    }));
  }

  async bytes(): Promise<number> {
    const r = await this.pool.query(
      `SELECT COALESCE(SUM(bytes), 0) AS n FROM stored_outputs WHERE expires_ms > ${NOW_MS}`,
    );
    return Number((r.rows[0] as { n: string }).n);
  }
}

const info = (o: OutputRow): Omit<StoredOutputInfo, "tensors"> => ({
  id: o.id,
  principal: o.principal,
  model: o.model,
  bytes: Number(o.bytes),
  created_at: Number(o.created_ms),
});
