// The worker pool: several workers (one per chip, remote workers over mutual TLS) behind Runtime.
export { RESTORE_GUARD_MS, WorkerPool } from "./pool.js";
export type { PoolOptions, RestoreReport } from "./pool.js";
export { chipEnv, isRemote, RESERVED_NAMES, WORKER_NAME } from "./entries.js";
export type { LocalWorkerEntry, RemoteWorkerEntry, WorkerEntry } from "./entries.js";
export { remoteSpawn, splitHostPort } from "./remote.js";
export type { RemoteEndpoint, RemoteRefusal, RemoteTls } from "./remote.js";
export {
  devDir,
  hostMayHaveAccelerators,
  parseInventory,
  perDeviceEntries,
  workerInventory,
} from "./inventory.js";
export type { Inventory, InventoryFn } from "./inventory.js";
