// The server half of `tpu-mcp workers drain|undrain` (the CLI half is cli/workers.ts): applies
// the drain state the operator wants (control/channel.ts) to the pool and publishes every
// worker's state, which the CLI waits on ("drained, 0 calls in flight: it may be stopped").
import type { Logger } from "pino";
import type { Runtime } from "../../runtime/types.js";
import type { ControlHandler } from "./channel.js";

/** Applies the desired drain state and publishes every worker's state; null without a pool. */
export function drainHandler(runtime: Runtime, logger: Logger): ControlHandler | null {
  // The default pool of one worker has nothing to drain and publishes no worker states.
  if (runtime.single) return null;
  const pool = runtime;
  return {
    name: "drain",
    async tick(channel) {
      const want = await channel.drained();
      for (const w of pool.workers()) {
        if (want.has(w.name) && !w.draining) {
          pool.drain(w.name);
          logger.warn({ worker: w.name }, "worker drained: no new calls are routed to it");
        } else if (!want.has(w.name) && w.draining) {
          pool.undrain(w.name);
          logger.info({ worker: w.name }, "worker undrained");
        }
      }
      await channel.publishWorkers(pool.workers());
    },
  };
}
