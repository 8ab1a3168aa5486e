// 1. Overhead: run_inference through MCP (stdio and Streamable HTTP) vs the same forward called
// directly in Python (bench/direct.py, same adapter code, inputs and torch threads).
// All sides are interleaved call by call, in rotating order, so drift on a noisy machine hits
// them alike; the figures are ratios of percentiles measured in this one run.
// Two more sides split the overhead into its parts:
//   runtime       WorkerRuntime → worker, no MCP (pipe + worker threads + batcher);
//   stdio-nobatch MCP stdio on the no-batching twin of the model (no batcher wait).
// And tracing's cost (docs/observability.md), both sides on stdio like `stdio`, which has
// tracing off:
//   stdio-untraced-build  the build without tracing (bench/lib/baseline.ts): off vs not there;
//   stdio-traced          spans exported over OTLP/HTTP to a sink on loopback: what on costs.
import { WorkerRuntime } from "../runtime/client.js";
import { quietLogger } from "./concurrency.js";
import {
  DirectPython,
  MODEL,
  MODEL_NOBATCH,
  PYTHON,
  ROOT,
  sentences,
  type McpServer,
} from "./lib/procs.js";
import { section, type SectionResult } from "./lib/report.js";
import { fmt, summarize } from "./lib/stats.js";
import { workerThreads } from "../server/app/build_runtime.js";

export interface OverheadOptions {
  stdio: McpServer; // MODEL and MODEL_NOBATCH loaded
  http: McpServer; // MODEL loaded
  direct: DirectPython;
  catalog: string;
  /** Timed calls per side for each batch size (at most). */
  iterations: { 1: number; 32: number };
  /** Wall-clock budget per batch size: on a busy shared machine, stop early (after 20 calls per side). */
  budgetS: { 1: number; 32: number };
  warmup: number;
  /** MODEL loaded; tracing's sides, when given. */
  tracing?: { untracedBuild: McpServer; traced: McpServer; ref: string };
}

const BASE_SIDES = ["stdio", "http", "runtime", "stdio-nobatch", "direct"] as const;
type Side = (typeof BASE_SIDES)[number] | "stdio-untraced-build" | "stdio-traced";

