// The shared Ray fleet's state (server/control/shared_fleet.ts has the protocol): the fleet
// driver's lease, one row, held by one replica at a time on the database's clock, and the actors
// its driver placed, one row each, which every replica follows into its pool.
//
// The lease: taken only when free or expired (`acquire`, which starts a new term: epoch + 1),
// renewed by its holder every third of its length (`renew`, which fails once it expired or another
// term began). Every write of an actor's row names the writer's term and is done only while that
// term holds the lease, in the same statement: a replica that lost the lease (stalled, partitioned)
// cannot overwrite what the new holder's driver reports. Each write notifies the other replicas
// (LISTEN/NOTIFY on `tpu_mcp_fleet`), which also poll.
import { inTransaction, NOW_MS, type PgClient, type PgPool } from "../../stores/pg/pool.js";
import { newOrigin, notifySql, PgListener } from "../../stores/pg/notify.js";
import type {
  FleetActorRow,
  FleetLeaseView,
  FleetStore,
  FleetTerm,
  SharedFleetStore,
} from "../../control/fleet_store.js";

export const FLEET_CHANNEL = "tpu_mcp_fleet";

/** SQL true while `term` ($1 holder, $2 epoch) holds the lease. */
const HOLDS = `EXISTS (SELECT 1 FROM fleet_lease WHERE id = 1 AND holder = $1::text AND epoch = $2::bigint AND until_ms > ${NOW_MS})`;

/** The fleet store (server/control/fleet_store.ts) on storage.postgres. */
export class PgFleetStore implements FleetStore {
  constructor(
    private readonly pool: PgPool,
    /** This process's origin in notifications (notify.ts newOrigin). */
    private readonly origin: string,
  ) {}

  /** Takes the lease if it is free or expired: the new term, or null (another replica holds it). */
  async acquire(replica: string, leaseMs: number): Promise<FleetTerm | null> {
    const r = await this.pool.query(
      `UPDATE fleet_lease SET holder = $1, epoch = epoch + 1, until_ms = ${NOW_MS} + $2::bigint,
         info = '{}'::jsonb
       WHERE id = 1 AND (holder IS NULL OR until_ms <= ${NOW_MS}) RETURNING epoch`,
      [replica, Math.round(leaseMs)],
    );
    if (r.rowCount !== 1) return null;
    const term = { holder: replica, epoch: Number(r.rows[0].epoch) };
    await this.notify("lease", String(term.epoch));
    return term;
  }

  /** Extends the term's lease; false once it expired or another term began (step down). */
  async renew(term: FleetTerm, leaseMs: number): Promise<boolean> {
    const r = await this.pool.query(
      `UPDATE fleet_lease SET until_ms = ${NOW_MS} + $3::bigint
       WHERE id = 1 AND holder = $1 AND epoch = $2 AND until_ms > ${NOW_MS}`,
      [term.holder, term.epoch, Math.round(leaseMs)],
    );
    return r.rowCount === 1;
  }

  /** Gives the lease up at once (a clean stop), so another replica takes it without waiting. */
  async release(term: FleetTerm): Promise<void> {
    await this.pool.query(
      `UPDATE fleet_lease SET holder = NULL, until_ms = 0 WHERE id = 1 AND holder = $1 AND epoch = $2`,
      [term.holder, term.epoch],
    );
    await this.notify("lease", String(term.epoch));
  }

  /** The lease now: its holder while it is live. */
  async lease(): Promise<FleetLeaseView> {
    const r = await this.pool.query(
      `SELECT CASE WHEN until_ms > ${NOW_MS} THEN holder END AS holder, epoch, info
       FROM fleet_lease WHERE id = 1`,
    );
    const row = r.rows[0] as { holder: string | null; epoch: string; info: unknown } | undefined;
    return {
      holder: row?.holder ?? null,
      epoch: Number(row?.epoch ?? 0),
      info: (row?.info as Record<string, unknown>) ?? {},
    };
  }

