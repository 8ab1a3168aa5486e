// WorkerRuntime: spawns and supervises the Python worker (runtime/worker/tpu_worker) and talks
// to it with the framed protocol of runtime/PROTOCOL.md.
//
// Supervision rules, in short:
// - ready only after `hello`; calls made before that wait (bounded by startTimeoutMs);
// - every call has a timeout; on expiry the worker is told to cancel and its liveness probed;
// - heartbeats: a worker that stops answering pings is SIGKILLed and restarted;
// - a dying worker rejects every call in flight at once with `worker_died`;
// - restarts back off exponentially and stop after maxRestartsInWindow crashes (state `failed`);
// - models loaded in a dead worker are reported lost (the pool's lostModels(), runtime/pool/
//   member.ts, tracks them from the `ended` event of every request) and NOT reloaded
//   automatically: a model that crashed the worker would crash it again, and a silent reload
//   could hand callers a different dtype/mode than they asked for. Calls on them get
//   `model_not_loaded`.
// - an aborted call sends `cancel` and rejects with `cancelled` when the worker ends the request
//   (or after cancelGraceMs) — except an op that stops early and returns its finished part
//   flagged `cancelled: true` or `stopped` (benchmarks): that result is resolved so partial work
//   is kept; an abort whose reason carries `stop` (the gate's budget or timeout) sends it along,
//   and one that carries `stop` or `keepPartial` (cancel_job) waits for the worker's own answer;
// - a worker that refuses its configuration before hello (exit 2/4: catalog, device) is not
//   restarted: the runtime fails at once with the worker's reason.
//
// Why this file is over 500 lines: it is one state machine (process generation, state, hello,
// the request table, restarts) whose transitions read and write the same fields; the parts that
// stand alone are in runtime/client/ (options, process, calls, stderr_log). Splitting the frame
// handling or the restart logic further would pass that state around instead of reading it here.

import type { ChildProcess } from "node:child_process";
import { monotonicUs } from "./monotonic.js";
import { FrameDecoder, encodeFrame, type DecodeEvent, type Frame } from "./wire/framing.js";
import { corkForTurn } from "./wire/cork.js";
import {
  PROTOCOL_VERSION,
  cancelMessage,
  parseWorkerMessage,
  pingMessage,
  requestMessage,
  toHello,
  type WorkerMessage,
} from "./wire/messages.js";
import {
  RuntimeCallError,
  type CallOptions,
  type CallResult,
  type RuntimeEvents,
  type WorkerHello,
  type WorkerState,
  isPartialResult,
  keepsPartial,
  stopReasonOf,
  type StopReason,
} from "./types.js";
import {
  CallTable,
  abortable,
  cancelledError,
  clearTimers,
  closedError,
  type Pending,
} from "./client/calls.js";
import {
  resolveRuntimeOptions,
  type ResolvedOptions,
  type RuntimeLogger,
  type WorkerRuntimeOptions,
} from "./client/options.js";
import {
  CONFIG_EXIT_CODES,
  EXIT_DRAIN_MS,
  waitGone,
  workerCommand,
  type WorkerProc,
} from "./client/process.js";
import { recordWorkerTrace, type PendingTrace } from "./client/worker_trace.js";
import { StderrLog, type WorkerLogLine } from "./client/stderr_log.js";

export type { LoadedModel } from "./types.js";
export { resolveRuntimeOptions } from "./client/options.js";
export type { RuntimeLogger, SpawnFn, WorkerRuntimeOptions } from "./client/options.js";

/** What the worker said when it ended a request (answered or not to the caller, who may be gone). */
export interface RequestEnded {
  op: string;
  args: Record<string, unknown>;
  result?: Record<string, unknown>;
  /** The worker's error code, when it ended the request with an error. */
  code?: string;
}

/**
 * A worker's events: RuntimeEvents (a restart here does not know which models were lost; the
 * pool adds them), plus the protocol faults and every request's end.
 */
export type WorkerRuntimeEvents = Omit<RuntimeEvents, "restart"> & {
  restart: (info: { attempt: number; delayMs: number }) => void;
  /** A frame or message from the worker that broke the protocol, or a worker error without id. */
  protocol_error: (info: {
    id: string | null;
    message: string;
    source: "worker" | "client";
  }) => void;
  /** The worker ended a request: the pool's model bookkeeping reads loads and unloads here. */
  ended: (info: RequestEnded) => void;
  /**
   * A shared remote worker's relay says another control plane loaded or unloaded a model there
   * (or, right after hello, what is loaded already): the pool tracks it like its own results.
   */
  fleet: (info: RequestEnded) => void;
};

