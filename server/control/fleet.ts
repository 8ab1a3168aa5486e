// The Ray fleet on the server side: attaches a RayFleet to the pool when `runtime.ray` is set,
// and carries `tpu-mcp workers scale N` (admin) to it. The CLI (cli/workers.ts) writes the wanted
// count into the control channel (desired state, so it survives a restart); on each tick the
// server asks the driver to scale (removals drain in the pool first) and writes back what the
// fleet reports, which the CLI waits on.
import { join } from "node:path";
import type { Logger } from "pino";
import { FleetMembers } from "../../runtime/fleet/members.js";
import { RayFleet, type Fleet, type FleetPool, type FleetStatus } from "../../runtime/fleet/ray.js";
import type { ServerConfig } from "../config/config.js";
import { dataDir } from "../config/data_dir.js";
import { driverConfig } from "../config/ray.js";
import type { ControlChannel, ControlHandler } from "./channel.js";
import type { SharedFleetStore } from "./fleet_store.js";
import { SharedRayFleet } from "./shared_fleet.js";

/**
 * Starts the fleet for this pool; the pool's close() stops it first. Alone (SQLite): this
 * process's own driver. On a shared store: the replicas' one fleet, whose driver the replica that
 * holds its lease runs (server/control/shared_fleet.ts).
 */
export function attachRayFleet(
  pool: FleetPool & { onClose(fn: () => Promise<void>): void },
  config: ServerConfig,
  logger: Logger,
  shared?: SharedFleetStore,
): Fleet {
  const ray = config.runtime.ray!;
  const log = logger.child({ component: "ray-fleet" });
  // One folder per replica: replicas sharing a data_dir (one machine) never touch each other's pins.
  const stateDir = shared
    ? join(dataDir(config).fleetState, shared.replica.replace(/[^A-Za-z0-9._-]/g, "_"))
    : dataDir(config).fleetState;
  const driverOptions = {
    pool,
    driverConfig: driverConfig(ray),
    client: ray.client,
    tokenFile: ray.channel.token_file,
    pythonPath: config.paths.python,
    workerDir: config.paths.install.workerDir,
    drainTimeoutMs: ray.drain_timeout_s * 1000,
    logger: log,
  };
  let fleet: Fleet;
  if (shared) {
    const members = new FleetMembers({
      pool,
      client: ray.client,
      tokenFile: ray.channel.token_file,
      certDir: join(stateDir, "pins"),
      logger: log,
      drainTimeoutMs: ray.drain_timeout_s * 1000,
    });
    fleet = new SharedRayFleet({
      store: shared.store,
      listener: shared.listen((e) =>
        log.warn({ err: String(e) }, "shared Ray fleet: listener failed"),
      ),
      replica: shared.replica,
      leaseMs: shared.leaseS * 1000,
      members,
      mode: ray.placement.mode,
      logger: log,
      drainTimeoutMs: ray.drain_timeout_s * 1000,
      driver: (term, drainGate) =>
        new RayFleet({
          ...driverOptions,
          members,
          drainGate,
          stateDir: join(stateDir, `driver-${term.epoch}`),
        }),
    });
  } else fleet = new RayFleet({ ...driverOptions, stateDir });
  pool.onClose(() => fleet.close());
  fleet
    .start()
    .then((s) =>
      logger.info({ mode: s.mode, capacity: s.capacity, target: s.target }, "Ray fleet ready"),
    )
    .catch((e: unknown) => logger.error({ err: String(e) }, "Ray fleet did not start"));
  return fleet;
}

/** Applies `workers scale` (the wanted count in the channel) and publishes the fleet's actors. */
export function fleetHandler(fleet: Fleet | undefined, logger: Logger): ControlHandler | null {
  if (!fleet) return null;
  let applied: { count: number; at: string } | null = null;
  let lastError: string | null = null;
  let driverRestarts = "0/0";
  // The last actor that died or was lost, and why: `workers scale` shows it while it waits.
  let lastActorError: { name: string; reason: string; code?: string } | null = null;
  fleet.onMessage((m) => {
    if ((m.type === "dead" || m.type === "lost") && typeof m.name === "string")
      lastActorError = { name: m.name, reason: String(m.reason ?? m.type), code: m.code };
  });
  return {
    name: "fleet",
    async tick(channel: ControlChannel) {
      // A shared fleet's follower: the leader applies the wanted count and publishes the fleet.
      if (!fleet.leads()) return;
      const st = fleet.status();
      if (st.state !== "ready") {
        // Say why nothing moves (a refused driver is not retried): the CLI prints it.
        const refusal =
          st.state === "refused" && st.error ? `${st.error.code}: ${st.error.message}` : null;
        await channel.publishFleet(
          (await channel.fleetTarget())?.count ?? null,
          { ...st, last_actor_error: lastActorError },
          refusal,
        );
        return;
      }
      // A restarted driver starts from the config's count again: re-apply the recorded target.
      // So does a new term of a shared fleet (this replica leads again, with a new driver).
      const restarts = `${fleet.term?.() ?? 0}/${fleet.summary("").driver_restarts}`;
      if (restarts !== driverRestarts) {
        driverRestarts = restarts;
        applied = null;
      }
      try {
        const want = await channel.fleetTarget();
        if (want && (applied?.at !== want.at || applied.count !== want.count)) {
          applied = want;
          try {
            const r = await fleet.scale(want.count);
            lastError = null;
            logger.warn(
              { target: r.target, added: r.added, draining: r.draining },
              "Ray fleet scaled",
            );
          } catch (e) {
            lastError = `${(e as { code?: string }).code ?? "error"}: ${(e as Error).message}`;
            logger.warn({ err: lastError }, "Ray fleet scale refused");
          }
        }
        const s: FleetStatus = await fleet.actors();
        await channel.publishFleet(
          applied?.count ?? s.target ?? null,
          { ...s, last_actor_error: lastActorError },
          lastError,
        );
      } catch (e) {
        logger.debug({ err: String(e) }, "fleet status tick failed");
      }
    },
  };
}
