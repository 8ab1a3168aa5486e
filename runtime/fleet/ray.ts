// The Ray fleet source: supervises the Python fleet driver (`python -m tpu_worker.fleet`) like a
// local worker and turns what it reports into pool membership. Ray places and restarts the
// worker actors; the pool connects to each actor's `serve` as a remote worker (mutual TLS +
// token, our framed protocol), so no request or tensor ever goes through the driver or Ray.
//
// Driver → us (one JSON object per line; see tpu_worker/fleet/driver.py; the actors' reports are
// applied to the pool by runtime/fleet/members.ts, which a shared fleet's followers use too):
//   endpoint  → pin the actor's certificate, add it to the pool as a remote worker; a restarted
//               actor replaces its old self (pool.replace: the models it held are loaded again)
//   lost      → drain it in the pool at once (its connection drops too; calls in flight on it
//               fail worker_died), the next `endpoint` replaces it
//   dead      → remove it from the pool
//   drain     → pool.remove (drains, waits for calls in flight), then answer {op:"drained"}
//   error     → fatal start-up refusal (no token, open cluster, placement failed): not retried
import { spawn, type ChildProcess } from "node:child_process";
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import type { Logger } from "pino";
import type { FleetState } from "../types.js";
import { FleetMembers, type FleetPool } from "./members.js";

export type { FleetPool } from "./members.js";

export interface RayFleetOptions {
  pool: FleetPool;
  /** The runtime.ray section as the driver reads it (paths absolute). */
  driverConfig: Record<string, unknown>;
  /** The control plane's client certificate and key (signed by driverConfig.channel.client_ca). */
  client: { cert: string; key: string };
  /** The worker channel token file (the same file the driver hands to the actors). */
  tokenFile: string;
  /** Where the driver config and the pinned actor certificates are written (0700). */
  stateDir: string;
  pythonPath: string;
  /** PYTHONPATH root of the worker package (runtime/worker). */
  workerDir: string;
  logger?: Logger;
  /** Restart back-off for a driver that exited unexpectedly. */
  restartBackoffMs?: number;
  drainTimeoutMs?: number;
  env?: NodeJS.ProcessEnv;
  /** The pool membership the driver's reports drive; default: one of its own (pins in stateDir). */
  members?: FleetMembers;
  /**
   * Resolves when an actor being drained may be stopped, once this pool has drained it (a shared
   * fleet waits for the other replicas' pools too); default: at once.
   */
  drainGate?: (name: string) => Promise<void>;
}

export interface FleetActor {
  name: string;
  state: string;
  restarts: number;
  ray_name: string;
  endpoint: {
    host: string;
    port: number;
    device: string;
    chips: number[];
    node: string;
    pid: number;
  } | null;
}

export interface FleetStatus {
  state: "starting" | "ready" | "refused" | "restarting" | "stopped";
  error?: { code: string; message: string };
  ray_version?: string;
  mode?: string;
  capacity?: number | null;
  target?: number;
  actors?: FleetActor[];
}

/**
 * What the server holds of a Ray fleet: its own driver (RayFleet), or a fleet that the replicas of
 * a shared store share (server/control/shared_fleet.ts), whose driver one replica at a time runs.
 */
export interface Fleet {
  readonly readyPromise: Promise<FleetStatus>;
  /** Every report of the fleet's actors (the driver's lines; on a follower, the store's rows). */
  onMessage(fn: (m: Msg) => void): void;
  status(): FleetStatus;
  summary(address: string): FleetState;
  start(): Promise<FleetStatus>;
  scale(count: number): Promise<{ target: number; added: string[]; draining: string[] }>;
  actors(): Promise<FleetStatus>;
  close(): Promise<void>;
  /** False on a replica that follows another replica's driver: it neither scales nor publishes. */
  leads(): boolean;
  /** Whether the pool's member `name` is one of the fleet's actors. */
  owns(name: string): boolean;
  /** A shared fleet's term while this replica leads it (each term runs a new driver). */
  term?(): number | null;
}

type Msg = Record<string, any>;
type Waiter = { resolve: (m: Msg) => void; reject: (e: Error) => void };

