// WorkerPool: the runtime is always a pool. Its workers (local subprocesses, remote `tpu_worker
// serve` endpoints) sit behind the one `Runtime` interface; `WorkerPool.single` is the default
// pool of one local worker, which places nothing and passes everything through unchanged. Each
// worker is a WorkerRuntime (runtime/client.ts) with its own supervision. This file holds the
// membership mechanics (add, remove, drain, expand, attach) and the operations below; which
// worker takes a call is placement.ts, chosen once (`place`) and reused by the call.
//
// - load: placement. `device` may name a worker (`w0`), a chip (`tpu:3`) or a kind (`cpu`);
//   candidates are ready, undrained workers of that kind that do not hold the model yet and
//   whose free memory holds the model (needBytes, the estimate's figure with its headroom);
//   ordered by fewest loaded models, then fewest calls in flight. `replicas` loads on that many
//   workers in parallel; loads on one worker are serialised.
// - infer: routing among the replicas holding the model: power of two choices on calls in
//   flight, each replica capped at maxInFlightPerReplica; all at cap → `busy` + retry_after_ms.
//   A load held already as asked (same dtype and mode) on enough workers is answered from
//   their load, without a worker call (another replica's load on a shared remote worker).
// - unload: every replica, or the one `device` names.
// - status: every worker's own status, plus `workers` (placement, state, in flight, memory).
// - bench/check: the worker `device` names, else the least busy one of the right kind.
//
// Failover comes from the members: a dead worker rejects its calls in flight with worker_died,
// is no longer a candidate (not ready) so new calls go to the other replicas, restarts (local)
// or reconnects (remote) with backoff, and reports its models lost.
// Drain: a drained worker takes no new calls or loads; calls in flight finish.
//
// Why this file is over 500 lines: the operations (load with its memory placement and replicas,
// unload, status aggregation) share the membership state and the per-worker serial chains; the
// placement policy (placement.ts), a member's bookkeeping (member.ts) and the status rows
// (status.ts) are already apart. A next step: load/unload/status as functions over a pool view.
import { WorkerRuntime, type WorkerRuntimeOptions } from "../client.js";
import {
  RuntimeCallError,
  type CallOptions,
  type CallResult,
  type DeviceInfo,
  type LoadedModel,
  type Placement,
  type Runtime,
  type RuntimeEvents,
  type WorkerHello,
  type WorkerState,
  type WorkerStatus,
} from "../types.js";
import { namesChip } from "../../lib/device.js";
import type { OpArgs, OpName, OpResult, ReloadCatalogResult } from "../wire/ops.js";
import { chipEnv, isRemote, type WorkerEntry } from "./entries.js";
import { Member } from "./member.js";
import {
  Ticket,
  candidates,
  choose,
  named,
  order,
  powerOfTwo,
  randomPick,
  resolve,
  type Pick,
} from "./placement.js";
import { remoteSpawn, type RemoteRefusal } from "./remote.js";
import { formatBytes } from "../../lib/units.js";
import { statusOf } from "./status.js";

export interface PoolOptions {
  /** Workers, or a function giving them (the per-device expansion runs once, at start). */
  entries: WorkerEntry[] | (() => Promise<WorkerEntry[]>);
  /** Options every worker shares (paths, timeouts, logger); per-entry device/threads/spawn win. */
  base?: WorkerRuntimeOptions;
  /** Calls in flight a replica may hold before routing looks elsewhere. Default 16. */
  maxInFlightPerReplica?: number;
  /** The retry hint given with `busy`. Default 100 ms. */
  retryAfterMs?: number;
  /** Bytes a model needs on a device (with the estimate's headroom); null when unknown. */
  needBytes?: (model: string, dtype: string | undefined) => Promise<number | null>;
  /** A remote worker refused us (TLS, token) or could not be reached: for the audit trail. */
  onRefused?: (r: RemoteRefusal) => void;
  /** A replaced worker's model was loaded again on its replacement, or could not be. */
  onRestore?: (r: RestoreReport) => void;
  /** Builds a member (tests substitute spawn functions here). */
  makeRuntime?: (entry: WorkerEntry, opts: WorkerRuntimeOptions) => WorkerRuntime;
  /** The random draw of power-of-two routing (tests inject a seeded one). */
  pick?: Pick;
}

/** What became of one model of a replaced worker (`replace`): the control plane's own load. */
export interface RestoreReport {
  worker: string;
  model: string;
  /** The worker args of the original load (dtype, mode…), reused as they were. */
  args: Record<string, unknown>;
  outcome: "restored" | "failed" | "skipped";
  code?: string;
  message?: string;
}