export async function runOverhead(o: OverheadOptions): Promise<SectionResult> {
  const s = section("overhead");
  const pool = sentences(64, 7);
  const rt = new WorkerRuntime({
    repoRoot: ROOT,
    pythonPath: PYTHON,
    catalogPath: o.catalog,
    device: "cpu",
    // The thread count the server gives its worker (server/app/build_runtime.ts), as on the MCP sides.
    extraArgs: ["--threads", String(workerThreads(0))],
    logger: quietLogger,
  });
  try {
    await rt.start();
    await rt.call("load", { model: MODEL });
    for (const batch of [1, 32] as const) {
      const inputs = (i: number) =>
        batch === 1
          ? [pool[i % pool.length]]
          : Array.from({ length: 32 }, (_, k) => pool[(i + k) % pool.length]);
      const SIDES: Side[] = [
        ...BASE_SIDES,
        ...(o.tracing ? (["stdio-untraced-build", "stdio-traced"] as const) : []),
      ];
      const tracing = o.tracing;
      const run: Partial<Record<Side, (texts: string[]) => Promise<number>>> = {
        stdio: (texts) => timed(() => o.stdio.call("run_inference", { model: MODEL, texts })),
        http: (texts) => timed(() => o.http.call("run_inference", { model: MODEL, texts })),
        runtime: (texts) => timed(() => rt.call("infer", { model: MODEL, texts })),
        "stdio-nobatch": (texts) =>
          timed(() => o.stdio.call("run_inference", { model: MODEL_NOBATCH, texts })),
        direct: async (texts) => (await o.direct.infer(texts, 1))[0],
        ...(tracing
          ? {
              "stdio-untraced-build": (texts: string[]) =>
                timed(() => tracing.untracedBuild.call("run_inference", { model: MODEL, texts })),
              "stdio-traced": (texts: string[]) =>
                timed(() => tracing.traced.call("run_inference", { model: MODEL, texts })),
            }
          : {}),
      };
      for (let i = 0; i < o.warmup; i++) for (const side of SIDES) await run[side]!(inputs(i));
      const ms = Object.fromEntries(SIDES.map((k) => [k, [] as number[]])) as Record<
        Side,
        number[]
      >;
      const until = performance.now() + o.budgetS[batch] * 1000;
      for (let i = 0; i < o.iterations[batch] && (i < 20 || performance.now() < until); i++) {
        // Rotate the order so no side always runs right after the same other side.
        for (let k = 0; k < SIDES.length; k++) {
          const side = SIDES[(i + k) % SIDES.length];
          ms[side].push(await run[side]!(inputs(i)));
        }
      }
      const sum = Object.fromEntries(SIDES.map((k) => [k, summarize(ms[k])])) as Record<
        Side,
        ReturnType<typeof summarize>
      >;
      for (const side of SIDES) {
        s.row(
          `batch ${batch}: ${side} p50 / p99`,
          `${fmt.ms(sum[side].p50)} / ${fmt.ms(sum[side].p99)}`,
          `n=${sum[side].n}`,
        );
        s.fig(`b${batch}.${side}_p50_ms`, sum[side].p50);
        s.fig(`b${batch}.${side}_p99_ms`, sum[side].p99);
      }
      for (const side of SIDES.filter((x) => x !== "direct")) {
        const r50 = sum[side].p50 / sum.direct.p50;
        const r99 = sum[side].p99 / sum.direct.p99;
        s.row(
          `batch ${batch}: ${side} / direct`,
          `${fmt.x(r50)} p50`,
          `${fmt.x(r99)} p99; ${sign(sum[side].p50 - sum.direct.p50)} at p50`,
        );
        s.fig(`b${batch}.${side}_ratio_p50`, r50);
        s.fig(`b${batch}.${side}_ratio_p99`, r99);
        s.fig(`b${batch}.${side}_added_p50_ms`, sum[side].p50 - sum.direct.p50);
        s.fig(`b${batch}.${side}_added_p99_ms`, sum[side].p99 - sum.direct.p99);
        if (side === "stdio" || side === "http")
          s.row(
            `batch ${batch}: ${side} added p50 / p99`,
            `${fmt.ms(sum[side].p50 - sum.direct.p50)} / ${fmt.ms(sum[side].p99 - sum.direct.p99)}`,
            "MCP minus direct",
          );
      }
      if (tracing) {
        // Added p50 per call over direct, side by side: tracing off (this build), the build
        // without tracing, tracing on.
        const added = (side: Side) => sum[side].p50 - sum.direct.p50;
        const off = added("stdio");
        const none = added("stdio-untraced-build");
        const on = added("stdio-traced");
        s.row(
          `batch ${batch}: added p50, tracing off / build without it (${tracing.ref}) / on`,
          `${fmt.ms(off)} / ${fmt.ms(none)} / ${fmt.ms(on)}`,
          `off − without: ${sign(off - none)} (${fmtPct((sum.stdio.p50 - sum["stdio-untraced-build"].p50) / sum["stdio-untraced-build"].p50)} of the call's p50); on − off: ${sign(on - off)} per call`,
        );
        s.fig(
          `b${batch}.tracing_off_vs_without_p50_ratio`,
          sum.stdio.p50 / sum["stdio-untraced-build"].p50,
        );
        s.fig(`b${batch}.tracing_on_added_p50_ms`, on - off);
      }
    }
  } finally {
    await rt.close();
  }
  s.note(
    "overhead sides: runtime = WorkerRuntime straight to a worker (no MCP); stdio-nobatch = MCP stdio on the twin entry with dynamic batching off (no batcher wait).",
  );
  return s.result();
}

const fmtPct = (r: number) => `${r >= 0 ? "+" : "−"}${(Math.abs(r) * 100).toFixed(1)} %`;
const sign = (ms: number) => `${ms >= 0 ? "+" : "−"}${fmt.ms(Math.abs(ms))}`;

async function timed(fn: () => Promise<unknown>): Promise<number> {
  const t0 = performance.now();
  await fn();
  return performance.now() - t0;
}
