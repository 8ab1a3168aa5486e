// TPU-shaped execution on the CPU (issue 28): tiny-gpt2 loaded with mode "compile" warms every
// shape of its plan at load, then serves a mixed trace of generation requests (prompt lengths
// 3–200 tokens, max_new_tokens 1–64, 1–16 concurrent callers, so sequences join and leave the
// decode batch mid-decode). Printed: graphs compiled at load, recompiles after it (target 0),
// distinct forward shapes (target ≤ the plan's size), p99 ÷ p50 of time to first token and of
// time per output token (target ≤ 3 each: no call waits for a compile), padding waste, and
// tokens/s of the compiled model against the eager one at 8 callers (target ≥ 1.0×). The
// compile counts are the CPU's proxy for TPU compiles (docs/tpu-vm.md).
import type { McpServer } from "./lib/procs.js";
import { section, type SectionResult } from "./lib/report.js";

export interface ShapesBenchOptions {
  mcp: McpServer;
  model: string;
  /** Requests of the mixed trace (the figure: at least 300). */
  requests: number;
  /** Calls per caller on each side of the compiled-against-eager comparison. */
  perCaller: number;
  say: (msg: string) => void;
}

/** A deterministic pseudo-random sequence (the trace is the same in every run). */
function rng(seed: number) {
  let s = seed >>> 0;
  return (lo: number, hi: number) => {
    s = (s * 1664525 + 1013904223) >>> 0;
    return lo + (s % (hi - lo + 1));
  };
}

function quantile(xs: number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))] ?? NaN;
}

interface Call {
  ttftMs: number;
  tpotMs: number | null;
  tokens: number;
}

/** One generation: the worker's time to first token, and the time per output token after it. */
async function generate(
  mcp: McpServer,
  model: string,
  words: number,
  maxNew: number,
  tag: number,
): Promise<Call> {
  const text = `request ${tag} ` + Array.from({ length: words }, (_, i) => `w${i % 50}`).join(" ");
  const t0 = performance.now();
  const r = await mcp.call("run_inference", { model, texts: [text], max_new_tokens: maxNew });
  const wallMs = performance.now() - t0;
  const tokens = r.new_tokens[0] as number;
  const ttft = Number(r.ttft_ms);
  return { ttftMs: ttft, tpotMs: tokens > 1 ? (wallMs - ttft) / (tokens - 1) : null, tokens };
}

/** The mixed trace: segments of requests at a changing number of concurrent callers. */
async function trace(mcp: McpServer, model: string, n: number): Promise<Call[]> {
  const rand = rng(28);
  const concurrency = [1, 4, 16, 8, 2, 12, 6, 16, 3, 10];
  const calls: Call[] = [];
  let issued = 0;
  for (let seg = 0; issued < n; seg++) {
    const c = concurrency[seg % concurrency.length];
    const todo = Math.min(n - issued, c * 3);
    const queue = Array.from({ length: todo }, () => ({
      words: rand(3, 200),
      maxNew: rand(1, 64),
      tag: issued++,
    }));
    await Promise.all(
      Array.from({ length: c }, async () => {
        for (let job = queue.shift(); job; job = queue.shift())
          calls.push(await generate(mcp, model, job.words, job.maxNew, job.tag));
      }),
    );
  }
  return calls;
}

/** Tokens/s of `callers` callers at once, `perCaller` calls each (the same calls on either side). */
async function throughput(mcp: McpServer, model: string, callers: number, perCaller: number) {
  const t0 = performance.now();
  const counts = await Promise.all(
    Array.from({ length: callers }, async (_, i) => {
      let tokens = 0;
      for (let k = 0; k < perCaller; k++)
        tokens += (await generate(mcp, model, 10 + 17 * i, 32, 1000 + i)).tokens;
      return tokens;
    }),
  );
  const tokens = counts.reduce((a, b) => a + b, 0);
  return tokens / ((performance.now() - t0) / 1000);
}

