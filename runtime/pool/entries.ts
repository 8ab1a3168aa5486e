// What a pool is made of: local workers (a subprocess on this host) and remote workers
// (`tpu_worker serve` elsewhere, reached over mutual TLS).
import type { RemoteEndpoint } from "./remote.js";

export interface LocalWorkerEntry {
  name: string;
  /** cpu | cuda[:N] | tpu[:N] | xla[:N] | auto */
  device: string;
  /** torch intra-op threads for this worker (0 = torch's default). */
  threads?: number;
  /**
   * Memory the pool may place on this worker, in bytes. Workers sharing one host's RAM (several
   * CPU workers) each get a share; without it the device's reported free memory is used.
   */
  memory_bytes?: number;
}

export type RemoteWorkerEntry = RemoteEndpoint;

export type WorkerEntry = LocalWorkerEntry | RemoteWorkerEntry;

export function isRemote(e: WorkerEntry): e is RemoteWorkerEntry {
  return "connect" in e;
}

/** Names a worker may not take: they would read as a device. */
export const RESERVED_NAMES = /^(auto|cpu|cuda|tpu|xla)(:\d+)?$/;
export const WORKER_NAME = /^[A-Za-z][A-Za-z0-9_.-]{0,62}$/;