type Listeners = { [E in keyof WorkerRuntimeEvents]: Array<WorkerRuntimeEvents[E]> };

/**
 * One supervised worker process: starts it, frames calls to it and their answers, restarts it
 * under the rules at the top of this file, and reports its state and events (`on`). Events go
 * through a small emitter of its own (`emit`), not node:events: a listener that throws (a
 * server-side log or metric) is logged and must not break the frame handling or supervision
 * that emitted the event.
 */
export class WorkerRuntime {
  readonly options: Readonly<ResolvedOptions>;
  private readonly log: RuntimeLogger;
  private _state: WorkerState = "stopped";
  private _hello: WorkerHello | null = null;
  private proc: WorkerProc | null = null;
  private generation = 0;
  private seq = 0;
  private readonly calls = new CallTable();
  // Loads in flight by model name: an infer that meets `model_not_loaded` waits for its load.
  private readonly loading = new Map<string, Promise<void>>();
  private crashTimes: number[] = [];
  private restartCount = 0;
  private restartTimer: NodeJS.Timeout | undefined;
  private heartbeatTimer: NodeJS.Timeout | undefined;
  private readyWaiters: Array<{
    resolve: (h: WorkerHello) => void;
    reject: (e: RuntimeCallError) => void;
  }> = [];
  private failure: RuntimeCallError | null = null;
  /** Why the worker is not serving, in one line: its last unexpected exit or the failure. */
  private _lastError: string | null = null;
  private closing: Promise<void> | null = null;
  private readonly listeners: Listeners = {
    ready: [],
    exit: [],
    restart: [],
    failed: [],
    log: [],
    protocol_error: [],
    ended: [],
    fleet: [],
  };
  // Last resort against orphans if the Node process exits without close().
  private readonly killOnProcessExit = () => {
    try {
      this.proc?.child.kill("SIGKILL");
    } catch {
      /* already gone */
    }
  };

  constructor(options: WorkerRuntimeOptions = {}) {
    this.options = resolveRuntimeOptions(options);
    this.log = this.options.logger;
    if (this.options.startMode === "eager") {
      // Deferred so the owner can attach its event listeners first (and close() cancels it).
      setImmediate(() => {
        if (this._state !== "stopped" || this.closing) return;
        // Not startable yet (set-up running): whoever lifts the block starts it.
        if (this.options.prerequisite()) return;
        this.start().catch((e: unknown) => {
          // A client that leaves during start-up (a short stdio session) closes the runtime
          // under the start: that is an ordinary end, not a failure.
          if (this.closing) this.log.debug({ err: String(e) }, "eager worker start abandoned");
          else this.log.error({ err: String(e) }, "eager worker start failed");
        });
      });
    }
  }

  get state(): WorkerState {
    return this._state;
  }

  get hello(): WorkerHello | null {
    return this._hello;
  }

  /** Pid of the current worker process, if one is running. */
  get pid(): number | null {
    return this.proc?.child.pid ?? null;
  }

  restarts(): number {
    return this.restartCount;
  }

  /** Why the worker last stopped serving (exit, refusal, failure); null once it is ready again. */
  lastError(): string | null {
    return this._lastError;
  }

  inFlight(): number {
    return this.calls.inFlight();
  }

  on<E extends keyof WorkerRuntimeEvents>(event: E, fn: WorkerRuntimeEvents[E]): void {
    (this.listeners[event] as Array<WorkerRuntimeEvents[E]>).push(fn);
  }

  off<E extends keyof WorkerRuntimeEvents>(event: E, fn: WorkerRuntimeEvents[E]): void {
    const list = this.listeners[event] as Array<WorkerRuntimeEvents[E]>;
    const i = list.indexOf(fn);
    if (i >= 0) list.splice(i, 1);
  }

  /** Starts the worker (or retries after `failed`) and resolves with its hello. */
  start(): Promise<WorkerHello> {
    if (this.closing) return Promise.reject(closedError());
    if (this._state === "ready" && this._hello) return Promise.resolve(this._hello);
    const blocked = this.options.prerequisite();
    if (blocked) return Promise.reject(blocked);
    if (this._state === "failed") {
      // An explicit start() is the operator's "try again": forget the crash history.
      this.crashTimes = [];
      this.failure = null;
      this._state = "stopped";
    }
    const waiting = this.waitForReady();
    if (this._state === "stopped") this.spawnWorker();
    return waiting;
  }

