// Shared set-up for runtime tests: a WorkerRuntime on the CPU against the real worker, with a
// logger that keeps records so a failing test can show what the worker said.
import { spawn, type ChildProcess } from "node:child_process";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import {
  WorkerRuntime,
  type RuntimeLogger,
  type SpawnFn,
  type WorkerRuntimeOptions,
} from "../../runtime/client.js";
import { scaled } from "../helpers/calibrate.js";

export const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");

export interface LogRecord {
  level: string;
  msg?: string;
  [k: string]: unknown;
}

export function memoryLogger(
  echo = process.env.TPU_MCP_TEST_LOGS === "1",
): RuntimeLogger & { records: LogRecord[] } {
  const records: LogRecord[] = [];
  const at =
    (level: string) =>
    (obj: Record<string, unknown>, msg?: string): void => {
      records.push({ ...obj, level, msg });
      if (echo) process.stderr.write(`[${level}] ${msg ?? ""} ${JSON.stringify(obj)}\n`);
    };
  return { records, debug: at("debug"), info: at("info"), warn: at("warn"), error: at("error") };
}

/** A spawn that records every child so tests can reach the real worker's pipes. */
export function recordingSpawn(): { spawn: SpawnFn; children: ChildProcess[] } {
  const children: ChildProcess[] = [];
  return {
    children,
    spawn: (cmd, args, opts) => {
      const child = spawn(cmd, args, opts);
      children.push(child);
      return child;
    },
  };
}

export function cpuRuntime(
  overrides: WorkerRuntimeOptions = {},
): WorkerRuntime & { logs: LogRecord[] } {
  const logger = memoryLogger();
  const rt = new WorkerRuntime({
    repoRoot,
    device: "cpu",
    logger,
    startTimeoutMs: 120_000,
    ...overrides,
  });
  return Object.assign(rt, { logs: logger.records });
}

/** True while a process with this pid exists (signal 0 only checks). */
export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** Polls `cond`; `timeoutMs` is what a quiet machine needs, scaled to this one. */
export async function waitFor(cond: () => boolean, timeoutMs = 30_000, stepMs = 20): Promise<void> {
  const end = Date.now() + scaled(timeoutMs);
  while (!cond()) {
    if (Date.now() > end) throw new Error("condition not met in time");
    await new Promise((r) => setTimeout(r, stepMs));
  }
}
