// One Ray fleet for every replica of a shared store (storage.postgres + runtime.ray). One replica
// at a time, the leader, holds the fleet driver's lease (server/app/postgres/fleet.ts) and runs
// the driver (a RayFleet); every actor its driver reports is written to the store, and every
// other replica (a follower) follows those rows into its own pool through the same membership
// code the leader's driver lines drive (runtime/fleet/members.ts). So a model loaded through one
// replica is served by the same actor through another (the actor's `serve` takes several control
// planes at once), and `get_runtime_status` shows one fleet on every replica.
//
// Terms. A replica takes the lease when it is free or expired and renews it every third of its
// length; a term whose renewal fails (expired: stalled, partitioned; or another term began) stops
// its driver at once and follows. Every row is written under the writer's term, fenced in the
// same transaction, so an old leader can never overwrite a new one's actors.
//
// Hand-over. Ray ends an actor with the driver that made it, and a driver ends when its replica
// does (its stdin closes), so the new leader finds the old actors gone: its first write marks
// every earlier term's actor lost (every replica stops routing to it), then its driver places the
// fleet again under the same names, and each replica replaces its member (pool.replace: the models
// it held are loaded again on the new actor, or reported lost). A clean stop gives the lease up at
// once; a killed leader's lease runs out first.
//
// Scale and status. `tpu-mcp workers scale` writes the wanted count to the shared control channel;
// only the leader's poller applies it and publishes what the fleet reports (fleetHandler checks
// leads()). `scale()` on a follower is refused with the leader's name.
import type { Logger } from "pino";
import { FleetMembers, type MemberMsg } from "../../runtime/fleet/members.js";
import {
  FleetError,
  type Fleet,
  type FleetActor,
  type FleetStatus,
} from "../../runtime/fleet/ray.js";
import type { FleetState } from "../../runtime/types.js";
import type {
  FleetActorRow,
  FleetLeaseView,
  FleetListener,
  FleetStore,
  FleetTerm,
} from "./fleet_store.js";

export interface SharedFleetOptions {
  store: FleetStore;
  listener: FleetListener;
  /** This replica's id (the lease's holder while it leads). */
  replica: string;
  /** The driver's lease (storage.postgres.fleet_lease_s). */
  leaseMs: number;
  /** The safety poll of the actors' rows besides the notifications (default a third of the lease). */
  pollMs?: number;
  /** This replica's pool membership: the leader's driver and the followed rows both drive it. */
  members: FleetMembers;
  /**
   * Makes this replica's driver for a term (a RayFleet on `members`), not started; `drainGate`
   * is its RayFleet's: an actor drained here is stopped once the other replicas drained it too.
   */
  driver: (term: FleetTerm, drainGate: (name: string) => Promise<void>) => Fleet;
  /** How long a scale-down waits for the other replicas' pools (runtime.ray.drain_timeout_s). */
  drainTimeoutMs: number;
  /** The placement mode the config names (status before any driver said). */
  mode: string;
  logger?: Logger;
}

type Msg = Record<string, any>;

/** What a follower last applied of one actor's row. */
interface Applied {
  endpoint: string;
  state: FleetActorRow["state"];
}

export class SharedRayFleet implements Fleet {
  private held: FleetTerm | null = null;
  private driver: Fleet | null = null;
  private view: FleetLeaseView = { holder: null, epoch: 0, info: {} };
  private rows: FleetActorRow[] = [];
  private readonly applied = new Map<string, Applied>();
  private readonly listeners: Array<(m: Msg) => void> = [];
  private timer: NodeJS.Timeout | undefined;
  private unlisten: (() => void) | undefined;
  private closed = false;
  /** The lease's last successful renewal (this process's monotonic clock). */
  private renewedAt = 0;
  /** This replica's holdings written in order (joined, then left). */
  private holdings: Promise<void> = Promise.resolve();
  /** One tick or follow at a time; the next waits for it. */
  private busy: Promise<void> = Promise.resolve();
  /** What the leader's driver said of the fleet (its ready line, a refusal, the target). */
  private info: Record<string, unknown> = {};
  /** The leader's driver's run id (Ray's actor names end in "@RUN"), as its endpoints said. */
  private run = "";
  /** The leader's writes, in the order its driver reported them. */
  private writes: Promise<void> = Promise.resolve();
  private started = false;
  private readyResolve: ((s: FleetStatus) => void) | null = null;
  readonly readyPromise: Promise<FleetStatus>;

