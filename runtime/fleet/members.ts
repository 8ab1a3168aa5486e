// Pool membership of Ray worker actors: one code path for what a fleet driver reports (its own
// driver's lines, runtime/fleet/ray.ts) and for what the shared store says another replica's
// driver reported (server/control/shared_fleet.ts). Each message names one actor:
//   endpoint → pin the actor's certificate, add it to the pool as a remote worker; a restarted
//              (or re-placed) actor replaces its old self (pool.replace: its models load again)
//   lost     → drain it in the pool at once (calls in flight on it fail worker_died)
//   dead     → remove it from the pool
//   drain    → pool.remove (drains, waits for calls in flight), then `drained(name)`
// Changes for one name run in order (an endpoint after a lost, a drain after an endpoint).
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { Logger } from "pino";
import type { WorkerEntry } from "../pool/entries.js";
import type { WorkerStatus } from "../types.js";

/** What the fleet needs from the pool: WorkerPool has exactly these. */
export interface FleetPool {
  add(entry: WorkerEntry): void;
  /** A restarted actor under the same name: its models are loaded again there (or reported lost). */
  replace(entry: WorkerEntry, prepare?: () => void): Promise<void>;
  remove(name: string, opts?: { timeoutMs?: number }): Promise<void>;
  drain(name: string): WorkerStatus;
  names(): string[];
}

/** One actor's report (a driver line, or a shared-store row put in the same shape). */
export type MemberMsg = Record<string, any>;

export interface FleetMembersOptions {
  pool: FleetPool;
  /** The control plane's client certificate and key (signed by the channel's client CA). */
  client: { cert: string; key: string };
  /** The worker channel token file (the same file the driver hands to the actors). */
  tokenFile: string;
  /** Where each actor's pinned certificate is written (0700). */
  certDir: string;
  logger?: Logger;
  drainTimeoutMs?: number;
}

export class FleetMembers {
  /** Names this fleet added to the pool (a configured worker of the same pool is never touched). */
  private readonly ours = new Set<string>();
  private readonly serial = new Map<string, Promise<void>>();
  /** Told when an actor joins this pool and when it left it (a shared fleet records both). */
  private watcher: { joined(name: string): void; left(name: string): void } | null = null;

  constructor(private readonly o: FleetMembersOptions) {
    mkdirSync(o.certDir, { recursive: true, mode: 0o700 });
  }

  /** Tells `w` of every actor that joins or leaves this pool from now on. */
  watch(w: { joined(name: string): void; left(name: string): void }): void {
    this.watcher = w;
  }

  /** Whether `name` is an actor this fleet put in the pool. */
  owns(name: string): boolean {
    return this.ours.has(name);
  }

  /** The actors this fleet put in the pool. */
  names(): string[] {
    return [...this.ours];
  }

  /** Resolves once every change queued so far has run (tests, a hand-over). */
  async settled(): Promise<void> {
    await Promise.all([...this.serial.values()]);
  }

  /** Runs membership changes for one name in order. */
  private inOrder(name: string, fn: () => Promise<void>): void {
    const prev = this.serial.get(name) ?? Promise.resolve();
    const next = prev.then(fn).catch((e: unknown) => {
      this.o.logger?.warn({ worker: name, err: String(e) }, "fleet membership change failed");
    });
    this.serial.set(name, next);
  }

  /** Removes an actor from the pool at once (dead, or its driver is gone). */
  forget(name: string): void {
    this.inOrder(name, async () => {
      if (this.o.pool.names().includes(name)) await this.o.pool.remove(name, { timeoutMs: 0 });
      this.ours.delete(name);
      this.watcher?.left(name);
    });
  }

  /** Every actor this fleet added leaves the pool (the driver that placed them is gone). */
  forgetAll(): void {
    for (const name of this.o.pool.names().filter((n) => this.ours.has(n))) this.forget(name);
  }

  /**
   * Applies one actor's report. `drained` answers a drain once the pool has no call in flight on
   * it (the driver then stops the actor); absent, a drain only removes it from this pool.
   */
  apply(m: MemberMsg, drained?: (name: string) => void): void {
    const name = typeof m.name === "string" ? m.name : "";
    if (!name) return;
    switch (m.type) {
      case "endpoint":
        this.inOrder(name, async () => {
          const ca = join(this.o.certDir, `${name}.crt`);
          // Pin exactly the certificate this actor made for itself (its key never left its node),
          // once the worker it replaces is gone (it must never reconnect with the new pin).
          const pin = () => writeFileSync(ca, String(m.certificate), { mode: 0o600 });
          const entry: WorkerEntry = {
            name,
            connect: `${String(m.host).includes(":") ? `[${m.host}]` : m.host}:${m.port}`,
            tls: { ca, cert: this.o.client.cert, key: this.o.client.key },
            token_file: this.o.tokenFile,
          };
          // A restart replaces the old member (calls in flight on it fail worker_died), and the
          // models it held are loaded again on the new actor, so none silently loses a replica.
          if (this.o.pool.names().includes(name)) await this.o.pool.replace(entry, pin);
          else {
            pin();
            this.o.pool.add(entry);
          }
          this.ours.add(name);
          this.watcher?.joined(name);
          this.o.logger?.info(
            {
              worker: name,
              address: entry.connect,
              device: m.device,
              chips: m.chips,
              restarts: m.restarts,
            },
            "Ray placed a worker; added to the pool",
          );
        });
        break;
      case "lost":
        this.inOrder(name, async () => {
          // Stop routing to it now; its connection is gone or about to be.
          if (this.o.pool.names().includes(name)) this.o.pool.drain(name);
          this.o.logger?.warn(
            { worker: name, restarts: m.restarts },
            "Ray worker lost; Ray restarts it",
          );
        });
        break;
      case "dead":
        this.o.logger?.error(
          { worker: name, reason: m.reason },
          "Ray worker dead (restarts used up)",
        );
        this.forget(name);
        break;
      case "drain":
        this.inOrder(name, async () => {
          if (this.o.pool.names().includes(name))
            await this.o.pool.remove(name, { timeoutMs: this.o.drainTimeoutMs ?? 60_000 });
          this.ours.delete(name);
          this.watcher?.left(name);
          drained?.(name);
        });
        break;
      default:
        break;
    }
  }
}
