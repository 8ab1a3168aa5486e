// One worker of a pool: its entry, its supervised WorkerRuntime, and the pool's bookkeeping about
// it (drained, counters, free memory, the models it holds and lost, its serial chain for loads).
import type { RequestEnded, WorkerRuntime } from "../client.js";
import type { LoadedModel } from "../types.js";
import { deviceKind } from "../../lib/device.js";
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
  private readonly loaded = new Map<string, LoadedModel>();
  private readonly lost = new Set<string>();

  constructor(
    readonly entry: WorkerEntry,
    readonly rt: WorkerRuntime,
  ) {
    rt.on("ended", (e) => this.track(e));
    // A dead worker's models are gone with it; they are reported lost, never reloaded behind
    // the caller's back (the supervision rules, runtime/client.ts).
    rt.on("exit", () => {
      for (const m of this.loaded.keys()) this.lost.add(m);
      this.loaded.clear();
    });
  }

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
  /** Models loaded in the current worker process, from its load and unload results. */
  models(): LoadedModel[] {
    return [...this.loaded.values()];
  }
  holds(model: string): boolean {
    return this.loaded.has(model);
  }
  /** Models lost in the last restart, until loaded again or unloaded (which acknowledges it). */
  lostModels(): string[] {
    return [...this.lost].sort();
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

  /** Every request the worker ends, whether or not its caller still waits for it. */
  private track(e: RequestEnded): void {
    const r = e.result ?? {};
    const model =
      typeof r.model === "string"
        ? r.model
        : typeof e.args.model === "string"
          ? e.args.model
          : null;
    if (!model) return;
    if (e.op === "load" && e.result) {
      const str = (v: unknown) => (typeof v === "string" ? v : undefined);
      this.loaded.set(model, {
        model,
        device: str(r.device),
        dtype: str(r.dtype),
        mode: str(r.mode),
        loadedAt: Date.now(),
      });
      this.lost.delete(model);
    } else if (e.op === "unload" && (e.result || e.code === "model_not_loaded")) {
      // Unloading a lost model is how a caller acknowledges the loss.
      this.loaded.delete(model);
      this.lost.delete(model);
    }
  }
}