  constructor(private readonly o: SharedFleetOptions) {
    this.readyPromise = new Promise((res) => (this.readyResolve = res));
    // Which actors this replica's pool holds, in the store: a scale-down waits for each holder.
    const record = (fn: () => Promise<void>) => {
      this.holdings = this.holdings.then(fn).catch((e: unknown) => {
        this.o.logger?.warn({ err: String(e) }, "shared Ray fleet: holding not recorded");
      });
    };
    // What a previous run of this replica (the same id) recorded is not held by this one.
    record(() => o.store.unholdAll(o.replica));
    o.members.watch({
      joined: (name) => record(() => o.store.hold(o.replica, name)),
      left: (name) => record(() => o.store.unhold(o.replica, name)),
    });
  }

  /**
   * Resolves once no other live replica's pool holds the actor `name` (each drained it: its
   * calls there finished), or after the drain timeout; the leader's driver then stops it.
   */
  private async drainGate(name: string): Promise<void> {
    const until = performance.now() + this.o.drainTimeoutMs;
    let left: string[] = [];
    while (!this.closed && performance.now() < until) {
      left = await this.o.store.holders(name, this.o.replica, this.o.leaseMs);
      if (left.length === 0) return;
      await new Promise((r) => setTimeout(r, 200));
    }
    if (left.length)
      this.o.logger?.warn(
        { worker: name, replicas: left },
        "shared Ray fleet: drain timed out on other replicas; stopping the actor anyway",
      );
  }

  onMessage(fn: (m: Msg) => void): void {
    this.listeners.push(fn);
  }

  leads(): boolean {
    return this.held !== null;
  }

  owns(name: string): boolean {
    return this.o.members.owns(name);
  }

  term(): number | null {
    return this.held?.epoch ?? null;
  }

  /** The replica that leads now (null: none holds a live lease). */
  leader(): string | null {
    return this.held ? this.o.replica : this.view.holder;
  }

  /** Starts taking part: the lease loop, the notifications and the poll. */
  start(): Promise<FleetStatus> {
    if (this.started || this.closed) return this.readyPromise;
    this.started = true;
    this.unlisten = this.o.listener.on(() => void this.schedule(() => this.follow()));
    const every = Math.max(50, Math.min(this.o.pollMs ?? this.o.leaseMs / 3, this.o.leaseMs / 3));
    this.timer = setInterval(() => void this.schedule(() => this.tick()), every);
    this.timer.unref();
    void this.schedule(() => this.tick());
    return this.readyPromise;
  }

  /** Runs `fn` after whatever runs now (the lease loop and the follower never overlap). */
  private schedule(fn: () => Promise<void>): Promise<void> {
    this.busy = this.busy.then(async () => {
      if (this.closed) return;
      try {
        await fn();
      } catch (e) {
        this.o.logger?.warn({ err: String(e) }, "shared Ray fleet: store round failed");
      }
    });
    return this.busy;
  }

  /** Resolves once the current round (lease and rows) is done (tests). */
  async settled(): Promise<void> {
    await this.busy;
    await this.writes;
    await this.o.members.settled();
  }

  /** One round: renew or take the lease, then read the rows (a follower applies them). */
  private async tick(): Promise<void> {
    await this.o.store.renewHoldings(this.o.replica);
    if (this.held) {
      let ok: boolean;
      try {
        ok = await this.o.store.renew(this.held, this.o.leaseMs);
      } catch (e) {
        // The database is away: the lease may still hold; past its length it cannot.
        ok = performance.now() - this.renewedAt < this.o.leaseMs;
        this.o.logger?.warn({ err: String(e) }, "shared Ray fleet: lease renewal failed");
      }
      if (ok) this.renewedAt = performance.now();
      else await this.stepDown("its lease expired or another replica took it");
    } else {
      const term = await this.o.store.acquire(this.o.replica, this.o.leaseMs);
      if (term) await this.lead(term);
    }
    await this.follow();
  }

  /** This replica becomes the leader for `term`: earlier actors lost, its driver started. */
  private async lead(term: FleetTerm): Promise<void> {
    let taken = false;
    try {
      taken = await this.o.store.takeOver(term);
    } catch (e) {
      this.o.logger?.warn({ err: String(e) }, "shared Ray fleet: take-over failed");
    }
    if (!taken) {
      // Not leading after all: the lease goes back for the next round (this replica's or another's).
      await this.o.store.release(term).catch(() => {});
      return;
    }
    this.held = term;
    this.info = {};
    this.renewedAt = performance.now();
    this.o.logger?.warn(
      { epoch: term.epoch },
      "shared Ray fleet: this replica took the driver's lease; starting the fleet driver",
    );
    // The earlier term's actors ended with their driver: stop routing to them here too.
    for (const name of this.o.members.names()) this.local({ type: "lost", name, restarts: 0 });
    const d = this.o.driver(term, (name) => this.drainGate(name));
    this.driver = d;
    d.onMessage((m) => this.fromDriver(term, m));
    d.start().catch((e: unknown) =>
      this.o.logger?.error({ err: String(e) }, "shared Ray fleet: the driver did not start"),
    );
  }

