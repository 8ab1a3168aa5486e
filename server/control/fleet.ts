// The Ray fleet on the server side: attaches a RayFleet to the pool when `runtime.ray` is set,
// and carries `tpu-mcp workers scale N` (admin) to it. The CLI (cli/workers.ts) writes the wanted
// count into the control channel (desired state, so it survives a restart); on each tick the
// server asks the driver to scale (removals drain in the pool first) and writes back what the
// fleet reports, which the CLI waits on.
import type { Logger } from "pino";
import { RayFleet, type FleetPool, type FleetStatus } from "../../runtime/fleet/ray.js";
import type { ServerConfig } from "../config/config.js";
import { dataDir } from "../config/data_dir.js";
import { driverConfig } from "../config/ray.js";
import type { ControlHandler } from "./channel.js";

/** Starts the fleet driver for this pool; the pool's close() stops the driver first. */
export function attachRayFleet(
  pool: FleetPool & { onClose(fn: () => Promise<void>): void },
  config: ServerConfig,
  logger: Logger,
): RayFleet {
  const ray = config.runtime.ray!;
  const fleet = new RayFleet({
    pool,
    driverConfig: driverConfig(ray),
    client: ray.client,
    tokenFile: ray.channel.token_file,
    stateDir: dataDir(config).fleetState,
    pythonPath: config.paths.python,
    workerDir: config.paths.install.workerDir,
    drainTimeoutMs: ray.drain_timeout_s * 1000,
    logger: logger.child({ component: "ray-fleet" }),
  });
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
export function fleetHandler(fleet: RayFleet | undefined, logger: Logger): ControlHandler | null {
  if (!fleet) return null;
  let applied: { count: number; at: string } | null = null;
  let lastError: string | null = null;
  let driverRestarts = 0;
  // The last actor that died or was lost, and why: `workers scale` shows it while it waits.
  let lastActorError: { name: string; reason: string; code?: string } | null = null;
  fleet.onMessage((m) => {
    if ((m.type === "dead" || m.type === "lost") && typeof m.name === "string")
      lastActorError = { name: m.name, reason: String(m.reason ?? m.type), code: m.code };
  });
  return {
    name: "fleet",
    async tick(channel) {
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
      const restarts = fleet.summary("").driver_restarts;
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
