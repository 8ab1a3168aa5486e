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
  /** A shared remote worker's relay, from the last status call (control planes, their requests). */
  relay: { control_planes: number; max_control_planes: number; in_flight: number } | null = null;
  /** Free memory from the last status call, for placement between loads. */
  lastFree: number | null = null;
  lastTotal: number | null = null;
  /** Loads (and unloads) on this worker run one at a time. */
  private chain: Promise<unknown> = Promise.resolve();
  private readonly loaded = new Map<string, LoadedModel>();
  private readonly lost = new Set<string>();
  /** The worker args of each held or lost model's load (dtype, mode…), to load it again alike. */
  private readonly loadArgs = new Map<string, Record<string, unknown>>();
  /** Each held model's load result, for a repeated load of it with the same dtype and mode. */
  private readonly loadResults = new Map<string, Record<string, unknown>>();
  /** When the pool last loaded a model again here after a replacement (a crash-loop guard). */
  private readonly restoredAt = new Map<string, number>();
  /** Lost models the pool did not or could not load again: left to the caller, never retried. */
  private readonly givenUp = new Set<string>();

  constructor(
    readonly entry: WorkerEntry,
    readonly rt: WorkerRuntime,
  ) {
    rt.on("ended", (e) => this.track(e));
    // A shared remote worker: what another control plane loaded or unloaded there (and, after
    // each connection's hello, what it holds already) counts as if loaded or unloaded here.
    rt.on("fleet", (e) => this.track(e));
    // A dead worker's models are gone with it; they are reported lost, never reloaded behind
    // the caller's back (the supervision rules, runtime/client.ts). A shared remote worker's
    // connection that comes back names what the worker still holds (fleet), which is not lost.
    rt.on("exit", () => {
      for (const m of this.loaded.keys()) this.lost.add(m);
      this.loaded.clear();
      this.loadResults.clear();
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
  /** A held model's load: its worker args and result (whoever loaded it on a shared worker). */
  loadOf(model: string): { args: Record<string, unknown>; result: Record<string, unknown> } | null {
    const result = this.loadResults.get(model);
    return this.loaded.has(model) && result
      ? { args: this.loadArgs.get(model) ?? {}, result }
      : null;
  }
  /** Models lost in the last restart, until loaded again or unloaded (which acknowledges it). */
  lostModels(): string[] {
    return [...this.lost].sort();
  }
  /**
   * What a replacement of this worker (same name, new process or actor) takes over: the models
   * it held or lost, with their load args and when they were last loaded again by the pool.
   */
  handOver(): Array<{
    model: string;
    args: Record<string, unknown>;
    restoredAt?: number;
    givenUp?: boolean;
  }> {
    const models = new Set([...this.loaded.keys(), ...this.lost]);
    return [...models].sort().map((model) => ({
      model,
      args: this.loadArgs.get(model) ?? {},
      restoredAt: this.restoredAt.get(model),
      ...(this.givenUp.has(model) ? { givenUp: true } : {}),
    }));
  }
  /** Takes over a replaced worker's models as lost, until they are loaded here again. */
  takeOver(models: ReturnType<Member["handOver"]>): void {
    for (const x of models) {
      if (this.loaded.has(x.model)) continue;
      this.lost.add(x.model);
      this.loadArgs.set(x.model, x.args);
      if (x.restoredAt !== undefined) this.restoredAt.set(x.model, x.restoredAt);
      if (x.givenUp) this.givenUp.add(x.model);
    }
  }
  /** The pool did not load `model` again here: it stays lost until a caller loads or unloads it. */
  giveUp(model: string): void {
    this.givenUp.add(model);
  }
  /** Lost models the pool should still try to load again here. */
  toRestore(): string[] {
    return this.lostModels().filter((m) => !this.givenUp.has(m));
  }
  /** The pool loaded `model` here again after a replacement. */
  restored(model: string): void {
    this.restoredAt.set(model, Date.now());
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
      // The worker's own args (the pool already turned a worker name into "your device").
      const { device: _d, ...args } = e.args;
      this.loadArgs.set(model, args);
      this.loadResults.set(model, r);
      this.lost.delete(model);
      this.givenUp.delete(model);
    } else if (e.op === "unload" && (e.result || e.code === "model_not_loaded")) {
      // Unloading a lost model is how a caller acknowledges the loss.
      this.loaded.delete(model);
      this.lost.delete(model);
      this.loadArgs.delete(model);
      this.loadResults.delete(model);
      this.restoredAt.delete(model);
      this.givenUp.delete(model);
    }
  }
}
