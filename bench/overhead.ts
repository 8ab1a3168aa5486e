// 1. Overhead: run_inference through MCP (stdio and Streamable HTTP) vs the same forward called
// directly in Python (bench/direct.py, same adapter code, inputs and torch threads).
// The three sides are interleaved call by call, in rotating order, so drift on a noisy machine
// hits all of them alike; the figures are ratios of percentiles measured in this one run.
import { DirectPython, MODEL, sentences, type McpServer } from "./lib/procs.js";
import { section, type SectionResult } from "./lib/report.js";
import { fmt, summarize } from "./lib/stats.js";

export interface OverheadOptions {
  stdio: McpServer;
  http: McpServer;
  direct: DirectPython;
  /** Timed calls per side for each batch size. */
  iterations: { 1: number; 32: number };
  warmup: number;
}

type Side = "stdio" | "http" | "direct";

export async function runOverhead(o: OverheadOptions): Promise<SectionResult> {
  const s = section("overhead");
  const pool = sentences(64, 7);
  for (const batch of [1, 32] as const) {
    const inputs = (i: number) =>
      batch === 1 ? [pool[i % pool.length]] : Array.from({ length: 32 }, (_, k) => pool[(i + k) % pool.length]);
    const run: Record<Side, (texts: string[]) => Promise<number>> = {
      stdio: async (texts) => timed(() => o.stdio.call("run_inference", { model: MODEL, texts })),
      http: async (texts) => timed(() => o.http.call("run_inference", { model: MODEL, texts })),
      direct: async (texts) => (await o.direct.infer(texts, 1))[0],
    };
    const sides: Side[] = ["stdio", "http", "direct"];
    for (let i = 0; i < o.warmup; i++) for (const side of sides) await run[side](inputs(i));
    const ms: Record<Side, number[]> = { stdio: [], http: [], direct: [] };
    for (let i = 0; i < o.iterations[batch]; i++) {
      // Rotate the order so no side always runs right after another's cache/thread state.
      for (let k = 0; k < sides.length; k++) {
        const side = sides[(i + k) % sides.length];
        ms[side].push(await run[side](inputs(i)));
      }
    }
    const sum = { stdio: summarize(ms.stdio), http: summarize(ms.http), direct: summarize(ms.direct) };
    for (const side of sides) {
      s.row(`batch ${batch}: ${side} p50 / p99`, `${fmt.ms(sum[side].p50)} / ${fmt.ms(sum[side].p99)}`, `n=${sum[side].n}`);
      s.fig(`b${batch}.${side}_p50_ms`, sum[side].p50);
      s.fig(`b${batch}.${side}_p99_ms`, sum[side].p99);
    }
    for (const side of ["stdio", "http"] as const) {
      const r50 = sum[side].p50 / sum.direct.p50;
      const r99 = sum[side].p99 / sum.direct.p99;
      s.row(`batch ${batch}: ${side} / direct`, `${fmt.x(r50)} p50`, `${fmt.x(r99)} p99; +${fmt.ms(sum[side].p50 - sum.direct.p50)} at p50`);
      s.fig(`b${batch}.${side}_ratio_p50`, r50);
      s.fig(`b${batch}.${side}_ratio_p99`, r99);
    }
  }
  return s.result();
}

async function timed(fn: () => Promise<unknown>): Promise<number> {
  const t0 = performance.now();
  await fn();
  return performance.now() - t0;
}
