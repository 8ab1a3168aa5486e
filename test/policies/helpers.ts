import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { PolicyLogger } from "../../policies/audit.js";

export function tempDir(): { dir: string; file: (name: string) => string; cleanup: () => void } {
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-policies-"));
  return {
    dir,
    file: (name) => join(dir, name),
    cleanup: () => rmSync(dir, { recursive: true, force: true }),
  };
}

export class FakeClock {
  constructor(public ms = Date.parse("2025-01-01T00:00:00Z")) {}
  readonly now = (): number => this.ms;
  advance(ms: number): void {
    this.ms += ms;
  }
}

export interface CapturedLog {
  level: string;
  obj: object;
  msg?: string;
}

export function captureLogger(): PolicyLogger & { lines: CapturedLog[] } {
  const lines: CapturedLog[] = [];
  const at = (level: string) => (obj: object, msg?: string) => void lines.push({ level, obj, msg });
  return { lines, info: at("info"), warn: at("warn"), error: at("error") };
}

/** Lets pending promise callbacks run. */
export async function flush(times = 5): Promise<void> {
  for (let i = 0; i < times; i++) await new Promise((r) => setImmediate(r));
}