  ready(): Promise<WorkerHello> {
    if (this._state === "failed" && this.failure) return Promise.reject(this.failure);
    return this.start();
  }

  async call<T = Record<string, unknown>>(
    op: string,
    args: Record<string, unknown>,
    opts: CallOptions = {},
  ): Promise<CallResult<T>> {
    const { signal, trace: callTrace } = opts;
    if (signal?.aborted) throw cancelledError(op, "before it was sent");
    callTrace?.mark("rt.call");
    // The worker call is a child span; the worker's own stages become its children (onMessage).
    const span = callTrace?.child(`worker ${op}`, { "tpu_mcp.worker.op": op });
    const trace = callTrace && span ? { call: callTrace, span } : undefined;
    try {
      const r = await this.sendAfterLoad<T>(op, args, opts, trace);
      span?.end();
      return r;
    } catch (e) {
      span?.end(e instanceof RuntimeCallError ? e.code : "internal");
      throw e;
    }
  }

  /**
   * Sends the call; an infer that finds its model not loaded while a load of that model is in
   * flight on this worker waits for the load and is sent once more. A load handed off as a job
   * (a slow first load) answers its caller before the model is there, and the caller's next
   * call is the infer: it should meet the model, not `model_not_loaded`.
   */
  private async sendAfterLoad<T>(
    op: string,
    args: Record<string, unknown>,
    opts: CallOptions,
    trace: PendingTrace | undefined,
  ): Promise<CallResult<T>> {
    const model = typeof args.model === "string" ? args.model : undefined;
    if (op === "load" && model) {
      const load = this.send<T>(op, args, opts, trace);
      const settled = load.then(
        () => undefined,
        () => undefined,
      );
      this.loading.set(model, settled);
      void settled.then(() => {
        if (this.loading.get(model) === settled) this.loading.delete(model);
      });
      return load;
    }
    try {
      return await this.send<T>(op, args, opts, trace);
    } catch (e) {
      const load = model !== undefined ? this.loading.get(model) : undefined;
      if (op !== "infer" || !load || !(e instanceof RuntimeCallError)) throw e;
      if (e.code !== "model_not_loaded") throw e;
      await abortable(load, opts.signal, () => cancelledError(op, "while its model loaded"));
      return this.send<T>(op, args, opts, trace);
    }
  }

  private async send<T>(
    op: string,
    args: Record<string, unknown>,
    opts: CallOptions,
    trace: PendingTrace | undefined,
  ): Promise<CallResult<T>> {
    const { signal } = opts;
    let frame: Buffer[];
    const id = `r${++this.seq}`;
    try {
      const msg = requestMessage(id, op, args);
      frame = encodeFrame(
        trace ? { ...msg, trace: true, traceparent: trace.span.traceparent() } : msg,
        opts.tensors ?? [],
        this.options.maxBodyBytes,
      );
    } catch (e) {
      throw new RuntimeCallError(
        "invalid_argument",
        `${(e as Error).message}. Fix the tensor and retry.`,
        false,
        {
          op,
        },
      );
    }
    const proc = await this.readyProc(signal, op);
    // An abort during the await above fired before our listener exists: check it again.
    if (signal?.aborted) throw cancelledError(op, "before it was sent");
    return new Promise<CallResult<T>>((resolveCall, rejectCall) => {
      const p: Pending = {
        id,
        op,
        args,
        proc,
        resolve: resolveCall as (r: CallResult<any>) => void,
        reject: rejectCall,
        onProgress: opts.onProgress,
        trace,
        settled: false,
        cancelRequested: false,
      };
      this.calls.add(p);
      const timeoutMs = opts.timeoutMs ?? this.options.requestTimeoutMs;
      if (timeoutMs > 0 && Number.isFinite(timeoutMs)) {
        p.timer = setTimeout(() => this.onCallTimeout(p, timeoutMs), timeoutMs);
      }
      if (signal) {
        // The gate's stop (budget, timeout) travels as the cancel's reason.
        const onAbort = () => this.onCallAbort(p, signal.reason);
        signal.addEventListener("abort", onAbort, { once: true });
        p.detachAbort = () => signal.removeEventListener("abort", onAbort);
      }
      this.write(proc, frame);
      trace?.call.mark("rt.written");
    });
  }

  close(): Promise<void> {
    if (this.closing) return this.closing;
    this.closing = this.shutdown();
    return this.closing;
  }

  // ── lifecycle ────────────────────────────────────────────────────────────────────────────

