// One worker of a pool: its entry, its supervised WorkerRuntime, and the pool's bookkeeping about
// it (drained, counters, free memory, the models it holds, its serial chain for loads).
import type { WorkerRuntime } from "../client.js";
import type { LoadedModel } from "../types.js";
import { deviceKind } from "../device.js";
import { isRemote, type WorkerEntry } from "./entries.js";

export class Member {
  draining = false;
  calls = 0;
  failures = 0;
  /** Free memory from the last status call, for placement between loads. */
  lastFree: number | null = null;
  lastTotal: number | null = null;
  /** Loads (and unloads) on this worker run one at a time. */
  private chain: Promise<unknown> = Promise.resolve();

  constructor(
    readonly entry: WorkerEntry,
    readonly rt: WorkerRuntime,
  ) {}

  get name(): string {
    return this.entry.name;
  }
  get remote(): boolean {
    return isRemote(this.entry);
  }
  /** The device as configured (`tpu:3`, `cpu`), or what the worker reported. */
  get device(): string {
    const d = this.rt.hello?.device;
    if (d) return d.kind === "cpu" ? "cpu" : `${d.kind}:${d.index}`;
    return isRemote(this.entry) ? "remote" : this.entry.device;
  }
  get kind(): string | null {
    return (
      this.rt.hello?.device.kind ?? (isRemote(this.entry) ? null : deviceKind(this.entry.device))
    );
  }
  get usable(): boolean {
    return this.rt.state === "ready" && !this.draining;
  }
  inFlight(): number {
    return this.rt.inFlight();
  }
  models(): LoadedModel[] {
    return this.rt.loadedModels();
  }
  holds(model: string): boolean {
    return this.rt.loadedModels().some((m) => m.model === model);
  }
  serial<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.chain.then(fn, fn);
    this.chain = run.catch(() => undefined);
    return run;
  }
  /** Bytes this worker may still take: its share (memory_bytes) minus what it holds, or the device's free memory. */
  free(bytesHeld: number): number | null {
    const share = isRemote(this.entry) ? undefined : this.entry.memory_bytes;
    if (share !== undefined) return share - bytesHeld;
    return this.lastFree ?? this.rt.hello?.device.memory_free_bytes ?? null;
  }
}