export async function runShapes(opts: ShapesBenchOptions): Promise<SectionResult> {
  const sec = section("shapes");
  const { mcp, model } = opts;
  opts.say(`shapes: loading ${model} with mode "compile" (every shape of its plan compiles now)…`);
  const t0 = performance.now();
  const load = await mcp.call("load_model", { model, mode: "compile" });
  const loadS = (performance.now() - t0) / 1000;
  let compiledRate = 0;
  let status: any;
  try {
    opts.say(`shapes: the mixed trace (${opts.requests} requests)…`);
    const calls = await trace(mcp, model, opts.requests);
    opts.say("shapes: compiled, 8 callers…");
    compiledRate = await throughput(mcp, model, 8, opts.perCaller);
    status = await mcp.call("get_runtime_status", {});
    const row = (status.loaded ?? []).find((m: { model: string }) => m.model === model);
    const ttft = calls.map((c) => c.ttftMs);
    const tpot = calls.flatMap((c) => (c.tpotMs === null ? [] : [c.tpotMs]));
    const ttftRatio = quantile(ttft, 0.99) / quantile(ttft, 0.5);
    const tpotRatio = quantile(tpot, 0.99) / quantile(tpot, 0.5);
    const plan = load.shape_plan?.size ?? NaN;
    const distinct = row?.shapes?.distinct_shapes ?? NaN;
    const recompiles = row?.compiles?.recompiles_since_load ?? NaN;
    const waste = row?.shapes?.padding_waste ?? NaN;
    sec.row(
      "graphs compiled at load",
      String(load.graphs_compiled),
      `${loadS.toFixed(0)} s load, compile ${load.compile_s.toFixed(1)} s, plan of ${plan} shapes${load.compile_cache?.warm ? ", warm compile cache" : ""}`,
    );
    sec.row("recompiles after load", String(recompiles), "target 0");
    sec.row("distinct forward shapes", `${distinct} of ${plan}`, "target ≤ the plan's size");
    sec.row(
      "time to first token p50 / p99",
      `${quantile(ttft, 0.5).toFixed(1)} / ${quantile(ttft, 0.99).toFixed(1)} ms`,
      `p99 ÷ p50 ${ttftRatio.toFixed(2)}, target ≤ 3 (${calls.length} requests, queueing included)`,
    );
    sec.row(
      "time per output token p50 / p99",
      `${quantile(tpot, 0.5).toFixed(2)} / ${quantile(tpot, 0.99).toFixed(2)} ms`,
      `p99 ÷ p50 ${tpotRatio.toFixed(2)}, target ≤ 3`,
    );
    sec.row(
      "padding waste",
      `${(waste * 100).toFixed(1)}%`,
      "1 - real ÷ padded tokens, all forwards",
    );
    sec.fig("graphs_compiled_at_load", load.graphs_compiled);
    sec.fig("load_s", loadS);
    sec.fig("plan_size", plan);
    sec.fig("recompiles_after_load", recompiles);
    sec.fig("distinct_shapes", distinct);
    sec.fig("ttft_p99_over_p50", ttftRatio);
    sec.fig("tpot_p99_over_p50", tpotRatio);
    sec.fig("padding_waste", waste);
    sec.fig("requests", calls.length);
  } finally {
    await mcp.call("unload_model", { model }).catch(() => {});
  }
  opts.say("shapes: eager, 8 callers…");
  await mcp.call("load_model", { model });
  try {
    const eagerRate = await throughput(mcp, model, 8, opts.perCaller);
    const ratio = compiledRate / eagerRate;
    sec.row(
      "compiled / eager tokens/s, 8 callers",
      `${ratio.toFixed(2)}×`,
      `${compiledRate.toFixed(0)} vs ${eagerRate.toFixed(0)} tokens/s, target ≥ 1.0×`,
    );
    sec.fig("compiled_tokens_per_s_8", compiledRate);
    sec.fig("eager_tokens_per_s_8", eagerRate);
    sec.fig("compiled_over_eager_8", ratio);
  } finally {
    await mcp.call("unload_model", { model }).catch(() => {});
  }
  return sec.result();
}