  private async shutdown(): Promise<void> {
    clearTimeout(this.restartTimer);
    this.stopHeartbeat();
    this.rejectWaiters(closedError());
    const proc = this.proc;
    if (proc && !proc.gone) {
      // EOF on stdin is the worker's signal to finish and exit 0; then escalate.
      try {
        proc.child.stdin?.end();
      } catch {
        /* pipe already closed */
      }
      if (!(await waitGone(proc, this.options.closeTimeoutMs))) {
        this.log.warn(
          { pid: proc.child.pid },
          "worker did not exit after stdin closed; sending SIGTERM",
        );
        proc.child.kill("SIGTERM");
        if (!(await waitGone(proc, this.options.killTimeoutMs))) {
          this.log.warn({ pid: proc.child.pid }, "worker ignored SIGTERM; sending SIGKILL");
          proc.child.kill("SIGKILL");
          await waitGone(proc, this.options.killTimeoutMs);
        }
      }
    }
    process.off("exit", this.killOnProcessExit);
    this._state = "stopped";
    this._hello = null;
  }

  private spawnWorker(): void {
    const o = this.options;
    const generation = ++this.generation;
    this._state = this.restartCount > 0 || this.crashTimes.length > 0 ? "restarting" : "starting";
    const { args, env } = workerCommand(o);
    let child: ChildProcess;
    try {
      child = o.spawn(o.pythonPath, args, {
        cwd: o.repoRoot,
        env,
        stdio: ["pipe", "pipe", "pipe"],
      });
    } catch (e) {
      // A synchronous spawn failure is handled like a crash so backoff and the cap apply.
      this.log.error({ err: String(e), python: o.pythonPath }, "could not spawn the worker");
      queueMicrotask(() => this.onGone(null, generation, null, null, e as Error));
      return;
    }
    const proc: WorkerProc = {
      child,
      generation,
      decoder: new FrameDecoder({ maxBodyBytes: o.maxBodyBytes }),
      hello: null,
      ping: null,
      stderr: new StderrLog((line) => this.onWorkerLog(child.pid, line)),
      gone: false,
      exitWaiters: [],
      startupError: null,
    };
    this.proc = proc;
    process.off("exit", this.killOnProcessExit);
    process.on("exit", this.killOnProcessExit);
    this.log.info({ pid: child.pid, device: o.device, generation }, "worker spawned");

    proc.helloTimer = setTimeout(() => {
      this.log.error(
        { pid: child.pid, timeout_ms: o.startTimeoutMs },
        "worker sent no hello in time (torch import or device probe hung); killing it",
      );
      child.kill("SIGKILL");
    }, o.startTimeoutMs);

    child.stdout?.on("data", (chunk: Buffer) => {
      if (this.calls.tracing) proc.chunkAtUs = monotonicUs();
      let events: DecodeEvent[];
      try {
        events = proc.decoder.push(chunk);
      } catch (e) {
        this.log.error({ err: String(e) }, "frame decoder failed");
        return;
      }
      for (const ev of events) {
        try {
          if (ev.kind === "frame") this.onFrame(proc, ev.frame);
          else this.onFrameError(proc, ev.error.message, ev.error.id, ev.error.fatal);
        } catch (e) {
          // A bug in our own handling must not take the server down with it.
          this.log.error(
            { err: String(e), stack: (e as Error).stack },
            "error handling a worker frame",
          );
        }
      }
    });
    child.stderr?.on("data", (chunk: Buffer) => proc.stderr.push(chunk.toString("utf8")));
    child.stdin?.on("error", (e) => this.log.debug({ err: String(e) }, "worker stdin closed"));
    child.on("error", (e) => {
      // `error` without a pid is a failed spawn (ENOENT, EACCES): no exit event will follow.
      if (child.pid === undefined) this.onGone(proc, generation, null, null, e);
      else this.log.warn({ err: String(e), pid: child.pid }, "worker process error");
    });
    child.on("exit", (code, signal) => {
      // Let frames already written to stdout arrive (a result sent just before exiting),
      // but bounded so callers learn about the death promptly.
      let done = false;
      const finish = () => {
        if (done) return;
        done = true;
        this.onGone(proc, generation, code, signal, null);
      };
      if (!child.stdout || child.stdout.readableEnded || child.stdout.destroyed) finish();
      else {
        child.stdout.once("close", finish);
        setTimeout(finish, EXIT_DRAIN_MS);
      }
    });
  }

