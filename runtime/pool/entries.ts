// What a pool is made of: local workers (a subprocess on this host) and remote workers
// (`tpu_worker serve` elsewhere, reached over mutual TLS).
import type { RemoteEndpoint } from "./remote.js";
import { DEVICE_KIND_ALTERNATION, isDeviceKind, type DeviceKind } from "../../lib/device.js";

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
export const RESERVED_NAMES = new RegExp(`^(auto|${DEVICE_KIND_ALTERNATION})(:\\d+)?$`);
export const WORKER_NAME = /^[A-Za-z][A-Za-z0-9_.-]{0,62}$/;

const VISIBLE: Partial<Record<DeviceKind, string>> = {
  tpu: "TPU_VISIBLE_DEVICES",
  cuda: "CUDA_VISIBLE_DEVICES",
};

/**
 * The environment of a local worker on one chip (`tpu:N`, `cuda:N`): the chip made the only
 * visible one (TPU_VISIBLE_DEVICES=N), so the process is bound to it from its first instruction
 * (the worker would set it itself, but then it is not in the process's start-up environment,
 * /proc/PID/environ, that operators and libtpu's own children read). A visible set the operator
 * chose already is left alone (the worker maps N into it); other devices get `base` unchanged.
 */
export function chipEnv(device: string, base: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  const m = /^([a-z]+):(\d+)$/.exec(device);
  const name = m && isDeviceKind(m[1]) ? VISIBLE[m[1]] : undefined;
  if (!m || !name) return base;
  if (base[name] !== undefined && base[name]!.trim() !== "") return base;
  return { ...base, [name]: m[2]! };
}
