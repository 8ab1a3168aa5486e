// How much slower this machine is right now than a quiet one, measured once per test run, so that
// every timeout in the tests scales with it instead of being a fixed guess: a loaded 2-core VM
// needs minutes where a quiet one needs seconds, and a test must pass on both.
//
// The factor is the larger of two ratios against a quiet machine's times: a fixed CPU workload in
// Node (the server's side) and a fixed torch workload in the venv's Python, its import included
// (the worker's side: a worker's start is mostly importing torch). It is measured the first time
// `slowdown()` is asked, in the process that loads a vitest config, and handed to every test
// process in TPU_MCP_TEST_SLOWDOWN (set it yourself to skip the measurement).
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
export const SLOWDOWN_ENV = "TPU_MCP_TEST_SLOWDOWN";

/**
 * A quiet machine's times, in ms: the 2-core AMD EPYC development VM at load 0.25 (2026-12-02),
 * the least of 90 Node runs (22 ms) and of two torch runs (import 1,046 and 1,494 ms; work 35 ms).
 */
export const QUIET_MS = { node: 23, torchImport: 1_000, torchWork: 35 } as const;

/** Never below 1 (a fast machine keeps the written timeouts), never above 12 (a hung run still ends). */
const FLOOR = 1;
const CEILING = 12;

export interface Calibration {
  factor: number;
  nodeMs: number;
  torchImportMs: number | null;
  torchWorkMs: number | null;
}

/** The Node workload: hashing a fixed buffer, median of five runs. */
function nodeWorkMs(): number {
  const buf = Buffer.alloc(1 << 20, 7);
  const runs: number[] = [];
  for (let r = 0; r < 5; r++) {
    const t0 = performance.now();
    let h = buf;
    for (let i = 0; i < 40; i++) h = createHash("sha256").update(h).update(buf).digest();
    runs.push(performance.now() - t0);
  }
  return runs.sort((a, b) => a - b)[2];
}

const TORCH_WORK = `
import json, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
torch.set_num_threads(1)
torch.manual_seed(0)
a = torch.randn(256, 256)
for _ in range(60):
    a = torch.tanh(a @ a.T / 256)
t2 = time.perf_counter()
print(json.dumps({"import_ms": (t1 - t0) * 1000, "work_ms": (t2 - t1) * 1000}))
`;

/** The torch workload's limit: a run past it is at least CEILING times slower than quiet. */
const TORCH_LIMIT_MS = CEILING * (QUIET_MS.torchImport + QUIET_MS.torchWork);

/**
 * The torch workload in the venv's Python: its times, "slow" when it ran past TORCH_LIMIT_MS,
 * null when there is no venv to run it in (the Node ratio alone then).
 */
function torchMs(): { importMs: number; workMs: number } | "slow" | null {
  const python = join(ROOT, ".venv", "bin", "python");
  if (!existsSync(python)) return null;
  const r = spawnSync(python, ["-c", TORCH_WORK], { encoding: "utf8", timeout: TORCH_LIMIT_MS });
  if (r.error && (r.error as NodeJS.ErrnoException).code === "ETIMEDOUT") return "slow";
  if (r.status !== 0) return null;
  try {
    const { import_ms, work_ms } = JSON.parse(r.stdout.trim().split("\n").pop()!);
    return { importMs: import_ms, workMs: work_ms };
  } catch {
    return null;
  }
}

export function calibrate(): Calibration {
  const nodeMs = nodeWorkMs();
  const ratios = [nodeMs / QUIET_MS.node];
  // Already at the ceiling: the torch run (tens of seconds then) would change nothing.
  const torch = ratios[0] >= CEILING ? null : torchMs();
  if (torch === "slow") ratios.push(CEILING);
  else if (torch)
    ratios.push((torch.importMs + torch.workMs) / (QUIET_MS.torchImport + QUIET_MS.torchWork));
  const factor = Math.min(CEILING, Math.max(FLOOR, ...ratios));
  const known = torch && torch !== "slow" ? torch : null;
  return {
    factor: Math.round(factor * 100) / 100,
    nodeMs: Math.round(nodeMs),
    torchImportMs: known ? Math.round(known.importMs) : null,
    torchWorkMs: known ? Math.round(known.workMs) : null,
  };
}

let cached: number | undefined;

/** The slowdown factor of this run (measured once, then inherited by every test process). */
export function slowdown(): number {
  if (cached !== undefined) return cached;
  const given = Number(process.env[SLOWDOWN_ENV]);
  if (Number.isFinite(given) && given > 0) return (cached = given);
  const c = calibrate();
  process.env[SLOWDOWN_ENV] = String(c.factor);
  process.stderr.write(
    `[calibrate] slowdown ×${c.factor} (node ${c.nodeMs} ms, torch import ${c.torchImportMs ?? "-"} ms + work ${c.torchWorkMs ?? "-"} ms; quiet ${QUIET_MS.node}, ${QUIET_MS.torchImport} + ${QUIET_MS.torchWork})\n`,
  );
  return (cached = c.factor);
}

/** `ms` as a quiet machine needs it, scaled to this run's machine. */
export function scaled(ms: number): number {
  return Math.round(ms * slowdown());
}
