// The shared Ray fleet's store, as the coordinator (shared_fleet.ts) uses it: the fleet driver's
// lease and the actors its driver placed. The app builds it on the shared backend
// (server/app/postgres/fleet.ts, PgFleetStore); this room names only what it needs, so the
// control room never imports the app's storage.

/** A term of the lease: who holds it and which epoch. */
export interface FleetTerm {
  holder: string;
  epoch: number;
}

/** The lease as it stands: the holder while it is live, else null. */
export interface FleetLeaseView {
  holder: string | null;
  epoch: number;
  /** The holder's driver's ready line (mode, capacity, target, ray_version). */
  info: Record<string, unknown>;
}

export interface FleetActorRow {
  name: string;
  epoch: number;
  leader: string;
  state: "up" | "lost" | "draining";
  host: string;
  port: number;
  device: string | null;
  chips: number[];
  node: string | null;
  certificate: string;
  ray_name: string | null;
  restarts: number;
}

/** The lease and the actors' rows (shared by every replica of the store). */
export interface FleetStore {
  /** Takes the lease if it is free or expired: the new term, or null (another replica holds it). */
  acquire(replica: string, leaseMs: number): Promise<FleetTerm | null>;
  /** Extends the term's lease; false once it expired or another term began (step down). */
  renew(term: FleetTerm, leaseMs: number): Promise<boolean>;
  /** Gives the lease up at once (a clean stop), so another replica takes it without waiting. */
  release(term: FleetTerm): Promise<void>;
  /** The lease now: its holder while it is live. */
  lease(): Promise<FleetLeaseView>;
  /** Records the term's driver's ready line for the other replicas; false when fenced. */
  setInfo(term: FleetTerm, info: Record<string, unknown>): Promise<boolean>;
  /** An actor serving at an endpoint (first placed, restarted or re-placed); false when fenced. */
  putEndpoint(term: FleetTerm, m: Record<string, unknown>): Promise<boolean>;
  /** An actor lost (Ray restarts it) or draining (scale-down); false when fenced. */
  setState(
    term: FleetTerm,
    name: string,
    state: "lost" | "draining",
    restarts?: number,
  ): Promise<boolean>;
  /** An actor gone (dead, or removed by a scale-down); false when fenced. */
  remove(term: FleetTerm, name: string): Promise<boolean>;
  /** A new term marks every actor of the old ones lost until its driver reports it; false when fenced. */
  takeOver(term: FleetTerm): Promise<boolean>;
  /** Removes the rows of actors the driver no longer reports (`keep`); false when fenced. */
  removeStale(term: FleetTerm, keep: string[], run: string): Promise<boolean>;
  /** `replica`'s pool holds the actor `name` (a scale-down waits for it to drain there). */
  hold(replica: string, name: string): Promise<void>;
  /** `replica`'s pool no longer holds the actor `name`. */
  unhold(replica: string, name: string): Promise<void>;
  /** Forgets every holding of `replica` (a replica starting again under its id holds nothing yet). */
  unholdAll(replica: string): Promise<void>;
  /** `replica` is alive: its holdings are renewed. */
  renewHoldings(replica: string): Promise<void>;
  /** The other replicas still holding `name` that renewed within `aliveMs`. */
  holders(name: string, replica: string, aliveMs: number): Promise<string[]>;
  /** Every actor's row, in name order. */
  actors(): Promise<FleetActorRow[]>;
}

/** What the coordinator needs of the store's notifications (server/stores/pg/notify.ts PgListener). */
export interface FleetListener {
  on(fn: (n: { origin: string; type: string; id: string }) => void): () => void;
  close(): Promise<void>;
}

/** The shared store a fleet is shared through (storage.postgres), as the app builds it. */
export interface SharedFleetStore {
  store: FleetStore;
  /** Opens the store's notifications of fleet changes; `onError` hears a failed listen. */
  listen(onError: (e: unknown) => void): FleetListener;
  /** This replica's id (the lease's holder while it leads). */
  replica: string;
  /** The driver's lease in seconds (storage.postgres.fleet_lease_s). */
  leaseS: number;
}