  private onGone(
    proc: WorkerProc | null,
    generation: number,
    code: number | null,
    signal: NodeJS.Signals | null,
    err: Error | null,
  ): void {
    if (proc) {
      if (proc.gone) return;
      proc.gone = true;
      clearTimeout(proc.helloTimer);
      if (proc.ping) clearTimeout(proc.ping.timer);
      for (const w of proc.exitWaiters.splice(0)) w();
      proc.stderr.flush();
    }
    if (generation !== this.generation) return;
    const closing = this.closing !== null;
    this.proc = null;
    this._hello = null;
    this.stopHeartbeat();

    const inFlight = this.inFlight();
    const died = closing
      ? closedError()
      : new RuntimeCallError(
          "worker_died",
          "The worker process died while this call was running. Retry the call; models that were loaded were lost and must be loaded again.",
          true,
          { exit_code: code, signal },
        );
    for (const p of this.calls.all()) {
      this.calls.forget(p);
      if (!p.settled) this.calls.settle(p, () => p.reject(died));
      else clearTimers(p);
    }
    const exitInfo = {
      code,
      signal,
      inFlight,
      ...(err
        ? { error: `spawn failed: ${(err as NodeJS.ErrnoException).code ?? err.message}` }
        : {}),
    };
    const logFields = {
      pid: proc?.child.pid,
      code,
      signal,
      in_flight: inFlight,
      err: err ? String(err) : undefined,
      stderr_tail: proc?.stderr.tail(5),
    };
    if (closing) this.log.info(logFields, "worker exited");
    else {
      this.log.error(logFields, "worker exited unexpectedly");
      const how = err
        ? `could not start: ${(err as NodeJS.ErrnoException).code ?? err.message}`
        : proc?.startupError
          ? `${proc.startupError.code}: ${proc.startupError.message}`
          : `exited (${signal ? `signal ${signal}` : `code ${code}`})`;
      const said = err || proc?.startupError ? undefined : proc?.stderr.tail(1)[0];
      this._lastError = said ? `${how}: ${said}` : how;
    }
    this.emit("exit", exitInfo);
    if (closing) return;

    if (proc && !proc.hello && !signal && code !== null && CONFIG_EXIT_CODES.has(code)) {
      // The worker refused its configuration (bad catalog, device not present): restarting
      // would fail the same way, so fail now with the worker's own explanation.
      const cause = proc.startupError
        ? `${proc.startupError.code}: ${proc.startupError.message}`
        : CONFIG_EXIT_CODES.get(code)!;
      return this.fail(
        `The worker could not start (${cause}).`,
        `Fix the device or catalog setting and restart the server; \`tpu-mcp doctor\` shows what the worker sees.`,
        { exit_code: code, worker_error: proc.startupError?.code },
      );
    }
    const now = Date.now();
    this.crashTimes = this.crashTimes.filter((t) => now - t < this.options.restartWindowMs);
    this.crashTimes.push(now);
    const crashes = this.crashTimes.length;
    if (crashes > this.options.maxRestartsInWindow) {
      const cause = err
        ? `the Python interpreter could not be started (${(err as NodeJS.ErrnoException).code ?? err.message})`
        : `last exit: ${signal ? `signal ${signal}` : `code ${code}`}`;
      return this.fail(
        `The worker crashed ${crashes} times within ${Math.round(this.options.restartWindowMs / 1000)} s and is no longer restarted (${cause}).`,
        "Check the worker log, run `tpu-mcp doctor` to diagnose the Python environment and device, then restart the server.",
        { crashes, exit_code: code, signal },
      );
    }
    const delayMs = Math.min(
      this.options.restartBackoffBaseMs * 2 ** (crashes - 1),
      this.options.restartBackoffMaxMs,
    );
    this._state = "restarting";
    this.restartCount++;
    this.log.warn({ attempt: crashes, delay_ms: delayMs }, "restarting worker");
    this.emit("restart", { attempt: crashes, delayMs });
    this.restartTimer = setTimeout(() => {
      this.restartTimer = undefined;
      if (!this.closing && this._state === "restarting") this.spawnWorker();
    }, delayMs);
  }

  /** Enters state `failed`: no more restarts; calls get worker_unavailable with `fix`. */
  private fail(reason: string, fix: string, details: Record<string, unknown> = {}): void {
    this.failure = new RuntimeCallError("worker_unavailable", `${reason} ${fix}`, false, details);
    this._state = "failed";
    this._lastError = reason;
    this.log.error({ ...details }, `worker unavailable: ${reason}`);
    this.rejectWaiters(this.failure);
    this.emit("failed", { reason });
  }

