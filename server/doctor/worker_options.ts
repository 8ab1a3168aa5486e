// The options every doctor starts a worker with: the server's own (app/build_runtime.ts: threads,
// timeouts, heartbeats, paths), so `tpu-mcp doctor` sees the worker the server would run. Only
// what a check needs differs, and is named here: the worker starts on the first call, and is
// never restarted (one that dies fails its check with its last words).
import type { Logger } from "pino";
import type { WorkerRuntimeOptions } from "../../runtime/client.js";
import { baseRuntimeOptions } from "../app/build_runtime.js";
import type { ServerConfig } from "../config/config.js";

/** What a doctor changes in the server's worker options, and nothing else. */
export const DOCTOR_OVERRIDES = { startMode: "lazy", maxRestartsInWindow: 0 } as const;

export function doctorWorkerOptions(
  config: ServerConfig,
  logger: Logger,
  extra: Partial<WorkerRuntimeOptions> = {},
): WorkerRuntimeOptions {
  return { ...baseRuntimeOptions(config, logger), ...DOCTOR_OVERRIDES, ...extra };
}
