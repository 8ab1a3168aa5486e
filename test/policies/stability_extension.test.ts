// Issue 33 (row 6): a benchmark's estimate includes the worst case of the worker's stability
// extension. The factor has one source, lib/benchmark_defaults.ts: run_benchmark sends it in every
// request (the worker has no default of its own and refuses a request without it) and the
// estimator reads the same constant. What the estimator assumes the extension can cost is checked
// here against the worker's own series loop (tpu_worker/bench/stability.py's settle and Goal), run
// on a host that never lets a series be stable, with a made-up clock: the two sides agree.
import { execFileSync } from "node:child_process";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { EXTEND_FACTOR } from "../../lib/benchmark_defaults.js";
import { estimateCost, extensionS, type ModelFacts } from "../../policies/estimate.js";
import { scaled } from "../helpers/calibrate.js";
import { ROOT } from "../helpers/server.js";

/** The worker's measured window (seconds) of one configuration that stays unstable. */
function workerWorstWindow(
  cases: { iterations?: number; duration_s?: number; pass_s: number; max_duration_s: number }[],
): number[] {
  const script = `
import json, sys
from tpu_worker.bench.host import HostWindow
from tpu_worker.bench.stability import Goal, settle

class Loaded:  # the 1-minute load above the cores: no series is ever stable
    def cpu_count(self): return 2
    def loadavg_1m(self): return 9.0
    def cpu_jiffies(self): return None

out = []
for c in json.load(sys.stdin):
    t = [0.0]
    def call():
        t[0] += c["pass_s"]
        return c["pass_s"]
    goal = Goal(c.get("iterations"), c.get("duration_s"), ${EXTEND_FACTOR}, 10_000, c["max_duration_s"])
    out.append(settle(call, goal, HostWindow(Loaded()), seed=0, clock=lambda: t[0]).window_s)
print(json.dumps(out))
`;
  const stdout = execFileSync(join(ROOT, ".venv/bin/python"), ["-c", script], {
    input: JSON.stringify(cases),
    env: { ...process.env, PYTHONPATH: join(ROOT, "runtime", "worker") },
    encoding: "utf8",
  });
  return JSON.parse(stdout) as number[];
}

describe("the stability extension's worst case, as the worker runs it", () => {
  const cases = [
    { iterations: 20, pass_s: 0.05, max_duration_s: 600 },
    { iterations: 3, pass_s: 0.5, max_duration_s: 600 },
    // An extended iteration run stops at max_duration_s from the series' start.
    { iterations: 100, pass_s: 0.1, max_duration_s: 25 },
    { duration_s: 1, pass_s: 0.01, max_duration_s: 600 },
    // A duration run's extension stops at max_duration_s too.
    { duration_s: 10, pass_s: 0.01, max_duration_s: 25 },
  ];

  it(
    "equals the window the worker's settle() runs when no series is ever stable",
    { timeout: scaled(60_000) },
    () => {
      const worker = workerWorstWindow(cases);
      cases.forEach((c, i) => {
        const asked = c.duration_s ?? c.iterations! * c.pass_s;
        const estimated = asked + extensionS(c, c.pass_s, EXTEND_FACTOR, c.max_duration_s);
        // The worker ends a window after the pass that crosses it: at most one pass more.
        expect(worker[i]).toBeGreaterThanOrEqual(estimated - 1e-6);
        expect(worker[i]).toBeLessThanOrEqual(estimated + c.pass_s + 1e-6);
      });
      // Not a bound that holds for any number: the factor's worst case is really reached.
      expect(worker[0]).toBeCloseTo(EXTEND_FACTOR * 20 * 0.05, 6);
    },
  );

  it("is part of a benchmark's estimate, per configuration, and bounded by max_duration_s", () => {
    const model: ModelFacts = {
      id: "m",
      parameters: 1000,
      weight_bytes: 4000,
      dtypes: ["float32"],
    };
    const device = { kind: "cpu", memory_free_bytes: null, memory_total_bytes: null };
    const at = (args: Record<string, unknown>, max_duration_s?: number) =>
      estimateCost({
        kind: "benchmark",
        args: { warmup: 0, ...args },
        model,
        device,
        ...(max_duration_s !== undefined ? { max_duration_s } : {}),
      });
    // Two configurations of a 2 s window: each may run EXTEND_FACTOR × 2 s.
    const timed = at({ batch_sizes: [1, 2], duration_s: 2 });
    expect(timed.stability_extension_s).toBeCloseTo(2 * (EXTEND_FACTOR - 1) * 2, 6);
    expect(timed.device_seconds).toBeGreaterThanOrEqual(2 * EXTEND_FACTOR * 2);
    expect(at({ batch_sizes: [1, 2], duration_s: 2 }, 5).stability_extension_s).toBeCloseTo(
      2 * (5 - 2),
      6,
    );
    // An engine's benchmark (vLLM) measures what was asked and never extends a series.
    const engine = estimateCost({
      kind: "benchmark",
      args: { warmup: 0, batch_sizes: [1, 2], duration_s: 2 },
      model: { ...model, engine: "vllm" },
      device,
    });
    expect(engine.stability_extension_s).toBe(0);
    expect(engine.device_seconds).toBeCloseTo(timed.device_seconds - 12, 6);
    // Iterations: the factor times the passes asked.
    const counted = at({ batch_sizes: [1], iterations: 40 });
    expect(counted.stability_extension_s).toBeGreaterThan(0);
    expect(at({ batch_sizes: [1], iterations: 80 }).stability_extension_s).toBeCloseTo(
      2 * counted.stability_extension_s!,
      2,
    );
  });
});