/**
 * A model is not loaded again on a replacement if the pool already did so less than this long
 * before the worker was lost: the model may be what kills the worker (the supervision rule).
 */
export const RESTORE_GUARD_MS = 60_000;

type AnyListener = (...a: any[]) => void;

export class WorkerPool implements Runtime {
  private members: Member[] = [];
  private readonly listeners = new Map<string, AnyListener[]>();
  private readonly closeHooks: Array<() => Promise<void>> = [];
  private expanding: Promise<void> | null = null;
  private closed = false;
  /** Bytes on device per (worker, model), from load results. */
  private readonly held = new Map<string, number>();
  private readonly cap: number;
  private readonly retryAfterMs: number;
  private readonly pick: Pick;

  /**
   * A pool of one local worker (the default): it places nothing, so calls, answers, errors and
   * events pass through unchanged: no worker names on them, no pool series, no pool fields.
   */
  static single(rt: WorkerRuntime, name = "w0"): WorkerPool {
    const pool = new WorkerPool({ entries: [] }, true);
    pool.members.push(new Member({ name, device: rt.options.device }, rt));
    return pool;
  }

  constructor(
    private readonly opts: PoolOptions,
    readonly single = false,
  ) {
    this.cap = opts.maxInFlightPerReplica ?? 16;
    this.retryAfterMs = opts.retryAfterMs ?? 100;
    this.pick = opts.pick ?? randomPick;
    if (Array.isArray(opts.entries)) for (const e of opts.entries) this.addMember(e);
  }

  // ── membership (a clean API for run-time changes, e.g. Ray placing remote workers) ───────

  /** Adds a worker; it starts when the base options say eager, else on first use. */
  add(entry: WorkerEntry): void {
    if (this.closed) throw new Error("the pool is closed");
    if (this.single) throw new Error("a single-worker pool takes no other workers");
    this.addMember(entry);
  }

  /** Drains a worker, waits for its calls in flight, then stops and removes it. */
  async remove(name: string, opts: { timeoutMs?: number } = {}): Promise<void> {
    const m = this.member(name);
    m.draining = true;
    const until = Date.now() + (opts.timeoutMs ?? 60_000);
    while (m.rt.inFlight() > 0 && Date.now() < until) await sleep(50);
    this.members = this.members.filter((x) => x !== m);
    await m.rt.close();
  }

  /**
   * Replaces a worker by a new one of the same name (Ray restarted an actor: a new endpoint).
   * The models the old one held are loaded again on the new one once it is ready, with the same
   * args, through placement and its memory check as a load would be, so a model keeps its
   * replica count; until then, and for good if that fails, they are its lost_models. Every
   * outcome is logged and goes to onRestore. A model the pool reloaded less than
   * RESTORE_GUARD_MS before the loss is not loaded again (it may be what kills the worker).
   * `prepare` runs after the old worker is gone and before the new one is added.
   */
  async replace(entry: WorkerEntry, prepare?: () => void): Promise<void> {
    const old = this.members.find((m) => m.name === entry.name);
    // Removing it closes its runtime, whose exit moves what it held to lost.
    if (old) await this.remove(entry.name, { timeoutMs: 0 });
    // `prepare` runs between the two (the fleet pins the new certificate once the old is gone).
    prepare?.();
    this.add(entry);
    if (!old) return;
    const m = this.member(entry.name);
    m.takeOver(old.handOver());
    void this.restore(m);
  }

  drain(name: string): WorkerStatus {
    const m = this.member(name);
    m.draining = true;
    return this.statusOf(m);
  }

  undrain(name: string): WorkerStatus {
    const m = this.member(name);
    m.draining = false;
    return this.statusOf(m);
  }

  names(): string[] {
    return this.members.map((m) => m.name);
  }

  workers(): WorkerStatus[] {
    return this.members.map((m) => this.statusOf(m));
  }

  /** The worker a device string names, or undefined (a kind names no single worker). */
  workerFor(device: string | undefined): string | undefined {
    return named(this.members, device)?.name;
  }

  /** Runs before the workers close (a Ray fleet stops its driver first). */
  onClose(fn: () => Promise<void>): void {
    this.closeHooks.push(fn);
  }

  /** Where a call will run, chosen once: the gate queues on its lane, the call reuses it. */
  place(op: string, args: Record<string, unknown>): Placement {
    if (this.single) {
      // One worker: the lane is its device as the call names it ("default": its own chip).
      const only = this.members[0]!;
      const asked = typeof args.device === "string" ? args.device : "default";
      const own = only.rt.hello?.device;
      const lane = asked === "default" && own ? `${own.kind}:${own.index}` : asked;
      return new Ticket(op, lane, only.name, false);
    }
    return choose(this.members, op, args);
  }

