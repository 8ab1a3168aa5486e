// The workers' control channel on the shared store (server/control/channel.ts has the protocol):
// the operator's desired state (drained workers, the fleet's size, a reload request) and what
// the servers observe, in the same shape as workers.db, so `tpu-mcp workers` and every replica's
// poller read one state. Rows with one id are the one fleet's (one worker fleet serves every
// replica).
import type {
  ControlChannel,
  FleetObserved,
  ObservedWorker,
  PublishedFleet,
} from "../../control/channel.js";
import type { WorkerStatus } from "../../../runtime/types.js";
import { inTransaction, type PgPool } from "../../stores/pg/pool.js";

export class PgControlChannel implements ControlChannel {
  constructor(private readonly pool: PgPool) {}

  private async one<T>(sql: string): Promise<T | undefined> {
    return (await this.pool.query(sql)).rows[0] as T | undefined;
  }

  async drained(): Promise<Set<string>> {
    const r = await this.pool.query("SELECT name FROM control_drained");
    return new Set(r.rows.map((x: { name: string }) => x.name));
  }

  async setDrained(name: string, by: string): Promise<void> {
    await this.pool.query(
      `INSERT INTO control_drained (name, set_by, at) VALUES ($1, $2, $3)
       ON CONFLICT (name) DO UPDATE SET set_by = excluded.set_by, at = excluded.at`,
      [name, by, new Date().toISOString()],
    );
  }

  async clearDrained(name: string): Promise<void> {
    await this.pool.query("DELETE FROM control_drained WHERE name = $1", [name]);
  }

  async observed(): Promise<ObservedWorker[]> {
    const r = await this.pool.query("SELECT status, at FROM control_observed ORDER BY name");
    return r.rows.map((x: { status: string; at: string }) => ({
      w: JSON.parse(x.status) as WorkerStatus,
      at: x.at,
    }));
  }

  async publishWorkers(ws: WorkerStatus[]): Promise<void> {
    const now = new Date().toISOString();
    await inTransaction(this.pool, async (c) => {
      for (const w of ws)
        await c.query(
          `INSERT INTO control_observed (name, status, at) VALUES ($1, $2, $3)
           ON CONFLICT (name) DO UPDATE SET status = excluded.status, at = excluded.at`,
          [w.name, JSON.stringify(w), now],
        );
    });
  }

  fleetTarget(): Promise<{ count: number; at: string } | undefined> {
    return this.one("SELECT count, at FROM control_fleet_target WHERE id = 1");
  }

  /** Records the wanted actor count; returns when (the CLI waits for state newer than that). */
  async setFleetTarget(count: number, by: string): Promise<string> {
    const at = new Date().toISOString();
    await this.pool.query(
      `INSERT INTO control_fleet_target (id, count, set_by, at) VALUES (1, $1, $2, $3)
       ON CONFLICT (id) DO UPDATE SET count = excluded.count, set_by = excluded.set_by, at = excluded.at`,
      [count, by, at],
    );
    return at;
  }

  async fleetObserved(): Promise<FleetObserved | undefined> {
    const o = await this.one<{
      target: number | null;
      status: string;
      error: string | null;
      at: string;
    }>("SELECT target, status, error, at FROM control_fleet_observed WHERE id = 1");
    return o && { ...o, status: JSON.parse(o.status) as PublishedFleet };
  }

  async publishFleet(
    target: number | null,
    status: PublishedFleet,
    error: string | null,
  ): Promise<void> {
    await this.pool.query(
      `INSERT INTO control_fleet_observed (id, target, status, error, at) VALUES (1, $1, $2, $3, $4)
       ON CONFLICT (id) DO UPDATE SET target = excluded.target, status = excluded.status,
         error = excluded.error, at = excluded.at`,
      [target, JSON.stringify(status), error, new Date().toISOString()],
    );
  }

  reloadRequest(): Promise<{ by: string; at: string } | undefined> {
    return this.one("SELECT set_by AS by, at FROM control_reload_request WHERE id = 1");
  }

  /** Records a reload request; returns its time, which names it in the result. */
  async requestReload(by: string): Promise<string> {
    const at = new Date().toISOString();
    await this.pool.query(
      `INSERT INTO control_reload_request (id, set_by, at) VALUES (1, $1, $2)
       ON CONFLICT (id) DO UPDATE SET set_by = excluded.set_by, at = excluded.at`,
      [by, at],
    );
    return at;
  }

  reloadResult(): Promise<{ request_at: string; result: string } | undefined> {
    return this.one("SELECT request_at, result FROM control_reload_result WHERE id = 1");
  }

  async writeReloadResult(requestAt: string, result: unknown): Promise<void> {
    await this.pool.query(
      `INSERT INTO control_reload_result (id, request_at, result, at) VALUES (1, $1, $2, $3)
       ON CONFLICT (id) DO UPDATE SET request_at = excluded.request_at, result = excluded.result,
         at = excluded.at`,
      [requestAt, JSON.stringify(result), new Date().toISOString()],
    );
  }

  /** The pool is the replica's (closed with its other stores). */
  close(): void {}
}