  private onHello(proc: WorkerProc, msg: Extract<WorkerMessage, { type: "hello" }>): void {
    if (proc.hello) {
      this.protocolFault(null, "worker sent a second hello; ignored", "worker");
      return;
    }
    clearTimeout(proc.helloTimer);
    if (msg.protocol !== PROTOCOL_VERSION) {
      // Restarting cannot fix a version mismatch: fail now with the fix.
      this.generation++; // its exit must not trigger a restart
      this.proc = null;
      proc.child.kill("SIGKILL");
      this.fail(
        `The Python worker is incompatible (it speaks protocol ${msg.protocol}, this server ${PROTOCOL_VERSION}).`,
        "Update the repository so runtime/ and runtime/worker/ match, or run `tpu-mcp doctor`.",
        { worker_protocol: msg.protocol },
      );
      return;
    }
    const hello = toHello(msg);
    proc.hello = hello;
    this._hello = hello;
    this._state = "ready";
    this._lastError = null;
    this.log.info(
      {
        pid: hello.pid,
        device: hello.device.name,
        torch: hello.torch_version,
        worker: hello.worker_version,
      },
      "worker ready",
    );
    this.startHeartbeat(proc);
    const waiters = this.readyWaiters.splice(0);
    for (const w of waiters) w.resolve(hello);
    this.emit("ready", hello);
  }

  // ── frames and messages ──────────────────────────────────────────────────────────────────

  private onFrame(proc: WorkerProc, frame: Frame): void {
    const parsed = parseWorkerMessage(frame.header);
    if (!parsed.ok) {
      this.onFrameError(proc, parsed.reason, parsed.id, false);
      return;
    }
    const msg = parsed.message;
    if (msg.type === "hello") return this.onHello(proc, msg);
    if (msg.type === "fleet") {
      // What another control plane did on this shared worker: an `ended` of a load or unload.
      const { model } = msg;
      this.emit("fleet", {
        op: msg.op,
        args: { ...msg.args, model },
        result: msg.op === "load" ? { ...msg.result, model } : { model },
      });
      return;
    }
    if (msg.type === "pong") {
      if (proc.ping && proc.ping.id === msg.id) {
        clearTimeout(proc.ping.timer);
        proc.ping = null;
      }
      return;
    }
    if (msg.id === null) {
      // Only `error` can carry a null id: the worker could not read one of our frames, or
      // (before hello) it cannot start at all.
      const m = msg as Extract<WorkerMessage, { type: "error" }>;
      if (!proc.hello) proc.startupError = { code: m.error.code, message: m.error.message };
      this.protocolFault(null, `worker reported ${m.error.code}: ${m.error.message}`, "worker");
      return;
    }
    const p = this.calls.get(msg.id);
    if (!p || p.proc !== proc) {
      // An error for an id we never sent answers a frame we did not write (or a bug): report it.
      if (msg.type === "error") {
        this.protocolFault(
          msg.id,
          `worker reported ${msg.error.code}: ${msg.error.message}`,
          "worker",
        );
      } else {
        this.log.warn(
          { id: msg.id, type: msg.type },
          "worker message for an unknown request; ignored",
        );
      }
      return;
    }
    if (msg.type === "progress") {
      if (!p.settled && p.onProgress) {
        try {
          p.onProgress({ progress: msg.progress, total: msg.total, message: msg.message });
        } catch (e) {
          this.log.warn({ err: String(e), id: p.id }, "onProgress callback threw");
        }
      }
      return;
    }
    // result or error: the request is over in the worker.
    this.calls.forget(p);
    if (p.trace) {
      recordWorkerTrace(p.trace, (frame.header as { trace?: unknown }).trace);
      if (proc.chunkAtUs) p.trace.call.mark("rt.frame_arrived", proc.chunkAtUs);
      p.trace.call.mark("rt.frame_decoded");
    }
    if (msg.type === "result") {
      // Also for a caller that is gone: the worker holds what it loaded either way.
      this.emit("ended", { op: p.op, args: p.args, result: msg.result });
      if (p.settled) return;
      const result = msg.result;
      // A long op that stopped early on the cancel returns its finished part (e.g. a benchmark's
      // completed configurations, flagged cancelled: true or stopped: "budget"): keep it rather
      // than throw it away.
      // After the gate's stop (budget, timeout) any answer is the worker's partial result.
      if (p.cancelRequested && !p.stopReason && !p.keepPartial && !isPartialResult(result))
        return this.calls.settle(p, () => p.reject(cancelledError(p.op, "by the caller")));
      return this.calls.settle(p, () => p.resolve({ result, tensors: frame.tensors }));
    }
    const { code, message, recoverable, ...rest } = msg.error;
    this.emit("ended", { op: p.op, args: p.args, code });
    if (p.settled) return;
    this.calls.settle(p, () =>
      p.reject(
        new RuntimeCallError(code, message, recoverable, {
          op: p.op,
          ...(rest as Record<string, unknown>),
        }),
      ),
    );
  }