  // ── Runtime ──────────────────────────────────────────────────────────────────────────────

  get state(): WorkerState {
    const states = this.members.map((m) => m.rt.state);
    if (states.includes("ready")) return "ready";
    if (states.includes("restarting")) return "restarting";
    if (states.includes("starting")) return "starting";
    if (states.length && states.every((s) => s === "failed")) return "failed";
    return "stopped";
  }

  get hello(): WorkerHello | null {
    return (
      this.members.find((m) => m.rt.state === "ready")?.rt.hello ??
      this.members.find((m) => m.rt.hello)?.rt.hello ??
      null
    );
  }

  async start(): Promise<WorkerHello> {
    await this.expand();
    return this.firstReady(this.members.map((m) => m.rt.start()));
  }

  async ready(): Promise<WorkerHello> {
    await this.expand();
    return this.firstReady(this.members.map((m) => m.rt.ready()));
  }

  lostModels(): string[] {
    const lost = new Set<string>();
    for (const m of this.members) for (const x of m.lostModels()) lost.add(x);
    return [...lost].sort();
  }

  restarts(): number {
    return this.members.reduce((n, m) => n + m.rt.restarts(), 0);
  }

  inFlight(): number {
    return this.members.reduce((n, m) => n + m.rt.inFlight(), 0);
  }

  loadedModels(): LoadedModel[] {
    return this.members.flatMap((m) => m.models());
  }