  /** Stops leading: the driver stops (its actors end with it), this replica follows. */
  private async stepDown(why: string, only?: FleetTerm): Promise<void> {
    const d = this.driver;
    const term = this.held;
    // A fenced write of an earlier term must not end a later one.
    if (!term || (only && only !== term)) return;
    this.held = null;
    this.driver = null;
    this.o.logger?.warn(
      { epoch: term.epoch },
      `shared Ray fleet: stopping this replica's driver (${why}); following the store`,
    );
    await d?.close();
    this.o.members.forgetAll();
  }

  /** A line of the leader's driver: the driver's RayFleet applies it to this pool; here, the store. */
  private fromDriver(term: FleetTerm, m: Msg): void {
    for (const fn of this.listeners) fn(m);
    const name = typeof m.name === "string" ? m.name : "";
    const write = async (): Promise<boolean> => {
      const s = this.o.store;
      switch (m.type) {
        case "ready":
          this.info = {
            mode: m.mode,
            capacity: m.capacity ?? null,
            target: m.target ?? null,
            ray_version: m.ray_version ?? null,
          };
          return s.setInfo(term, this.info);
        case "error":
          // A refused driver (no token, an open cluster, no placement): every replica shows why.
          this.info = { ...this.info, error: { code: m.code, message: m.message } };
          return s.setInfo(term, this.info);
        case "endpoint":
          this.run = runOf(m.ray_name) ?? this.run;
          this.applied.set(name, { endpoint: endpointKey(term.epoch, m), state: "up" });
          return s.putEndpoint(term, { ...m, name });
        case "lost":
          this.remember(name, "lost");
          return s.setState(term, name, "lost", Number(m.restarts ?? 0));
        case "drain":
          this.remember(name, "draining");
          return s.setState(term, name, "draining");
        case "dead":
        case "removed":
          this.applied.delete(name);
          return s.remove(term, name);
        default:
          return true;
      }
    };
    if (m.type === "ready")
      this.readyResolve?.({ ...(this.driver?.status() ?? { state: "ready" }), state: "ready" });
    this.writes = this.writes.then(async () => {
      if (this.held !== term) return;
      try {
        if (!(await write())) await this.schedule(() => this.stepDown("fenced: lease lost", term));
      } catch (e) {
        this.o.logger?.warn(
          { err: String(e), type: m.type },
          "shared Ray fleet: store write failed",
        );
      }
    });
  }

  private remember(name: string, state: Applied["state"]): void {
    const a = this.applied.get(name);
    if (a) this.applied.set(name, { ...a, state });
  }

  /** Applies one report to this replica's pool (a follower's row, or a take-over's lost). */
  private local(m: MemberMsg): void {
    for (const fn of this.listeners) fn(m);
    this.o.members.apply(m);
  }

  /** Reads the lease and the rows; a follower makes its pool match them. */
  private async follow(): Promise<void> {
    const [view, rows] = [await this.o.store.lease(), await this.o.store.actors()];
    this.view = view;
    this.rows = rows;
    if (!this.held && view.holder && view.info.mode !== undefined)
      this.readyResolve?.(this.status());
    if (this.held) return;
    const seen = new Set<string>();
    for (const r of rows) {
      seen.add(r.name);
      const prev = this.applied.get(r.name);
      const ep = endpointKey(r.epoch, r);
      if (r.state === "up") {
        if (prev?.endpoint === ep && prev.state === "up") continue;
        this.applied.set(r.name, { endpoint: ep, state: "up" });
        this.local({
          type: "endpoint",
          name: r.name,
          host: r.host,
          port: r.port,
          device: r.device,
          chips: r.chips,
          node: r.node,
          certificate: r.certificate,
          ray_name: r.ray_name,
          restarts: r.restarts,
        });
      } else if (prev?.state !== r.state) {
        this.applied.set(r.name, { endpoint: prev?.endpoint ?? "", state: r.state });
        if (prev) this.local({ type: r.state === "lost" ? "lost" : "drain", name: r.name });
      }
    }
    // A row gone: the actor was removed (scale-down) or is dead.
    for (const name of [...this.applied.keys()])
      if (!seen.has(name)) {
        this.applied.delete(name);
        for (const fn of this.listeners) fn({ type: "removed", name });
        this.o.members.forget(name);
      }
  }