  private onFrameError(proc: WorkerProc, message: string, id: string | null, fatal: boolean): void {
    this.protocolFault(id, message, "client");
    if (id) {
      const p = this.calls.get(id);
      if (p && p.proc === proc) {
        this.calls.forget(p);
        if (!p.settled) {
          this.calls.settle(p, () =>
            p.reject(
              new RuntimeCallError(
                "protocol_error",
                `The worker sent an invalid answer (${message}). Retry; if it persists, report a bug.`,
                true,
                { op: p.op },
              ),
            ),
          );
        }
      }
    }
    if (fatal && !proc.gone) {
      // The byte stream is no longer aligned on frames; only a fresh worker can fix that.
      this.log.error(
        { pid: proc.child.pid },
        "unrecoverable framing error from the worker; killing it",
      );
      proc.child.kill("SIGKILL");
    }
  }

  private protocolFault(id: string | null, message: string, source: "worker" | "client"): void {
    this.log.warn({ id, source }, `protocol error: ${message}`);
    this.emit("protocol_error", { id, message, source });
  }

  // ── timeouts, cancellation, heartbeats ───────────────────────────────────────────────────

  private onCallTimeout(p: Pending, timeoutMs: number): void {
    if (p.settled) return;
    this.calls.settle(p, () =>
      p.reject(
        new RuntimeCallError(
          "timeout",
          `${p.op} did not finish within ${timeoutMs} ms and was cancelled. Retry with a longer timeout or a smaller input.`,
          true,
          { op: p.op, timeout_ms: timeoutMs },
        ),
      ),
    );
    this.sendCancel(p);
    // A timed-out call may mean a hung worker: confirm it still answers, else replace it.
    this.probe(p.proc, `request ${p.id} (${p.op}) timed out`);
  }

  private onCallAbort(p: Pending, abortReason: unknown): void {
    if (p.settled || p.cancelRequested) return;
    const reason = stopReasonOf(abortReason);
    p.cancelRequested = true;
    p.stopReason = reason;
    p.keepPartial = keepsPartial(abortReason);
    clearTimeout(p.timer);
    this.sendCancel(p, reason);
    if (reason || p.keepPartial) return this.awaitStop(p, reason);
    p.graceTimer = setTimeout(() => {
      if (!p.settled)
        this.calls.settle(p, () =>
          p.reject(cancelledError(p.op, "by the caller (the worker did not confirm in time)")),
        );
    }, this.options.cancelGraceMs);
  }

  /**
   * A call the gate stopped (budget, timeout), or a job cancelled to keep its finished part, ends
   * with the worker's own answer, a benchmark's partial report included, however slow the host:
   * the budget charged it up to the stop, so the wait costs nobody's budget. A worker that does not answer a ping by cancelGraceMs is hung
   * (the probe kills it); one still running the call after stopGraceMs ignores its cancel, and
   * is restarted: the device must not stay held by work nobody waits for.
   */
  private awaitStop(p: Pending, reason: StopReason | undefined): void {
    const what = `${p.op} (request ${p.id}, ${reason ? `stopped: ${reason}` : "cancelled, keeping its finished part"})`;
    p.graceTimer = setTimeout(
      () => this.probe(p.proc, `${what} has not ended yet`),
      this.options.cancelGraceMs,
    );
    p.stopTimer = setTimeout(() => {
      if (p.settled || p.proc.gone) return;
      this.log.error(
        { pid: p.proc.child.pid, op: p.op, reason, grace_ms: this.options.stopGraceMs },
        "worker did not end a stopped call in time; restarting it",
      );
      this.calls.settle(p, () =>
        p.reject(
          new RuntimeCallError(
            "worker_died",
            `${p.op} was ${reason ? `stopped (${reason === "budget" ? "its budget ran out" : reason === "timeout" ? "its time limit ran out" : "it ran past what was approved"})` : "cancelled"} and the worker did not end it within ${this.options.stopGraceMs / 1000} s, so the worker was restarted. Retry the call.`,
            true,
            { op: p.op, stopped: reason },
          ),
        ),
      );
      p.proc.child.kill("SIGKILL");
    }, this.options.stopGraceMs);
  }

