// Shared by the simulated-TPU-host suites: running the project's Python with the worker package
// on its path, and the environment a process needs to run on a simulated host (only the hook in
// runtime/worker/tpu_sim/hook fakes the chip; see runtime/worker/tpu_sim/).
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { ROOT } from "../helpers/server.js";

const py = join(ROOT, ".venv/bin/python");
export const workerDir = join(ROOT, "runtime/worker");

/** Runs the project's Python with the worker package importable; returns its last stdout line. */
export function pyRun(args: string[]): string {
  const r = spawnSync(py, args, {
    cwd: ROOT,
    env: { ...process.env, PYTHONPATH: workerDir },
    encoding: "utf8",
  });
  if (r.status !== 0) throw new Error(`${args.join(" ")} failed: ${r.stderr}`);
  return r.stdout.trim().split("\n").pop()!;
}

/** The .venv-tpu python with the real torch-tpu wheel (made once, then a marker skips it). */
export function tpuPython(): string {
  return pyRun([join(workerDir, "tpu_sim/setup_env.py"), "--root", ROOT]);
}

/**
 * The environment of a process on the simulated host `host` (its workers inherit it): this
 * machine's TPU variables dropped, the hook on PYTHONPATH, the compile cache under `cacheDir`.
 */
export function simEnv(
  host: string,
  cacheDir: string,
  extra: Record<string, string> = {},
): Record<string, string> {
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(process.env))
    if (v !== undefined && !k.startsWith("TPU_") && !k.startsWith("TORCH_TPU_")) env[k] = v;
  return {
    ...env,
    TPU_SIM_ROOT: host,
    // The server's look for chips reads this ordinary setting; it knows nothing of the simulator.
    TPU_MCP_DEV_DIR: join(host, "dev"),
    PYTHONPATH: join(workerDir, "tpu_sim/hook"),
    TPU_SKIP_MDS_QUERY: "1", // libtpu would ask the GCE metadata server for minutes first
    TPU_WORKER_TCMALLOC: "0",
    TPU_WORKER_COMPILATION_CACHE: join(cacheDir, "tt-cache"),
    ...extra,
  };
}