  /** Records the term's driver's ready line for the other replicas; false when fenced. */
  setInfo(term: FleetTerm, info: Record<string, unknown>): Promise<boolean> {
    return this.fenced(
      term,
      `UPDATE fleet_lease SET info = $3::jsonb WHERE id = 1 AND holder = $1 AND epoch = $2 AND until_ms > ${NOW_MS}`,
      [JSON.stringify(info)],
      "info",
      "",
    );
  }

  /** An actor serving at an endpoint (first placed, restarted or re-placed); false when fenced. */
  putEndpoint(term: FleetTerm, m: Record<string, unknown>): Promise<boolean> {
    return this.fenced(
      term,
      `INSERT INTO fleet_actors (name, epoch, leader, state, host, port, device, chips, node,
         certificate, ray_name, restarts, updated_ms)
       SELECT $3::text, $2::bigint, $1::text, 'up', $4::text, $5::int, $6::text, $7::jsonb, $8::text,
         $9::text, $10::text, $11::int, ${NOW_MS} WHERE ${HOLDS}
       ON CONFLICT (name) DO UPDATE SET epoch = excluded.epoch, leader = excluded.leader,
         state = 'up', host = excluded.host, port = excluded.port, device = excluded.device,
         chips = excluded.chips, node = excluded.node, certificate = excluded.certificate,
         ray_name = excluded.ray_name, restarts = excluded.restarts, updated_ms = excluded.updated_ms`,
      [
        String(m.name),
        String(m.host),
        Number(m.port),
        m.device == null ? null : String(m.device),
        JSON.stringify(Array.isArray(m.chips) ? m.chips : []),
        m.node == null ? null : String(m.node),
        String(m.certificate),
        m.ray_name == null ? null : String(m.ray_name),
        Math.trunc(Number(m.restarts ?? 0)),
      ],
      "endpoint",
      String(m.name),
    );
  }

  /** An actor lost (Ray restarts it) or draining (scale-down); false when fenced. */
  setState(
    term: FleetTerm,
    name: string,
    state: "lost" | "draining",
    restarts?: number,
  ): Promise<boolean> {
    return this.fenced(
      term,
      `UPDATE fleet_actors SET state = $4::text, restarts = COALESCE($5::int, restarts), updated_ms = ${NOW_MS}
       WHERE name = $3::text AND ${HOLDS}`,
      [name, state, restarts ?? null],
      state,
      name,
    );
  }

  /** An actor gone (dead, or removed by a scale-down); false when fenced. */
  remove(term: FleetTerm, name: string): Promise<boolean> {
    return this.fenced(
      term,
      `DELETE FROM fleet_actors WHERE name = $3::text AND ${HOLDS}`,
      [name],
      "removed",
      name,
    );
  }

  /**
   * A new term's start: every actor an earlier term placed is lost (its driver is gone, and Ray
   * ends an actor with its driver), so every replica stops routing to it until this term's driver
   * reports it again; false when fenced.
   */
  takeOver(term: FleetTerm): Promise<boolean> {
    return this.fenced(
      term,
      `UPDATE fleet_actors SET state = 'lost', updated_ms = ${NOW_MS} WHERE epoch < $2 AND ${HOLDS}`,
      [],
      "takeover",
      "",
    );
  }

  /**
   * Removes the rows an earlier driver placed that the current one does not report: `keep` is
   * the names it reports, `run` its run id (the part of Ray's actor name after "@"). A row of the
   * current run is kept even when not in `keep` (placed after that report was taken).
   */
  removeStale(term: FleetTerm, keep: string[], run: string): Promise<boolean> {
    return this.fenced(
      term,
      `DELETE FROM fleet_actors WHERE NOT (name = ANY($3::text[]))
         AND (epoch < $2::bigint OR ray_name IS NULL OR split_part(ray_name, '@', 2) <> $4::text)
         AND ${HOLDS}`,
      [keep, run],
      "removed",
      "",
    );
  }