  private sendCancel(p: Pending, reason?: StopReason): void {
    if (!p.proc.gone) this.write(p.proc, encodeFrame(cancelMessage(p.id, reason)));
  }

  private startHeartbeat(proc: WorkerProc): void {
    this.stopHeartbeat();
    if (!(this.options.heartbeatIntervalMs > 0)) return;
    this.heartbeatTimer = setInterval(
      () => this.probe(proc, "heartbeat"),
      this.options.heartbeatIntervalMs,
    );
    // The child's pipes keep the event loop alive while it runs; the interval need not.
    this.heartbeatTimer.unref();
  }

  private stopHeartbeat(): void {
    clearInterval(this.heartbeatTimer);
    this.heartbeatTimer = undefined;
  }

  /** Sends a ping unless one is outstanding; no pong in time → SIGKILL (then restart). */
  private probe(proc: WorkerProc, reason: string): void {
    if (proc.gone || proc.ping || !proc.hello) return;
    const id = `h${++this.seq}`;
    const timer = setTimeout(() => {
      if (proc.gone || proc.ping?.id !== id) return;
      this.log.error(
        { pid: proc.child.pid, reason, timeout_ms: this.options.heartbeatTimeoutMs },
        "worker did not answer a ping (hung); killing it",
      );
      proc.child.kill("SIGKILL");
    }, this.options.heartbeatTimeoutMs);
    proc.ping = { id, timer };
    this.write(proc, encodeFrame(pingMessage(id)));
  }

  // ── plumbing ─────────────────────────────────────────────────────────────────────────────

  private write(proc: WorkerProc, buffers: Buffer[]): void {
    const stdin = proc.child.stdin;
    if (!stdin || proc.gone || stdin.destroyed || stdin.writableEnded) return; // onGone fails the call
    // Separate writes keep references to tensor Buffers instead of copying them; corking turns
    // them, and the frames of other calls written in this turn, into one writev, so the worker's
    // reader wakes once per batch of frames, not once per part (each wake-up is a context switch
    // that a 2-core machine pays for in latency and CPU).
    corkForTurn(stdin);
    for (const b of buffers) stdin.write(b);
  }

  /** Waits until a worker is ready (starting it if needed), honouring the caller's signal. */
  private async readyProc(signal: AbortSignal | undefined, op: string): Promise<WorkerProc> {
    for (;;) {
      if (this.closing) throw closedError();
      if (this._state === "failed" && this.failure) throw this.failure;
      if (this._state === "ready" && this.proc?.hello && !this.proc.gone) return this.proc;
      const waiting = this._state === "stopped" ? this.start() : this.waitForReady();
      if (!signal) {
        await waiting;
        continue;
      }
      await new Promise<void>((res, rej) => {
        const onAbort = () => rej(cancelledError(op, "while waiting for the worker to start"));
        signal.addEventListener("abort", onAbort, { once: true });
        waiting.then(
          () => {
            signal.removeEventListener("abort", onAbort);
            res();
          },
          (e) => {
            signal.removeEventListener("abort", onAbort);
            rej(e);
          },
        );
      });
    }
  }

  private waitForReady(): Promise<WorkerHello> {
    return new Promise((resolveReady, rejectReady) => {
      this.readyWaiters.push({ resolve: resolveReady, reject: rejectReady });
    });
  }

  private rejectWaiters(e: RuntimeCallError): void {
    for (const w of this.readyWaiters.splice(0)) w.reject(e);
  }

  /** A worker log line: into the server log at its own level, and out as a `log` event. */
  private onWorkerLog(pid: number | undefined, l: WorkerLogLine): void {
    this.log[l.level]({ ...l.fields, worker_pid: pid, source: "worker" }, l.msg);
    this.emit("log", { ...l.fields, level: l.level, msg: l.msg, worker_pid: pid });
  }

  private emit<E extends keyof WorkerRuntimeEvents>(
    event: E,
    ...args: Parameters<WorkerRuntimeEvents[E]>
  ): void {
    for (const fn of [...(this.listeners[event] as Array<(...a: unknown[]) => void>)]) {
      try {
        fn(...args);
      } catch (e) {
        this.log.warn({ err: String(e), event }, "runtime event listener threw");
      }
    }
  }
}
