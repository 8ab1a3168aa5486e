// The worker client's options and their defaults (resolveRuntimeOptions is what actually runs:
// the server and `doctor` show it).
import { spawn as nodeSpawn, type ChildProcess, type SpawnOptions } from "node:child_process";
import { dirname, isAbsolute, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { pino } from "pino";
import { DEFAULT_MAX_BODY_BYTES } from "../wire/framing.js";
import type { RuntimeCallError } from "../types.js";

type LogFn = (obj: Record<string, unknown>, msg?: string) => void;

/** The subset of a pino logger the runtime uses; a pino Logger fits as is. */
export interface RuntimeLogger {
  debug: LogFn;
  info: LogFn;
  warn: LogFn;
  error: LogFn;
}

export type SpawnFn = (
  command: string,
  args: readonly string[],
  options: SpawnOptions,
) => ChildProcess;

export interface WorkerRuntimeOptions {
  /** Repository root: cwd of the worker, base of the default paths. Default: parent of runtime/. */
  repoRoot?: string;
  /** Python interpreter. Default: `.venv/bin/python` under repoRoot. */
  pythonPath?: string;
  /** The worker's Python package folder (PYTHONPATH). Default: runtime/worker under repoRoot. */
  workerDir?: string;
  /** Catalog JSON passed to the worker. Default: runtime/catalog.builtin.json. */
  catalogPath?: string;
  /** Device the worker serves: auto | cpu | cuda[:N] | tpu[:N] | xla[:N]. Default: auto. */
  device?: string;
  /** Base environment for the worker (the protocol's own variables are always added). Default: process.env. */
  env?: NodeJS.ProcessEnv;
  /** `eager`: the worker starts right after construction; `lazy`: the first call starts it. Default: lazy. */
  startMode?: "eager" | "lazy";
  /** Default per-call timeout; 0 or Infinity disables it. Default: 300 s. */
  requestTimeoutMs?: number;
  /** Time allowed from spawn to `hello` (torch import + device probe). Default: 120 s. */
  startTimeoutMs?: number;
  heartbeatIntervalMs?: number;
  /** A ping unanswered this long means the worker is hung: it is SIGKILLed and restarted. */
  heartbeatTimeoutMs?: number;
  /**
   * After an abort, how long to wait for the worker to confirm the cancel (default 2 s). For a
   * call the gate stopped (budget, timeout), the time after which the worker is pinged instead.
   */
  cancelGraceMs?: number;
  /**
   * How long a call the gate stopped may take to end in the worker (default 8 s, under the
   * gate's own 10 s; config `runtime.stop_grace_s`): its answer (a benchmark's partial report) is
   * waited for, since the budget charged it up to the stop; a worker still running it after this
   * ignores cancels, and is restarted.
   */
  stopGraceMs?: number;
  restartBackoffBaseMs?: number;
  restartBackoffMaxMs?: number;
  /** More crashes than this within restartWindowMs puts the runtime in state `failed`. */
  maxRestartsInWindow?: number;
  restartWindowMs?: number;
  /** close(): time for the worker to exit after stdin ends, then after SIGTERM. */
  closeTimeoutMs?: number;
  killTimeoutMs?: number;
  maxBodyBytes?: number;
  /** Extra worker arguments (e.g. `--heartbeat-s 30`). */
  extraArgs?: string[];
  /**
   * Asked before each start: an error means the worker cannot start yet (an installed package
   * still setting up its Python environment); the start and the calls waiting on it get that
   * error, nothing is spawned and no restart is counted. Default: never blocked.
   */
  prerequisite?: () => RuntimeCallError | null;
  logger?: RuntimeLogger;
  /** child_process.spawn or a stand-in (tests). */
  spawn?: SpawnFn;
}

export type ResolvedOptions = Required<Omit<WorkerRuntimeOptions, "env">> & {
  env: NodeJS.ProcessEnv;
};

/** Applies the defaults; exported so the server and `doctor` show what will actually run. */
export function resolveRuntimeOptions(opts: WorkerRuntimeOptions = {}): Readonly<ResolvedOptions> {
  // This file is runtime/client/options.ts: the repository root is two levels up.
  const repoRoot = resolve(
    opts.repoRoot ?? join(dirname(fileURLToPath(import.meta.url)), "..", ".."),
  );
  const abs = (p: string) => (isAbsolute(p) ? p : join(repoRoot, p));
  return Object.freeze({
    repoRoot,
    pythonPath: abs(opts.pythonPath ?? join(".venv", "bin", "python")),
    workerDir: abs(opts.workerDir ?? join("runtime", "worker")),
    catalogPath: abs(opts.catalogPath ?? join("runtime", "catalog.builtin.json")),
    device: opts.device ?? "auto",
    env: opts.env ?? process.env,
    startMode: opts.startMode ?? "lazy",
    requestTimeoutMs: opts.requestTimeoutMs ?? 300_000,
    startTimeoutMs: opts.startTimeoutMs ?? 120_000,
    heartbeatIntervalMs: opts.heartbeatIntervalMs ?? 5_000,
    heartbeatTimeoutMs: opts.heartbeatTimeoutMs ?? 15_000,
    cancelGraceMs: opts.cancelGraceMs ?? 2_000,
    stopGraceMs: opts.stopGraceMs ?? 8_000,
    restartBackoffBaseMs: opts.restartBackoffBaseMs ?? 500,
    restartBackoffMaxMs: opts.restartBackoffMaxMs ?? 30_000,
    maxRestartsInWindow: opts.maxRestartsInWindow ?? 5,
    restartWindowMs: opts.restartWindowMs ?? 60_000,
    closeTimeoutMs: opts.closeTimeoutMs ?? 3_000,
    killTimeoutMs: opts.killTimeoutMs ?? 2_000,
    maxBodyBytes: opts.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES,
    extraArgs: opts.extraArgs ?? [],
    prerequisite: opts.prerequisite ?? (() => null),
    logger: opts.logger ?? pino({ name: "tpu-mcp-runtime" }, pino.destination(2)),
    spawn: opts.spawn ?? (nodeSpawn as SpawnFn),
  });
}