export class FleetError extends Error {
  constructor(
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

export class RayFleet implements Fleet {
  private proc: ChildProcess | null = null;
  private readonly waiters = new Map<string, Waiter>();
  private seq = 0;
  private closed = false;
  private info: FleetStatus = { state: "starting" };
  private readonly listeners: Array<(m: Msg) => void> = [];
  private readonly members: FleetMembers;
  private driverRestarts = 0;
  private readyResolve: ((s: FleetStatus) => void) | null = null;
  private readyReject: ((e: Error) => void) | null = null;
  readonly readyPromise: Promise<FleetStatus>;

  constructor(private readonly o: RayFleetOptions) {
    mkdirSync(o.stateDir, { recursive: true, mode: 0o700 });
    this.members =
      o.members ??
      new FleetMembers({
        pool: o.pool,
        client: o.client,
        tokenFile: o.tokenFile,
        certDir: o.stateDir,
        logger: o.logger,
        drainTimeoutMs: o.drainTimeoutMs,
      });
    this.readyPromise = new Promise((res, rej) => {
      this.readyResolve = res;
      this.readyReject = rej;
    });
    this.readyPromise.catch(() => undefined);
  }

  /** Every message from the driver (tests and status watchers). */
  onMessage(fn: (m: Msg) => void): void {
    this.listeners.push(fn);
  }

  status(): FleetStatus {
    return { ...this.info };
  }

  leads(): boolean {
    return true;
  }

  owns(name: string): boolean {
    return this.members.owns(name);
  }

  /** What get_runtime_status and /metrics show (the actors as of the last `actors()` call). */
  summary(address: string): FleetState {
    const i = this.info;
    const actors = (i.actors ?? []).map((a) => ({
      name: a.name,
      state: a.state,
      restarts: Math.trunc(a.restarts ?? 0),
      address: a.endpoint ? `${a.endpoint.host}:${a.endpoint.port}` : null,
      device: a.endpoint?.device ?? null,
      node: a.endpoint?.node ?? null,
    }));
    return {
      state: i.state,
      address,
      mode: i.mode ?? String((this.o.driverConfig.placement as { mode?: string })?.mode ?? "?"),
      ray_version: i.ray_version ?? null,
      capacity: i.capacity ?? null,
      target: i.target ?? null,
      observed: actors.filter((a) => a.state === "up").length,
      driver_restarts: this.driverRestarts,
      actor_restarts: actors.reduce((n, a) => n + a.restarts, 0),
      error: i.error ?? null,
      actors,
    };
  }

  start(): Promise<FleetStatus> {
    if (!this.proc && !this.closed) this.spawnDriver();
    return this.readyPromise;
  }

  /** Asks the driver for N actors; removals drain in the pool before Ray kills the actor. */
  async scale(count: number): Promise<{ target: number; added: string[]; draining: string[] }> {
    if (!Number.isInteger(count) || count < 0)
      throw new FleetError("invalid_argument", "scale needs a non-negative integer count");
    const r = (await this.request("scale", { count })) as {
      target: number;
      added: string[];
      draining: string[];
    };
    this.info = { ...this.info, target: r.target };
    return r;
  }

  async actors(): Promise<FleetStatus> {
    const r = (await this.request("status", {})) as {
      capacity: number | null;
      actors: FleetActor[];
    };
    this.info = { ...this.info, capacity: r.capacity, actors: r.actors };
    return this.status();
  }

  async close(): Promise<void> {
    this.closed = true;
    const p = this.proc;
    if (p && p.exitCode === null && p.signalCode === null) {
      const exited = new Promise((r) => p.once("exit", r));
      try {
        p.stdin?.end(JSON.stringify({ op: "stop" }) + "\n");
      } catch {
        /* already gone */
      }
      const t = setTimeout(() => p.kill("SIGKILL"), 30_000);
      await exited;
      clearTimeout(t);
    }
    this.info = { ...this.info, state: "stopped" };
    rmSync(this.o.stateDir, { recursive: true, force: true });
  }

  // ── driver process ─────────────────────────────────────────────────────────────────────────

  private spawnDriver(): void {
    const cfgPath = join(this.o.stateDir, "driver.json");
    writeFileSync(cfgPath, JSON.stringify(this.o.driverConfig), { mode: 0o600 });
    const env = {
      ...(this.o.env ?? process.env),
      PYTHONPATH: this.o.workerDir,
      PYTHONUNBUFFERED: "1",
    };
    const p = spawn(this.o.pythonPath, ["-m", "tpu_worker.fleet", "--config", cfgPath], {
      stdio: ["pipe", "pipe", "pipe"],
      env,
    });
    this.proc = p;
    this.info = { ...this.info, state: this.info.state === "starting" ? "starting" : "restarting" };
    createInterface({ input: p.stdout! }).on("line", (line) => {
      let m: Msg;
      try {
        m = JSON.parse(line) as Msg;
      } catch {
        this.o.logger?.warn({ line: line.slice(0, 200) }, "fleet driver wrote a non-JSON line");
        return;
      }
      this.onDriver(m);
    });
    createInterface({ input: p.stderr! }).on("line", (line) => {
      this.o.logger?.info({ src: "fleet" }, line.slice(0, 2000));
    });
    p.on("exit", (code, signal) => {
      this.proc = null;
      for (const w of this.waiters.values())
        w.reject(new FleetError("worker_unavailable", "the fleet driver exited"));
      this.waiters.clear();
      if (this.closed) return;
      if (code === 2) {
        // A refusal (no token, an open cluster, no placement): restarting cannot fix it.
        this.info = { ...this.info, state: "refused" };
        this.readyReject?.(
          new FleetError(
            this.info.error?.code ?? "ray_refused",
            this.info.error?.message ?? "the fleet driver refused to start",
          ),
        );
        return;
      }
      this.o.logger?.warn({ code, signal }, "fleet driver exited; restarting it");
      this.info = { ...this.info, state: "restarting" };
      this.driverRestarts++;
      // Its actors fate-share with it: the pool loses them until the new driver reports again.
      this.members.forgetAll();
      setTimeout(() => !this.closed && this.spawnDriver(), this.o.restartBackoffMs ?? 2000).unref();
    });
  }

  private request(op: string, args: Record<string, unknown>): Promise<unknown> {
    const p = this.proc;
    if (!p?.stdin || this.info.state !== "ready")
      return Promise.reject(
        new FleetError("worker_unavailable", `the Ray fleet is ${this.info.state}`),
      );
    const id = String(++this.seq);
    return new Promise((resolve, reject) => {
      this.waiters.set(id, {
        resolve: (m) =>
          m.ok ? resolve(m.result) : reject(new FleetError(m.error.code, m.error.message)),
        reject,
      });
      p.stdin!.write(JSON.stringify({ op, id, ...args }) + "\n");
    });
  }

  private send(msg: Msg): void {
    try {
      this.proc?.stdin?.write(JSON.stringify(msg) + "\n");
    } catch {
      /* the driver is gone; its exit handler takes over */
    }
  }

  private onDriver(m: Msg): void {
    for (const fn of this.listeners) fn(m);
    switch (m.type) {
      case "ready":
        this.info = {
          state: "ready",
          ray_version: m.ray_version,
          mode: m.mode,
          capacity: m.capacity,
          target: m.target,
        };
        this.readyResolve?.(this.status());
        break;
      case "error":
        this.info = { ...this.info, error: { code: m.code, message: m.message } };
        this.o.logger?.error({ code: m.code }, `Ray fleet refused: ${m.message}`);
        break;
      case "reply": {
        const w = this.waiters.get(String(m.id));
        if (w) {
          this.waiters.delete(String(m.id));
          w.resolve(m);
        }
        break;
      }
      // An actor's report: its membership in the pool (runtime/fleet/members.ts).
      case "endpoint":
      case "lost":
      case "dead":
      case "drain":
        this.members.apply(m, (n) => {
          const gate = this.o.drainGate?.(n) ?? Promise.resolve();
          void gate.catch(() => {}).then(() => this.send({ op: "drained", name: n }));
        });
        break;
      default:
        break;
    }
  }
}
