// Which replica this process is, and what it shares with the others. Replicas of one deployment
// share the database and the configuration only, so the configuration cannot name a replica
// (every replica reads the same file): its id is `storage.postgres.replica_id` when one config
// per replica is wanted, else this host's name and the port it serves on, which a restart on
// the same address keeps (a restarted replica finds its own previous run's jobs by it, and only
// those). A process with no fixed port (stdio, `--port 0`) has no stable address: its id names
// its process, and what it leaves running waits for its lease to expire instead.
import { hostname } from "node:os";
import type { ReplicaStatus } from "../../tools/types.js";
import type { ServerConfig } from "../config/config.js";

/** This replica's name (jobs' owner, reservations and audit rows, the `replica` label) and store. */
export type ReplicaIdentity = Pick<ReplicaStatus, "id" | "storage">;

/** The replica's id: the configured one, else host:port, else host:pid-PID (no fixed port). */
export function replicaIdentity(
  config: Pick<ServerConfig, "storage">,
  bound: { port: number } | null,
  host: string = hostname(),
): ReplicaIdentity {
  if ("postgres" in config.storage) {
    const configured = config.storage.postgres.replica_id;
    const id = configured ?? derived(bound, host);
    return { id, storage: "postgres" };
  }
  return { id: derived(bound, host), storage: "sqlite" };
}

function derived(bound: { port: number } | null, host: string): string {
  return bound && bound.port > 0 ? `${host}:${bound.port}` : `${host}:pid-${process.pid}`;
}

/**
 * The replica's status from its identity, the kinds of its workers (not the Ray fleet's actors)
 * and its Ray fleet. On a shared store a replica is a shard when it reaches workers that are its
 * alone: local workers are its own processes; a Ray fleet of its own (`own`: a driver that places
 * actors named per driver run, so replicas on one cluster divide its chips). Shared are: remote
 * workers (`tpu_worker serve`: each serves every replica that connects, up to its
 * --max-control-planes, from one worker process, and tells each what the others load and
 * unload), and a `shared` Ray fleet (storage.postgres: one replica's driver, every replica
 * reaches its actors, server/control/shared_fleet.ts). A replica whose workers are all shared is
 * no shard: its loaded models and queues are the fleet's. The note says which of these applies.
 */
export function replicaStatus(
  identity: ReplicaIdentity,
  /** The workers that are not the Ray fleet's actors. */
  workers: { kind: "local" | "remote" }[],
  rayFleet: "own" | "shared" | null,
): ReplicaStatus {
  if (identity.storage !== "postgres")
    return { ...identity, shard: false, note: "one server: its store is its own (storage.sqlite)" };
  const own = [
    ...(workers.some((w) => w.kind === "local") ? ["its local workers are its own processes"] : []),
    ...(rayFleet === "own"
      ? ["its Ray fleet driver places actors of its own (replicas on one cluster divide its chips)"]
      : []),
  ];
  const shared = [
    ...(workers.some((w) => w.kind === "remote")
      ? [
          "its remote workers are shared: each serves every replica from one worker process, and the models loaded there, their queues and the worker's health are the same through every replica",
        ]
      : []),
    ...(rayFleet === "shared"
      ? [
          "the Ray fleet is shared: every replica reaches the same actors, whose driver one replica runs (get_runtime_status's fleet.leader)",
        ]
      : []),
  ];
  if (!own.length)
    return {
      ...identity,
      shard: false,
      note: `not a shard: the store and the workers are shared, one fleet (${shared.join("; ")})`,
    };
  const note = `a shard: the store is shared, some workers it reaches are its alone; another replica does not see what they hold or their queues (${[...own, ...shared].join("; ")})`;
  return { ...identity, shard: true, note };
}
