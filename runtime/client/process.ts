// One worker process: how it is started (command line, environment), what the client keeps
// about it while it lives, and waiting for it to be gone. The supervision rules that decide
// when to start, restart or give up are in runtime/client.ts.
import type { ChildProcess } from "node:child_process";
import type { WorkerHello } from "../types.js";
import { DEFAULT_MAX_BODY_BYTES, type FrameDecoder } from "../wire/framing.js";
import type { ResolvedOptions } from "./options.js";
import type { StderrLog } from "./stderr_log.js";

export interface WorkerProc {
  child: ChildProcess;
  generation: number;
  decoder: FrameDecoder;
  hello: WorkerHello | null;
  helloTimer?: NodeJS.Timeout;
  ping: { id: string; timer: NodeJS.Timeout } | null;
  /** Its log; the last lines are logged with the exit to explain a crash. */
  stderr: StderrLog;
  gone: boolean;
  exitWaiters: Array<() => void>;
  /** An error the worker sent before its hello (device probe failed): the reason it will exit. */
  startupError: { code: string; message: string } | null;
  /** When the last stdout chunk arrived (monotonic µs), read only while a traced call waits. */
  chunkAtUs?: number;
}

/** Worker exit codes (tpu_worker/__main__.py) that mean "misconfigured", not "crashed". */
export const CONFIG_EXIT_CODES = new Map<number, string>([
  [2, "the catalog or the command line was rejected; see the worker log"],
  [4, "the device probe found no usable device"],
]);

/** After `exit`, how long to let stdout drain before in-flight calls are failed. */
export const EXIT_DRAIN_MS = 150;

/** `python -m tpu_worker …` and its environment (offline hubs, unbuffered, the package path). */
export function workerCommand(o: Readonly<ResolvedOptions>): {
  args: string[];
  env: NodeJS.ProcessEnv;
} {
  const args = ["-m", "tpu_worker", "--catalog", o.catalogPath, "--device", o.device];
  if (o.maxBodyBytes !== DEFAULT_MAX_BODY_BYTES)
    args.push("--max-body-bytes", String(o.maxBodyBytes));
  args.push(...o.extraArgs);
  const workerPath = o.workerDir;
  const env: NodeJS.ProcessEnv = {
    ...o.env,
    PYTHONPATH: o.env.PYTHONPATH ? `${workerPath}:${o.env.PYTHONPATH}` : workerPath,
    HF_HUB_OFFLINE: "1",
    TRANSFORMERS_OFFLINE: "1",
    PYTHONUNBUFFERED: "1",
  };
  return { args, env };
}

/** Resolves true once the process is gone, false if `ms` pass first. */
export function waitGone(proc: WorkerProc, ms: number): Promise<boolean> {
  if (proc.gone) return Promise.resolve(true);
  return new Promise((res) => {
    const t = setTimeout(() => res(proc.gone), ms);
    proc.exitWaiters.push(() => {
      clearTimeout(t);
      res(true);
    });
  });
}