  /** `replica`'s pool holds the actor `name` (a scale-down waits for it to drain there). */
  async hold(replica: string, name: string): Promise<void> {
    await this.pool.query(
      `INSERT INTO fleet_holders (name, replica, alive_ms) VALUES ($1, $2, ${NOW_MS})
       ON CONFLICT (name, replica) DO UPDATE SET alive_ms = excluded.alive_ms`,
      [name, replica],
    );
  }

  /** `replica`'s pool no longer holds the actor `name`. */
  async unhold(replica: string, name: string): Promise<void> {
    await this.pool.query("DELETE FROM fleet_holders WHERE name = $1 AND replica = $2", [
      name,
      replica,
    ]);
  }

  /** Forgets every holding of `replica` (a replica starting again under its id holds nothing yet). */
  async unholdAll(replica: string): Promise<void> {
    await this.pool.query("DELETE FROM fleet_holders WHERE replica = $1", [replica]);
  }

  /** `replica` is alive: its holdings are renewed. */
  async renewHoldings(replica: string): Promise<void> {
    await this.pool.query(`UPDATE fleet_holders SET alive_ms = ${NOW_MS} WHERE replica = $1`, [
      replica,
    ]);
  }

  /**
   * The replicas other than `replica` whose pools still hold the actor `name` and renewed that
   * within `aliveMs` (a replica that stopped renewing is gone: its pool is no reason to wait).
   */
  async holders(name: string, replica: string, aliveMs: number): Promise<string[]> {
    const r = await this.pool.query(
      `SELECT replica FROM fleet_holders
       WHERE name = $1 AND replica <> $2 AND alive_ms > ${NOW_MS} - $3::bigint ORDER BY replica`,
      [name, replica, Math.round(aliveMs)],
    );
    return r.rows.map((x: { replica: string }) => x.replica);
  }

  /** Every actor's row, in name order. */
  async actors(): Promise<FleetActorRow[]> {
    const r = await this.pool.query(
      `SELECT name, epoch, leader, state, host, port, device, chips, node, certificate, ray_name,
         restarts FROM fleet_actors ORDER BY name`,
    );
    return r.rows.map((x: Record<string, unknown>) => ({
      name: x.name as string,
      epoch: Number(x.epoch),
      leader: x.leader as string,
      state: x.state as FleetActorRow["state"],
      host: x.host as string,
      port: Number(x.port),
      device: (x.device as string | null) ?? null,
      chips: (x.chips as number[]) ?? [],
      node: (x.node as string | null) ?? null,
      certificate: x.certificate as string,
      ray_name: (x.ray_name as string | null) ?? null,
      restarts: Number(x.restarts),
    }));
  }

  /**
   * Runs `sql` ($1 holder, $2 epoch, then `args`) with a notification in one transaction, only
   * while the term holds the lease: false when it does not (nothing written). A statement that
   * touches no row while the term holds the lease (a `lost` for an actor with no row) is true.
   */
  private async fenced(
    term: FleetTerm,
    sql: string,
    args: unknown[],
    type: string,
    id: string,
  ): Promise<boolean> {
    return inTransaction(this.pool, async (c: PgClient) => {
      const holds = await c.query(
        `SELECT 1 FROM fleet_lease WHERE id = 1 AND holder = $1 AND epoch = $2 AND until_ms > ${NOW_MS} FOR SHARE`,
        [term.holder, term.epoch],
      );
      if (holds.rowCount !== 1) return false;
      await c.query(sql, [term.holder, term.epoch, ...args]);
      const n = notifySql(FLEET_CHANNEL, this.origin, type, id);
      await c.query(n.text, n.values);
      return true;
    });
  }

  private async notify(type: string, id: string): Promise<void> {
    const n = notifySql(FLEET_CHANNEL, this.origin, type, id);
    await this.pool.query(n.text, n.values);
  }
}

/** The replicas' one Ray fleet on this pool: its store and its notifications, for this replica. */
export function sharedFleetStore(pool: PgPool, replica: string, leaseS: number): SharedFleetStore {
  return {
    store: new PgFleetStore(pool, newOrigin()),
    listen: (onError) => new PgListener(pool, FLEET_CHANNEL, { onError }),
    replica,
    leaseS,
  };
}
