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
 * The replica's status from its identity, the kinds of its own workers and its Ray fleet. On a
 * shared store a replica is a shard when it reaches workers that are its alone: local workers
 * are its own processes; a remote worker serves one control plane at a time (the replica
 * connected first holds it, the others are told `busy` and retry, so one of them takes it over
 * when the holder goes, with nothing loaded); a Ray fleet of its own (`own`: a driver that places
 * actors named per driver run, so replicas on one cluster divide its chips). A `shared` Ray fleet
 * (storage.postgres: one replica's driver, every replica reaches its actors,
 * server/control/shared_fleet.ts) is the deployment's: a replica whose only workers are its
 * actors is no shard. The note says which of these applies.
 */
export function replicaStatus(
  identity: ReplicaIdentity,
  /** The workers that are not the Ray fleet's actors. */
  workers: { kind: "local" | "remote" }[],
  rayFleet: "own" | "shared" | null,
): ReplicaStatus {
  if (identity.storage !== "postgres")
    return { ...identity, shard: false, note: "one server: its store is its own (storage.sqlite)" };
  const kinds = [
    ...(workers.some((w) => w.kind === "local") ? ["its local workers are its own processes"] : []),
    ...(workers.some((w) => w.kind === "remote")
      ? [
          "a remote worker serves one replica at a time (the others are told busy and retry, and take it over when this one goes)",
        ]
      : []),
    ...(rayFleet === "own"
      ? ["its Ray fleet driver places actors of its own (replicas on one cluster divide its chips)"]
      : []),
  ];
  const shared =
    rayFleet === "shared"
      ? "the Ray fleet is shared: every replica reaches the same actors, whose driver one replica runs (get_runtime_status's fleet.leader)"
      : null;
  if (shared && kinds.length === 0)
    return { ...identity, shard: false, note: `not a shard: the store is shared, and ${shared}` };
  const note = `a shard: the store is shared, the workers it reaches are its alone; another replica does not see its loaded models or queues (${[...kinds, ...(shared ? [shared] : [])].join("; ")})`;
  return { ...identity, shard: true, note };
}
