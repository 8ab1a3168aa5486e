// Close hooks in the manner of fastify's onClose: each resource registers its close where it is
// opened, and closing runs them last-opened first, so nothing is closed while something opened
// after it (and maybe using it) still runs. One failing close is logged and the rest still run.
import type { Logger } from "pino";

export class CloseHooks {
  private readonly hooks: Array<{ name: string; fn: () => unknown }> = [];
  private closing: Promise<void> | null = null;

  constructor(private readonly logger: Logger) {}

  add(name: string, fn: () => unknown): void {
    this.hooks.push({ name, fn });
  }

  /** Runs every hook once (a second call waits for the first); rejects with the first failure. */
  run(): Promise<void> {
    this.closing ??= (async () => {
      let first: unknown;
      for (const { name, fn } of [...this.hooks].reverse()) {
        try {
          await fn();
        } catch (e) {
          this.logger.error({ err: String(e), resource: name }, "close failed");
          first ??= e;
        }
      }
      if (first !== undefined) throw first;
    })();
    return this.closing;
  }
}
