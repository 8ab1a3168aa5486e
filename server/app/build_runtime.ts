// Builds the compute side from the config: always a pool, of one local worker (the default,
// unchanged for a newcomer) or of several (one per chip, explicit local and remote workers), and
// with runtime.ray the fleet that places more of them.
import { availableParallelism } from "node:os";
import { join } from "node:path";
import type { Logger } from "pino";
import { WorkerRuntime, type SpawnFn, type WorkerRuntimeOptions } from "../../runtime/client.js";
import {
  WorkerPool,
  hostMayHaveAccelerators,
  perDeviceEntries,
  workerInventory,
  type InventoryFn,
  type PoolOptions,
  type RemoteRefusal,
  type WorkerEntry,
} from "../../runtime/pool/index.js";
import type { FleetState, Runtime, RuntimeCallError } from "../../runtime/types.js";
import type { Fleet } from "../../runtime/fleet/ray.js";
import type { ServerConfig } from "../config/config.js";
import { attachRayFleet } from "../control/fleet.js";
import type { SharedFleetStore } from "../control/fleet_store.js";
import { engineArgs } from "../config/engines.js";

export interface RuntimeHooks {
  needBytes?: (model: string, dtype: string | undefined) => Promise<number | null>;
  onRefused?: (r: RemoteRefusal) => void;
  onRestore?: PoolOptions["onRestore"];
  /** Stands in for `python -m tpu_worker inventory` (tests). */
  inventory?: InventoryFn;
  /** Stands in for the /dev look that decides the unset default (tests). */
  hostHasChips?: () => boolean;
  /** Stands in for child_process.spawn for local workers (tests). */
  spawn?: SpawnFn;
  /** Holds local workers back until it returns null (a package's set-up, server/setup/). */
  prerequisite?: () => RuntimeCallError | null;
  /** storage.postgres: the Ray fleet is the replicas' one fleet, shared through this store. */
  sharedFleet?: SharedFleetStore;
}

export function baseRuntimeOptions(config: ServerConfig, logger: Logger): WorkerRuntimeOptions {
  const rt = config.runtime;
  return {
    repoRoot: config.paths.root,
    workerDir: config.paths.install.workerDir,
    pythonPath: config.paths.python,
    catalogPath: config.paths.catalog,
    device: rt.device,
    extraArgs: [
      "--threads",
      String(workerThreads(rt.threads)),
      // Compiled graphs (mode "compile") kept across worker restarts: a restart loads warm.
      "--compile-cache",
      join(config.paths.data_dir, "compile-cache"),
      // Kept fine-tunes (tools/stores/kept.ts): written and served from this node's data_dir.
      "--kept-dir",
      join(config.paths.data_dir, "kept"),
      ...engineArgs(rt.engines),
    ],
    startMode: rt.start,
    requestTimeoutMs: rt.request_timeout_s * 1000,
    heartbeatIntervalMs: rt.heartbeat_interval_s * 1000,
    heartbeatTimeoutMs: rt.heartbeat_timeout_s * 1000,
    stopGraceMs: rt.stop_grace_s * 1000,
    maxRestartsInWindow: rt.max_restarts,
    restartWindowMs: rt.restart_window_s * 1000,
    logger,
  };
}

/**
 * torch intra-op threads for the local worker. Unset (0): one fewer than the host's cores, so
 * the worker's threads never contend with the control plane on the same host. torch's default
 * takes every core; a parallel region then waits for whichever of its threads the server or a
 * client preempted. On the 2-core development VM (bench/run.ts, side by side): with 2 threads a
 * batch-1 mnist-cnn forward had a p50 of 3.5 ms between calls (0.7 ms with 1), MiniLM batch 1
 * through MCP was 1.61x direct (1.19x with 1), and 32 small callers cost the worker 1.6 ms of
 * CPU per call (0.55 ms with 1). What it costs: a compute-bound batch on an otherwise idle
 * 2-core host (MiniLM, 32 callers: 150 vs 102 calls/s). Set runtime.threads to choose.
 */
export function workerThreads(configured: number, cores = availableParallelism()): number {
  return configured > 0 ? configured : Math.max(1, cores - 1);
}

/** Which shape the runtime takes: "single" keeps today's one WorkerRuntime. */
export function workersMode(
  config: ServerConfig,
  hostHasChips: () => boolean = hostMayHaveAccelerators,
): "single" | "per-device" | "list" {
  const w = config.runtime.workers;
  if (Array.isArray(w)) return "list";
  if (w) return w;
  // Unset: a host with several chips gets one worker per chip, unless a device was pinned.
  return config.runtime.device === "auto" && hostHasChips() ? "per-device" : "single";
}

/** The compute side: always a pool; with runtime.ray, the Ray fleet that adds workers to it. */
export interface BuiltRuntime {
  pool: Runtime;
  fleet?: { fleet: Fleet; state(): FleetState };
}

export function buildRuntime(
  config: ServerConfig,
  logger: Logger,
  hooks: RuntimeHooks = {},
): BuiltRuntime {
  const base = {
    ...baseRuntimeOptions(config, logger),
    ...(hooks.spawn ? { spawn: hooks.spawn } : {}),
    ...(hooks.prerequisite ? { prerequisite: hooks.prerequisite } : {}),
  };
  const mode = workersMode(config, hooks.hostHasChips);
  const ray = config.runtime.ray;
  // The newcomer's default: a pool of one local worker, started and behaving as it always did.
  if (mode === "single" && !ray) return { pool: WorkerPool.single(new WorkerRuntime(base)) };
  const inventory =
    hooks.inventory ??
    workerInventory({
      pythonPath: config.paths.python,
      repoRoot: config.paths.root,
      workerDir: config.paths.install.workerDir,
    });
  const entries: WorkerEntry[] | (() => Promise<WorkerEntry[]>) =
    mode === "list"
      ? (config.runtime.workers as WorkerEntry[])
      : mode === "single" // with runtime.ray and no workers list: the Ray actors are the pool
        ? []
        : async () => {
            let inv;
            try {
              inv = await inventory();
            } catch (e) {
              // Asked for explicitly: say so and stop. Chosen by default: keep today's one worker.
              if (config.runtime.workers === "per-device") throw e;
              logger.warn(
                { err: String(e) },
                "inventory failed; serving with one worker (set runtime.workers to choose)",
              );
              return [{ name: "w0", device: config.runtime.device }];
            }
            const list = perDeviceEntries(inv, config.runtime.threads);
            logger.info(
              { kind: inv.kind, chips: inv.count, workers: list.map((w) => w.name) },
              "per-device workers from the inventory",
            );
            return list;
          };
  const pool = new WorkerPool({
    entries,
    base,
    maxInFlightPerReplica: config.runtime.max_in_flight_per_replica,
    retryAfterMs: config.runtime.busy_retry_after_ms,
    needBytes: hooks.needBytes,
    onRefused: hooks.onRefused,
    onRestore: hooks.onRestore,
  });
  // Ray places more workers at run time; the fleet adds and removes them (server/control/fleet.ts).
  const fleet = ray ? attachRayFleet(pool, config, logger, hooks.sharedFleet) : undefined;
  // Eager start: the expansion (inventory) and every worker begin with the server.
  if (config.runtime.start === "eager" && !(ray && mode === "single"))
    setImmediate(
      () =>
        void pool
          .start()
          .catch((e: unknown) => logger.error({ err: String(e) }, "pool start failed")),
    );
  return fleet ? { pool, fleet: { fleet, state: () => fleet.summary(ray!.address) } } : { pool };
}
