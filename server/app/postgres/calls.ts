// The calls admitted and not yet charged, on the shared store, per replica: each row names the
// replica that runs the call, so a replica that starts after a kill settles the calls IT left
// behind (policies/gate/reconcile.ts) and never another live replica's running ones. The row is
// written inside the transaction of the call's `allowed` audit record where that store opens one
// (the write joins it: ambient.ts), and deleted after the call's charge. While calls run, one
// UPDATE per heartbeat stamps this replica's rows alive (the database's clock, as started_ms).
// A replica that died and never starts again under its id leaves rows nobody stamps: once a
// row's stamp is older than the call lease (storage.postgres.call_lease_s), any live replica
// settles it (`lapsed`), claiming it with one DELETE … RETURNING inside the settling
// transaction, so of two replicas settling at once one gets the row and the other none.
import { randomBytes } from "node:crypto";
import {
  callOfRow,
  HEARTBEAT_MS,
  type CallInFlight,
  type CallRow,
  type CallStart,
  type CallsInFlight,
} from "../../../policies/calls_in_flight.js";
import type { LeftBehind } from "../../../policies/gate/reconcile.js";
import { queryable, withClient } from "../../stores/pg/ambient.js";
import { inTransaction, NOW_MS, type PgPool } from "../../stores/pg/pool.js";

/** A call lease's default (storage.postgres.call_lease_s): its rows are stamped every third. */
export const CALL_LEASE_MS = 15_000;

export class PgCallsInFlight implements CallsInFlight, LeftBehind {
  private readonly live = new Set<string>();
  private heartbeat?: NodeJS.Timeout;
  private readonly heartbeatMs: number;

  constructor(
    private readonly pool: PgPool,
    private readonly replica: string,
    heartbeatMs = HEARTBEAT_MS,
    /** A row stamped no later than this ago is another live replica's (never taken). */
    readonly leaseMs = CALL_LEASE_MS,
  ) {
    // Stamped at least three times per lease: a live replica's row never looks lapsed.
    this.heartbeatMs = Math.min(heartbeatMs, leaseMs / 3);
  }

  begin(call: CallStart): { id: string; write: () => Promise<void> } {
    const id = `call_${randomBytes(12).toString("hex")}`;
    this.live.add(id);
    this.heartbeat ??= setInterval(() => void this.stampAlive().catch(() => {}), this.heartbeatMs);
    this.heartbeat.unref?.();
    const values = [
      id,
      this.replica,
      call.principal,
      call.tool,
      call.args_digest,
      JSON.stringify(call.args ?? null),
      call.estimate ? JSON.stringify(call.estimate) : null,
      call.approval_id ?? null,
    ];
    return {
      id,
      write: async () => {
        await queryable(this.pool).query(
          `INSERT INTO calls_in_flight (id, replica, principal, tool, args_digest, args, estimate, approval_id, started_ms, alive_ms)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, ${NOW_MS}, ${NOW_MS})`,
          values,
        );
      },
    };
  }

  async end(id: string): Promise<void> {
    if (!this.live.delete(id)) return;
    if (this.live.size === 0) this.stopHeartbeat();
    await queryable(this.pool).query("DELETE FROM calls_in_flight WHERE id = $1", [id]);
  }

  /** Stamps this replica's running calls alive now: one statement per heartbeat. */
  async stampAlive(): Promise<void> {
    if (this.live.size === 0) return;
    await this.pool.query(`UPDATE calls_in_flight SET alive_ms = ${NOW_MS} WHERE id = ANY($1)`, [
      [...this.live],
    ]);
  }

  private stopHeartbeat(): void {
    clearInterval(this.heartbeat);
    this.heartbeat = undefined;
  }

  /** This replica's rows that no live call of this process owns: what its previous run left. */
  async leftBehind(): Promise<CallInFlight[]> {
    const rows = (
      await queryable(this.pool).query(
        "SELECT * FROM calls_in_flight WHERE replica = $1 ORDER BY started_ms, id",
        [this.replica],
      )
    ).rows as CallRow[];
    return rows.filter((r) => !this.live.has(r.id)).map(callOfRow);
  }

  /** The reconcile in one transaction: every store's query inside `fn` joins it (ambient.ts). */
  transaction<T>(fn: () => Promise<T>): Promise<T> {
    return inTransaction(this.pool, (c) => withClient(c, fn));
  }

  /**
   * The rows of other replicas whose lease lapsed, as the reconcile settles them: `leftBehind`
   * claims them (deleted in the reconcile's transaction, so a rollback gives them back, and a
   * second replica's claim waits for it and then finds them gone), and `forget` has nothing left
   * to delete.
   */
  lapsed(): LeftBehind {
    return {
      leftBehind: async () => {
        const rows = (
          await queryable(this.pool).query(
            `DELETE FROM calls_in_flight WHERE replica <> $1 AND alive_ms <= ${NOW_MS} - $2::bigint
             RETURNING *`,
            [this.replica, Math.round(this.leaseMs)],
          )
        ).rows as CallRow[];
        return rows
          .sort((x, y) => Number(x.started_ms) - Number(y.started_ms) || (x.id < y.id ? -1 : 1))
          .map(callOfRow);
      },
      forget: async () => {},
      transaction: (fn) => this.transaction(fn),
    };
  }

  async forget(id: string): Promise<void> {
    await queryable(this.pool).query("DELETE FROM calls_in_flight WHERE id = $1", [id]);
  }

  close(): void {
    this.stopHeartbeat();
  }
}