  on<E extends keyof RuntimeEvents>(event: E, fn: RuntimeEvents[E]): void {
    const list = this.listeners.get(event) ?? [];
    list.push(fn as AnyListener);
    this.listeners.set(event, list);
    for (const m of this.members) this.attach(m, event, fn as AnyListener);
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const fn of this.closeHooks.splice(0)) await fn().catch(() => undefined);
    await Promise.allSettled(this.members.map((m) => m.rt.close()));
  }

  async call<O extends OpName>(
    op: O,
    opArgs: OpArgs<O>,
    opts: CallOptions = {},
  ): Promise<CallResult<OpResult<O>>> {
    type T = OpResult<O>;
    // The pool reads args generically; the op table typed them for the caller.
    const args = opArgs as Record<string, unknown>;
    if (op === "reload_catalog") return (await this.reloadCatalog(opts)) as CallResult<T>;
    // One worker: nothing to place; its answers and errors pass through as they are.
    if (this.single) {
      // Status never waits on a worker in a crash loop (a failed one throws its own reason).
      if (op === "status" && !(await this.answering(opts.signal)).length) {
        const only = this.members[0]!;
        if (only.rt.state === "restarting") throw this.noWorker(undefined);
      }
      return this.send<T>(this.members[0]!, op, args, opts);
    }
    await this.expand();
    switch (op) {
      case "load":
        return (await this.load(args, opts)) as CallResult<T>;
      case "unload":
        return (await this.unload(args, opts)) as CallResult<T>;
      case "infer":
        return this.send<T>(this.route(String(args.model)), op, args, opts);
      case "status":
        return (await this.status(args, opts)) as CallResult<T>;
      case "benchmark":
      case "check": {
        const device = typeof args.device === "string" ? args.device : undefined;
        const c = candidates(this.members, device, undefined);
        if (!c.length) throw this.noWorker(device);
        const m = this.placed(opts.placement, c) ?? order(c)[0]!;
        return this.send<T>(m, op, this.forWorker(m, args, device), opts);
      }
      default: {
        const m = (await this.readyMembers())[0];
        if (!m) throw this.noWorker(undefined);
        return this.send<T>(m, op, args, opts);
      }
    }
  }

  // ── operations ───────────────────────────────────────────────────────────────────────────

  private async load(args: Record<string, unknown>, opts: CallOptions): Promise<CallResult> {
    const model = String(args.model);
    const replicas = typeof args.replicas === "number" ? args.replicas : 1;
    const device = typeof args.device === "string" ? args.device : undefined;
    const { replicas: _r, ...workerArgs } = args;
    await this.readyMembers();
    if (replicas > 1 && candidates(this.members, device, model).length < replicas) {
      // Right after start-up some workers may still be starting: a load asking for more
      // replicas than are ready yet waits for them (bounded), instead of refusing.
      const waiting = (device ? resolve(this.members, device) : this.members).filter(
        (m) => m.rt.state !== "ready" && m.rt.state !== "failed",
      );
      if (waiting.length)
        await this.settleWithin(
          waiting.map((m) => m.rt.ready()),
          60_000,
        );
    }
    const scope = device ? resolve(this.members, device) : this.members;
    if (!scope.length) throw this.noWorker(device);
    const open = candidates(this.members, device, model);
    if (!open.length) {
      const holders = scope.filter((m) => m.holds(model));
      // Loaded already, as asked, on as many workers as asked (e.g. by another replica on a
      // shared remote worker): the load is answered from theirs, without a worker call.
      const same = holders.filter((m) => m.usable && sameLoad(m.loadOf(model), workerArgs));
      if (same.length && same.length >= replicas) {
        const held = same.slice(0, replicas);
        if (opts.placement instanceof Ticket) for (const m of held) opts.placement.note(m.name);
        return alreadyLoaded(held, model);
      }
      if (holders.length)
        throw new RuntimeCallError(
          "model_already_loaded",
          `${model} is already loaded on ${holders.map((m) => m.name).join(", ")}${scope.length > holders.length ? "; the other workers are not ready or drained" : ""}; use it, or unload it first`,
          false,
          { workers: holders.map((m) => m.name) },
        );
      throw this.noWorker(device);
    }
    // Fresh free memory from every candidate (loads are rare; placement must not guess).
    await Promise.all(open.map((m) => this.refreshMemory(m, opts.signal)));
    const need = this.opts.needBytes
      ? await this.opts.needBytes(model, typeof args.dtype === "string" ? args.dtype : undefined)
      : null;
    const fits = open.filter((m) => {
      const free = m.free(this.heldBy(m));
      return need === null || free === null || free >= need;
    });
    if (fits.length < replicas) {
      const where = open
        .map((m) => {
          const free = m.free(this.heldBy(m));
          return `${m.name} ${free === null ? "unknown" : formatBytes(free)} free`;
        })
        .join(", ");
      if (need !== null && fits.length < open.length) {
        throw new RuntimeCallError(
          "insufficient_memory",
          `${model} needs about ${formatBytes(need)} per replica; ${fits.length ? `it fits on ${fits.map((m) => m.name).join(", ")} (replicas: ${fits.length} at most)` : "it fits on no worker"} (${where}). Unload other models, use a smaller dtype${fits.length ? " or fewer replicas" : ""}.`,
          false,
          { need_bytes: need, fits: fits.map((m) => m.name) },
        );
      }
      throw new RuntimeCallError(
        "invalid_argument",
        `replicas: ${replicas} asked, but only ${fits.length} worker(s) can take ${model} now (${where}); ask for at most ${fits.length}`,
        false,
        { fits: fits.map((m) => m.name) },
      );
    }
    // One replica: the worker placed before the gate's wait, if it can still take the model.
    const pinned = replicas === 1 ? this.placed(opts.placement, fits) : undefined;
    const chosen = pinned ? [pinned] : order(fits).slice(0, replicas);
    const results = await Promise.allSettled(
      chosen.map((m) =>
        m.serial(() => this.send(m, "load", this.forWorker(m, workerArgs, device), opts)),
      ),
    );
    const ok: Array<{ m: Member; r: CallResult }> = [];
    let firstError: unknown = null;
    results.forEach((r, i) => {
      if (r.status === "fulfilled") ok.push({ m: chosen[i]!, r: r.value });
      else firstError ??= r.reason;
    });
    for (const { m, r } of ok) this.held.set(heldKey(m.name, model), num(r.result.bytes_on_device));
    if (!ok.length) throw firstError;
    const first = ok[0]!.r;
    return {
      result: {
        ...first.result,
        placement: ok.map(({ m, r }) => ({
          worker: m.name,
          device: String(r.result.device ?? m.device),
          bytes_on_device: num(r.result.bytes_on_device),
        })),
        ...(firstError
          ? {
              replica_errors: results
                .map((r, i) =>
                  r.status === "rejected"
                    ? { worker: chosen[i]!.name, error: String((r.reason as Error).message) }
                    : null,
                )
                .filter(Boolean),
            }
          : {}),
      },
      tensors: first.tensors,
    };
  }

  private async unload(args: Record<string, unknown>, opts: CallOptions): Promise<CallResult> {
    const model = String(args.model);
    const device = typeof args.device === "string" ? args.device : undefined;
    const scope = device ? resolve(this.members, device) : this.members;
    if (device && !scope.length) throw this.noWorker(device);
    // Holders, and workers that lost it (unloading acknowledges the loss).
    let targets = scope.filter((m) => m.holds(model) || m.lostModels().includes(model));
    if (!targets.length) targets = scope.filter((m) => m.rt.state === "ready").slice(0, 1);
    if (!targets.length) throw this.noWorker(device);
    const { device: _d, ...workerArgs } = args;
    const results = await Promise.allSettled(
      targets.map((m) => m.serial(() => this.send(m, "unload", workerArgs, opts))),
    );
    const ok = results.flatMap((r, i) =>
      r.status === "fulfilled" ? [{ m: targets[i]!, r: r.value }] : [],
    );
    for (const t of targets) this.held.delete(heldKey(t.name, model));
    if (!ok.length) throw (results[0] as PromiseRejectedResult).reason;
    return {
      result: {
        model,
        freed_bytes: ok.reduce((n, { r }) => n + num(r.result.freed_bytes), 0),
        workers: ok.map(({ m }) => m.name),
      },
      tensors: [],
    };
  }

  /**
   * Every running worker re-reads its catalog file (a config reload). One not started yet, or
   * started again later, reads the file as it is then; one still starting is asked once ready
   * (it may have read the file before the change). Fails when any worker refuses.
   */
  private async reloadCatalog(opts: CallOptions): Promise<CallResult> {
    const running = this.members.filter((m) =>
      ["ready", "starting", "restarting"].includes(m.rt.state),
    );
    const answers = await Promise.all(
      running.map(async (m) => {
        if (m.rt.state !== "ready") await m.rt.ready();
        const { result } = await this.send<ReloadCatalogResult>(m, "reload_catalog", {}, opts);
        return { ...result, worker: m.name };
      }),
    );
    const union = (key: keyof ReloadCatalogResult) => [...new Set(answers.flatMap((a) => a[key]))];
    return {
      result: {
        added: union("added"),
        changed: union("changed"),
        removed: union("removed"),
        workers: answers,
      },
      tensors: [],
    };
  }

  private async status(args: Record<string, unknown>, opts: CallOptions): Promise<CallResult> {
    const ready = await this.answering(opts.signal);
    const answers = await Promise.allSettled(
      ready.map((m) =>
        this.send(m, "status", args, { signal: opts.signal, timeoutMs: opts.timeoutMs }),
      ),
    );
    let first: Record<string, unknown> | null = null;
    const loaded: Array<Record<string, unknown>> = [];
    // A library counts as imported only where every worker has it: a call may land on any.
    let libraries: string[] | undefined;
    // Likewise the fewest models any worker has built: a fresh one's first load is cold.
    let modelsBuilt: number | undefined;
    answers.forEach((a, i) => {
      if (a.status !== "fulfilled") return;
      const m = ready[i]!;
      const r = a.value.result;
      first ??= r;
      const libs = Array.isArray(r.libraries) ? (r.libraries as string[]) : [];
      libraries = libraries ? libraries.filter((l) => libs.includes(l)) : libs;
      if (typeof r.models_built === "number")
        modelsBuilt = Math.min(modelsBuilt ?? Infinity, r.models_built);
      m.relay = relayOf(r.relay);
      const dev = r.device as DeviceInfo | undefined;
      if (dev) {
        m.lastFree = dev.memory_free_bytes;
        m.lastTotal = dev.memory_total_bytes;
      }
      for (const l of (r.loaded as Array<Record<string, unknown>>) ?? [])
        loaded.push({ ...l, worker: m.name });
    });
    if (!first) {
      const e = answers.find((a) => a.status === "rejected") as PromiseRejectedResult | undefined;
      throw e?.reason ?? this.noWorker(undefined);
    }
    return {
      result: {
        ...(first as Record<string, unknown>),
        loaded,
        libraries: libraries ?? [],
        ...(modelsBuilt !== undefined ? { models_built: modelsBuilt } : {}),
        workers: this.workers(),
      },
      tensors: [],
    };
  }

  /** Loads a replaced worker's models on its replacement (see replace). Never throws. */
  private async restore(m: Member): Promise<void> {
    const pending = m.toRestore();
    const models = m.handOver().filter((x) => pending.includes(x.model));
    if (!models.length) return;
    const log = this.opts.base?.logger;
    const report = (r: Omit<RestoreReport, "worker">) => {
      const full = { worker: m.name, ...r };
      if (r.outcome !== "restored") m.giveUp(r.model);
      if (r.outcome === "restored")
        log?.info(full, "loaded a lost model again on the replacement worker");
      else
        log?.warn(
          full,
          `${r.model} lost on ${m.name} and not loaded again (${r.message}); load it again (load_model)`,
        );
      try {
        this.opts.onRestore?.(full);
      } catch (e) {
        log?.warn({ err: String(e) }, "onRestore hook failed");
      }
    };
    const failed = (e: unknown) => ({
      code: e instanceof RuntimeCallError ? e.code : "internal_error",
      message: e instanceof Error ? e.message : String(e),
    });
    try {
      await m.rt.ready();
    } catch (e) {
      if (this.closed || !this.members.includes(m)) return;
      for (const x of models)
        report({ model: x.model, args: x.args, outcome: "failed", ...failed(e) });
      return;
    }
    for (const x of models) {
      if (this.closed || !this.members.includes(m)) return;
      if (x.restoredAt !== undefined && Date.now() - x.restoredAt < RESTORE_GUARD_MS) {
        report({
          model: x.model,
          args: x.args,
          outcome: "skipped",
          code: "restore_skipped",
          message: `the worker was lost within ${RESTORE_GUARD_MS / 1000} s of loading it again; it may be what kills the worker`,
        });
        continue;
      }
      try {
        await this.load({ ...x.args, model: x.model, device: m.name }, {});
        m.restored(x.model);
        report({ model: x.model, args: x.args, outcome: "restored" });
      } catch (e) {
        // Someone loaded it there meanwhile: nothing is lost.
        if (e instanceof RuntimeCallError && e.code === "model_already_loaded") continue;
        report({ model: x.model, args: x.args, outcome: "failed", ...failed(e) });
      }
    }
  }

  /** Power of two choices among the usable replicas of `model` below their cap. */
  private route(model: string): Member {
    const replicas = this.members.filter((m) => m.usable && m.holds(model));
    if (!replicas.length) {
      const lostOn = this.members.filter((m) => m.lostModels().includes(model));
      const parked = this.members.filter((m) => m.holds(model) && !m.usable);
      throw new RuntimeCallError(
        "model_not_loaded",
        parked.length
          ? `${model} is loaded only on ${parked.map((m) => `${m.name} (${m.draining ? "drained" : m.rt.state})`).join(", ")}; retry later or load it on another worker (load_model)`
          : lostOn.length
            ? `${model} was lost when ${lostOn.map((m) => m.name).join(", ")} restarted; load it again (load_model)`
            : `model ${model} is not loaded; load it first (load_model)`,
        parked.length > 0,
        { workers: parked.map((m) => m.name), lost_on: lostOn.map((m) => m.name) },
      );
    }
    const open = replicas.filter((m) => m.rt.inFlight() < this.cap);
    if (!open.length) {
      throw new RuntimeCallError(
        "busy",
        `every replica of ${model} has ${this.cap} calls in flight; retry in ${this.retryAfterMs} ms or load more replicas`,
        true,
        { retry_after_ms: this.retryAfterMs, replicas: replicas.length },
      );
    }
    return powerOfTwo(open, this.pick);
  }

  private async send<T = Record<string, unknown>>(
    m: Member,
    op: string,
    args: Record<string, unknown>,
    opts: CallOptions,
  ): Promise<CallResult<T>> {
    // Counters are about work: the pool's own status, describe and catalog reads are not counted.
    const counted = op !== "status" && op !== "describe" && op !== "reload_catalog";
    if (counted) {
      m.calls++;
      // The call's receipt: the audit record names the workers its work ran on.
      if (opts.placement instanceof Ticket) opts.placement.note(m.name);
    }
    try {
      return { ...(await m.rt.call<T>(op, args, opts)), worker: m.name };
    } catch (e) {
      if (counted) m.failures++;
      if (this.single) throw e;
      // Name the worker (and its chip) the error came from, once.
      if (e instanceof RuntimeCallError && !e.details?.worker)
        throw new RuntimeCallError(e.code, `${m.name} (${m.device}): ${e.message}`, e.recoverable, {
          ...e.details,
          worker: m.name,
        });
      throw e;
    }
  }

  // ── helpers ──────────────────────────────────────────────────────────────────────────────

  /**
   * The worker the call's ticket chose, when it is still among `open`. When it is not (it died,
   * was drained, or filled up while the call waited at the gate), the caller fails over to the
   * best open worker now: the lane it waited on was that worker's, the work runs elsewhere.
   */
  private placed(p: Placement | undefined, open: readonly Member[]): Member | undefined {
    if (!p?.worker) return undefined;
    const m = open.find((x) => x.name === p.worker);
    if (!m)
      this.opts.base?.logger?.warn(
        { worker: p.worker, op: p.op },
        "the worker placed before the gate's wait cannot take the call now (not ready, drained or without room); running it on the best open worker",
      );
    return m;
  }

  /** The args a worker gets: a worker name as device means "your own device". */
  private forWorker(
    m: Member,
    args: Record<string, unknown>,
    device: string | undefined,
  ): Record<string, unknown> {
    if (device === m.name || (device && !namesChip(device) && device !== m.kind)) {
      const { device: _d, ...rest } = args;
      return rest;
    }
    return args;
  }

  private heldBy(m: Member): number {
    let n = 0;
    for (const x of m.models()) n += this.held.get(heldKey(m.name, x.model)) ?? 0;
    return n;
  }

  private async refreshMemory(m: Member, signal?: AbortSignal): Promise<void> {
    try {
      const { result } = await m.rt.call<{ device?: DeviceInfo }>("status", {}, { signal });
      m.lastFree = result.device?.memory_free_bytes ?? null;
      m.lastTotal = result.device?.memory_total_bytes ?? null;
    } catch {
      /* placement falls back to the handshake's figure */
    }
  }

  private noWorker(device: string | undefined): RuntimeCallError {
    const list = this.members
      .map((m) => {
        const why = m.rt.state === "ready" ? null : m.rt.lastError();
        return `${m.name} (${m.device}, ${m.draining ? "drained" : m.rt.state}${why ? `: ${why}` : ""})`;
      })
      .join(", ");
    if (device && !resolve(this.members, device).length)
      return new RuntimeCallError(
        "unsupported_device",
        `no worker is named or serves "${device}"; workers: ${list || "none"}`,
        false,
        { device },
      );
    return new RuntimeCallError(
      "worker_unavailable",
      `no worker${device ? ` for ${device}` : ""} is ready and undrained (${list || "no workers"}); retry shortly or undrain one (tpu-mcp workers undrain NAME)`,
      true,
      { retry_after_ms: 1000 },
    );
  }

  /**
   * The members that can answer a status now. It starts a lazy worker and waits while one is on
   * its first start, but never for a worker restarting or failed: status must answer (with what
   * the control plane knows) exactly when no worker can, e.g. in a crash loop.
   */
  private async answering(signal?: AbortSignal): Promise<Member[]> {
    for (const m of this.members) if (m.rt.state === "stopped") m.rt.start().catch(() => undefined);
    for (;;) {
      const ready = this.members.filter((m) => m.rt.state === "ready");
      if (ready.length || signal?.aborted || !this.members.some((m) => m.rt.state === "starting"))
        return ready;
      await sleep(50);
    }
  }

  /** Members that are ready, waiting for a first one if none is (the pool may still be starting). */
  private async readyMembers(): Promise<Member[]> {
    const ready = () => this.members.filter((m) => m.rt.state === "ready");
    if (!ready().length && this.members.length) {
      await this.firstReady(this.members.map((m) => m.rt.ready())).catch(() => undefined);
    }
    return ready();
  }

  /** Waits until every promise settles or `ms` passes, whichever is first; never rejects. */
  private async settleWithin(ps: Array<Promise<unknown>>, ms: number): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const limit = new Promise<void>((r) => {
      timer = setTimeout(r, ms);
      timer.unref();
    });
    await Promise.race([Promise.allSettled(ps), limit]);
    clearTimeout(timer);
  }

  private firstReady(ps: Array<Promise<WorkerHello>>): Promise<WorkerHello> {
    if (!ps.length)
      return Promise.reject(
        new RuntimeCallError("worker_unavailable", "the pool has no workers configured", false),
      );
    return Promise.any(ps).catch((e: AggregateError) => {
      throw e.errors[0];
    });
  }

  private expand(): Promise<void> {
    if (Array.isArray(this.opts.entries)) return Promise.resolve();
    this.expanding ??= this.opts.entries().then((entries) => {
      for (const e of entries) this.addMember(e);
    });
    return this.expanding;
  }

  private addMember(entry: WorkerEntry): void {
    if (this.members.some((m) => m.name === entry.name))
      throw new Error(`a worker named ${entry.name} is already in the pool`);
    const base = this.opts.base ?? {};
    const opts: WorkerRuntimeOptions = isRemote(entry)
      ? {
          ...base,
          spawn: remoteSpawn(entry, (r) => this.opts.onRefused?.(r)),
          // A remote worker may be down for a while (a VM rebooting): keep reconnecting.
          maxRestartsInWindow: Number.MAX_SAFE_INTEGER,
          restartBackoffMaxMs: base.restartBackoffMaxMs ?? 30_000,
          logger: base.logger && childLogger(base.logger, entry.name),
        }
      : {
          ...base,
          device: entry.device,
          env: chipEnv(entry.device, base.env ?? process.env),
          extraArgs: [
            ...(base.extraArgs ?? []).filter(
              (a, i, all) => a !== "--threads" && all[i - 1] !== "--threads",
            ),
            ...(entry.threads && entry.threads > 0 ? ["--threads", String(entry.threads)] : []),
          ],
          logger: base.logger && childLogger(base.logger, entry.name),
        };
    const rt = this.opts.makeRuntime ? this.opts.makeRuntime(entry, opts) : new WorkerRuntime(opts);
    const m = new Member(entry, rt);
    // Bytes another control plane placed on a shared worker count as held here too.
    rt.on("fleet", (e) => {
      const key = heldKey(m.name, String(e.args.model));
      if (e.op === "load") this.held.set(key, num(e.result?.bytes_on_device));
      else this.held.delete(key);
    });
    rt.on("exit", () => {
      for (const x of [...this.held.keys()])
        if (x.startsWith(heldKey(m.name, ""))) this.held.delete(x);
    });
    this.members.push(m);
    for (const [event, fns] of this.listeners) for (const fn of fns) this.attach(m, event, fn);
  }

  private attach(m: Member, event: string, fn: AnyListener): void {
    m.rt.on(
      event as keyof RuntimeEvents,
      ((...a: any[]) => {
        let [info] = a;
        const rest = a.slice(1);
        // A restart names the models it lost: the member's bookkeeping knows them (its exit,
        // emitted just before, moved them to lost).
        if (event === "restart") info = { ...info, lostModels: m.lostModels() };
        // Events that carry an info object name the worker they come from.
        // (A pool of one does not, as its one worker's events never did.)
        if (!this.single && event !== "ready" && info && typeof info === "object")
          fn({ ...info, worker: m.name }, ...rest);
        else fn(info, ...rest);
      }) as never,
    );
  }

  private member(name: string): Member {
    const m = this.members.find((x) => x.name === name);
    if (!m)
      throw new RuntimeCallError(
        "invalid_argument",
        `no worker named ${name}; workers: ${this.names().join(", ") || "none"}`,
        false,
      );
    return m;
  }

  private statusOf(m: Member): WorkerStatus {
    return statusOf(m, this.heldBy(m));
  }
}