  status(): FleetStatus {
    if (this.driver) return this.driver.status();
    const i = this.view.info;
    const refused = isError(i.error);
    return {
      state: refused ? "refused" : this.view.holder ? "ready" : "starting",
      ...(refused ? { error: i.error as { code: string; message: string } } : {}),
      ...(typeof i.ray_version === "string" ? { ray_version: i.ray_version } : {}),
      mode: typeof i.mode === "string" ? i.mode : this.o.mode,
      capacity: typeof i.capacity === "number" ? i.capacity : null,
      ...(typeof i.target === "number" ? { target: i.target } : {}),
      actors: this.rows.map(rowActor),
    };
  }

  summary(address: string): FleetState {
    const leader = this.leader();
    if (this.driver) return { ...this.driver.summary(address), leader };
    const s = this.status();
    const actors = this.rows.map((r) => ({
      name: r.name,
      state: r.state,
      restarts: r.restarts,
      address: `${r.host}:${r.port}`,
      device: r.device,
      node: r.node,
    }));
    return {
      state: s.state,
      address,
      mode: s.mode ?? this.o.mode,
      ray_version: s.ray_version ?? null,
      capacity: s.capacity ?? null,
      target: s.target ?? null,
      observed: actors.filter((a) => a.state === "up").length,
      driver_restarts: 0,
      actor_restarts: actors.reduce((n, a) => n + a.restarts, 0),
      error: s.error ?? null,
      leader,
      actors,
    };
  }

  async scale(count: number): Promise<{ target: number; added: string[]; draining: string[] }> {
    const d = this.driver;
    const term = this.held;
    if (!d || !term) throw this.notLeader("scale");
    const r = await d.scale(count);
    // The other replicas show the new target too.
    this.info = { ...this.info, target: r.target };
    const info = this.info;
    this.writes = this.writes.then(async () => {
      if (this.held === term) await this.o.store.setInfo(term, info).catch(() => false);
    });
    return r;
  }

  /** The actors; on the leader, the store's rows an earlier driver placed and the current one
   * does not report are removed (a driver restarted, or a new term, with fewer actors). */
  async actors(): Promise<FleetStatus> {
    const d = this.driver;
    const term = this.held;
    if (!d || !term) {
      await this.schedule(() => this.follow());
      return this.status();
    }
    const s = await d.actors();
    const names = (s.actors ?? []).map((a) => a.name);
    const run = runOf(s.actors?.[0]?.ray_name) ?? this.run;
    this.writes = this.writes.then(async () => {
      if (this.held === term && !(await this.o.store.removeStale(term, names, run)))
        await this.schedule(() => this.stepDown("fenced: lease lost", term));
    });
    await this.writes;
    return s;
  }

  private notLeader(what: string): FleetError {
    const holder = this.view.holder;
    return new FleetError(
      "not_leader",
      `this replica (${this.o.replica}) does not run the shared Ray fleet's driver; ${
        holder ? `replica ${holder} does` : "no replica holds its lease right now"
      }: ${what} through \`tpu-mcp workers scale\` (the leader applies it) or on that replica`,
    );
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    if (this.timer) clearInterval(this.timer);
    this.unlisten?.();
    await this.busy;
    await this.writes.catch(() => {});
    const term = this.held;
    const d = this.driver;
    this.held = null;
    this.driver = null;
    await d?.close();
    // A clean stop: another replica takes the lease now instead of after it runs out.
    if (term) await this.o.store.release(term).catch(() => {});
    await this.o.listener.close();
  }
}

function isError(e: unknown): boolean {
  return typeof e === "object" && e !== null && typeof (e as { code?: unknown }).code === "string";
}

/** The driver run of Ray's actor name `NAME@RUN`. */
function runOf(rayName: unknown): string | undefined {
  return typeof rayName === "string" && rayName.includes("@") ? rayName.split("@")[1] : undefined;
}

/** An actor's endpoint under one term: what must change for a follower to replace its member. */
function endpointKey(
  epoch: number,
  m: { host?: unknown; port?: unknown; restarts?: unknown },
): string {
  return `${epoch}/${String(m.host)}:${String(m.port)}/${String(m.restarts ?? 0)}`;
}

function rowActor(r: FleetActorRow): FleetActor {
  return {
    name: r.name,
    state: r.state,
    restarts: r.restarts,
    ray_name: r.ray_name ?? "",
    endpoint: {
      host: r.host,
      port: r.port,
      device: r.device ?? "",
      chips: r.chips,
      node: r.node ?? "",
      pid: 0,
    },
  };
}