function childLogger(
  l: NonNullable<WorkerRuntimeOptions["logger"]>,
  worker: string,
): NonNullable<WorkerRuntimeOptions["logger"]> {
  const c = (l as { child?: (b: object) => unknown }).child;
  if (typeof c === "function") return c.call(l, { worker }) as typeof l;
  return l;
}

/** A held load matches a requested one: same dtype and mode, and matmul precision if asked. */
function sameLoad(
  held: ReturnType<Member["loadOf"]>,
  asked: Record<string, unknown>,
): held is NonNullable<ReturnType<Member["loadOf"]>> {
  if (!held) return false;
  const { result, args } = held;
  if (asked.dtype !== undefined && asked.dtype !== result.dtype) return false;
  if ((asked.mode ?? "eager") !== (result.mode ?? "eager")) return false;
  if (asked.matmul_precision !== undefined && asked.matmul_precision !== args.matmul_precision)
    return false;
  return true;
}

/** The answer to a load that `holders` already hold as asked: their load, flagged. */
function alreadyLoaded(holders: Member[], model: string): CallResult {
  const first = holders[0]!.loadOf(model)!.result;
  return {
    result: {
      ...first,
      already_loaded: true,
      placement: holders.map((m) => {
        const r = m.loadOf(model)!.result;
        return {
          worker: m.name,
          device: String(r.device ?? m.device),
          bytes_on_device: num(r.bytes_on_device),
        };
      }),
    },
    tensors: [],
  };
}

/** The `relay` a shared remote worker's status carries (runtime/PROTOCOL.md), or null. */
function relayOf(v: unknown): Member["relay"] {
  if (!v || typeof v !== "object") return null;
  const r = v as Record<string, unknown>;
  return {
    control_planes: num(r.control_planes),
    max_control_planes: num(r.max_control_planes),
    in_flight: num(r.requests_in_flight),
  };
}

/** The key of `held`: one worker's bytes of one model ("" gives the worker's prefix). */
function heldKey(worker: string, model: string): string {
  return `${worker}\0${model}`;
}

function num(v: unknown): number {
  return typeof v === "number" && Number.isFinite(v) ? v : 0;
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
