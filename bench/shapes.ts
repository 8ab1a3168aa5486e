// TPU-shaped execution on the CPU (issue 28): tiny-gpt2 loaded with mode "compile" warms every
// shape of its plan at load, then serves a mixed trace of generation requests (prompt lengths
// 3–200 tokens, max_new_tokens 1–64, 1–16 concurrent callers, so sequences join and leave the
// decode batch mid-decode). Printed: graphs compiled at load, recompiles after it (target 0),
// distinct forward shapes (target ≤ the plan's size), p99 ÷ p50 of time to first token and of
// time per output token (target ≤ 3 each: no call waits for a compile), padding waste, and
// tokens/s of the compiled model against the eager one at 8 callers (target ≥ 1.0×). The
// compile counts are the CPU's proxy for TPU compiles (docs/tpu-vm.md).
import { writeFileSync } from "node:fs";
import { cpus, loadavg } from "node:os";
import type { TtftParts } from "../runtime/wire/ops.js";
import type { McpServer } from "./lib/procs.js";
import { section, type SectionResult } from "./lib/report.js";
import { median, readCpuTimes, stealPct, verdict } from "./lib/stats.js";

export interface ShapesBenchOptions {
  mcp: McpServer;
  model: string;
  /** Requests of the mixed trace (the issue's figure: at least 300). */
  requests: number;
  /** Calls per caller in one round of the compiled-against-eager comparison. */
  perCaller: number;
  /** Rounds on each side of that comparison (its median is compared, its spread shown). */
  rounds: number;
  say: (msg: string) => void;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** load_model, followed to its result when the server answers it as a job (a slow load: the
 * warm-up of every shape of the plan can outlast the server's soft deadline). */
async function load(mcp: McpServer, args: Record<string, unknown>): Promise<any> {
  let r = await mcp.call("load_model", args);
  for (const id = r.job_id; id && r.job_id === id;) {
    await sleep(1000);
    const j = await mcp.call("get_job", { job_id: id });
    if (j.status === "succeeded") r = j.result;
    else if (j.status !== "running")
      throw new Error(`load_model job ${j.status}: ${JSON.stringify(j.error)}`);
  }
  return r;
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
  parts?: TtftParts;
  /** After the first token, per further token, on the worker's clock (as ttftMs). */
  tpotMs: number | null;
  /** The same from the client's clock: the call's trip through the server and back included. */
  wallTpotMs: number | null;
  tokens: number;
  /** Arrived with the other first calls of its segment, all at once (else: when its caller's
   * previous call ended, so at most a few arrive within one decode step). */
  burst?: boolean;
  /** Its segment of the trace, and when it was sent (ms from the trace's start): the dump. */
  seg?: number;
  sentMs?: number;
}

/**
 * One generation: the worker's time to first token, and the time per output token after it, on
 * the worker's clock (its tokens/s is over submission to answer) and on the client's.
 */
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
  const workerMs = (tokens / Number(r.tokens_per_s)) * 1000;
  const per = (ms: number) =>
    tokens > 1 && Number.isFinite(ms) ? (ms - ttft) / (tokens - 1) : null;
  return {
    ttftMs: ttft,
    parts: r.ttft_parts,
    tpotMs: per(workerMs),
    wallTpotMs: per(wallMs),
    tokens,
  };
}

/** The mixed trace: segments of requests at a changing number of concurrent callers. */
async function trace(mcp: McpServer, model: string, n: number): Promise<Call[]> {
  const rand = rng(28);
  const concurrency = [1, 4, 16, 8, 2, 12, 6, 16, 3, 10];
  const calls: Call[] = [];
  const start = performance.now();
  let issued = 0;
  for (let seg = 0; issued < n; seg++) {
    const c = concurrency[seg % concurrency.length];
    const todo = Math.min(n - issued, c * 3);
    const queue = Array.from({ length: todo }, (_, i) => ({
      words: rand(3, 200),
      maxNew: rand(1, 64),
      tag: issued++,
      burst: c > 1 && i < c,
    }));
    await Promise.all(
      Array.from({ length: c }, async () => {
        for (let job = queue.shift(); job; job = queue.shift()) {
          const sentMs = performance.now() - start;
          calls.push({
            ...(await generate(mcp, model, job.words, job.maxNew, job.tag)),
            burst: job.burst,
            seg,
            sentMs,
          });
        }
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

/** `rounds` throughput rounds of 8 callers: their tokens/s, the host's load and steal meanwhile. */
async function rounds(mcp: McpServer, model: string, n: number, perCaller: number) {
  const t = readCpuTimes();
  const rates: number[] = [];
  for (let i = 0; i < n; i++) rates.push(await throughput(mcp, model, 8, perCaller));
  return { rates, median: median(rates), steal: stealPct(t, readCpuTimes()), load: loadavg()[0] };
}

const PARTS = [
  ["queue_ms", "waiting for a token boundary (the decode step in progress, or room)"],
  ["behind_ms", "behind the prefill forwards of the requests taken with it"],
  ["prefill_ms", "its own prefill forward and first token"],
] as const;

/** Where time to first token went: each part's p50 / p99 over all calls, its mean over the calls
 * of the tail (TTFT at or above the p95), and each call's own prefill per forward shape. */
function ttftBreakdown(sec: ReturnType<typeof section>, calls: Call[]) {
  const withParts = calls.filter((c): c is Call & { parts: TtftParts } => c.parts !== undefined);
  if (!withParts.length) {
    sec.row("  TTFT parts", "n/a", "the worker reported no ttft_parts");
    return;
  }
  const p95 = quantile(
    withParts.map((c) => c.ttftMs),
    0.95,
  );
  const tail = withParts.filter((c) => c.ttftMs >= p95);
  const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / Math.max(xs.length, 1);
  const tailTtft = mean(tail.map((c) => c.ttftMs));
  for (const [key, what] of PARTS) {
    const all = withParts.map((c) => c.parts[key]);
    const t = mean(tail.map((c) => c.parts[key]));
    sec.row(
      `  TTFT part ${key.replace("_ms", "")}`,
      `${quantile(all, 0.5).toFixed(1)} / ${quantile(all, 0.99).toFixed(1)} ms`,
      `p50 / p99; tail (TTFT ≥ p95, ${tail.length} calls) mean ${t.toFixed(1)} ms = ${((100 * t) / tailTtft).toFixed(0)} % of its TTFT; ${what}`,
    );
    sec.fig(`ttft_tail_${key}`, t);
  }
  const together = tail.filter((c) => c.burst).length;
  sec.row(
    "  TTFT tail, arrived all at once",
    `${together} of ${tail.length}`,
    "tail calls that arrived together at a segment's start (the rest one by one)",
  );
  sec.fig("ttft_tail_burst_share", together / Math.max(tail.length, 1));
  sec.row(
    "  TTFT tail, steps and forwards waited",
    `${mean(tail.map((c) => c.parts.steps_waited)).toFixed(2)} / ${mean(tail.map((c) => c.parts.forwards_ahead)).toFixed(2)}`,
    "mean decode steps waited in the queue / prefill forwards ahead of its own, tail calls",
  );
  const byShape = new Map<string, number[]>();
  for (const c of withParts) {
    const k = c.parts.prefill_shape ?? "?";
    byShape.set(k, [...(byShape.get(k) ?? []), c.parts.prefill_ms]);
  }
  for (const [shape, xs] of [...byShape].sort(([a], [b]) =>
    a.localeCompare(b, "en", { numeric: true }),
  ))
    sec.row(
      `  own prefill at ${shape}`,
      `${quantile(xs, 0.5).toFixed(1)} / ${quantile(xs, 0.99).toFixed(1)} ms`,
      `p50 / p99 over ${xs.length} calls`,
    );
}

/**
 * What the calls that arrived together cost the worker: each burst's prefill forwards summed (the
 * calls of one forward share its start and end, so its own prefill time), the compute between
 * its first forward's start and its last first token, whatever their order. Its later calls
 * reach the worker while the server is still passing them on, so a call's TTFT on the worker's
 * clock can be less than this; the client waits for all of it.
 */
function burstCompute(sec: ReturnType<typeof section>, calls: Call[], p50: number) {
  const bursts = new Map<number, Map<string, number>>();
  for (const c of calls) {
    if (!c.burst || !c.parts || c.seg === undefined) continue;
    const forwards = bursts.get(c.seg) ?? new Map<string, number>();
    forwards.set(`${c.parts.prefill_shape} ${c.parts.prefill_ms}`, c.parts.prefill_ms);
    bursts.set(c.seg, forwards);
  }
  const sums = [...bursts.values()]
    .map((f) => ({ ms: [...f.values()].reduce((a, b) => a + b, 0), forwards: f.size }))
    .sort((a, b) => b.ms - a.ms);
  if (!sums.length) return;
  const above = sums.filter((b) => b.ms > 3 * p50).length;
  sec.row(
    "  TTFT, a burst's own prefill compute",
    `${sums[0].ms.toFixed(1)} ms at most`,
    `its prefill forwards summed, per burst: ${sums.map((b) => `${b.ms.toFixed(1)} (${b.forwards})`).join(", ")} ms (forwards); ` +
      `${above} of ${sums.length} above 3 × the TTFT p50 (${(3 * p50).toFixed(1)} ms)`,
  );
  sec.fig("ttft_burst_prefill_max_ms", sums[0].ms);
  sec.fig("ttft_bursts_above_3x_p50", above);
}

/** "p50 ± MAD, CI of p50, verdict" of one series, as the other benches print it. */
function spread(xs: number[], host: { load: number; steal: number | null }, unit: string) {
  const v = verdict(xs, { loadavg1m: host.load, cpus: cpus().length, steal: host.steal });
  const d = unit === "ms" ? 2 : 0;
  const text =
    `MAD ${v.mad.toFixed(d)} ${unit}, p50 CI [${v.ci[0].toFixed(d)}, ${v.ci[1].toFixed(d)}] (${v.ciPct.toFixed(0)} % of p50), ` +
    `load ${host.load.toFixed(2)}, steal ${host.steal === null ? "n/a" : `${host.steal.toFixed(1)} %`}, ` +
    (v.stable ? "stable" : `unstable: ${v.reason}`);
  return { v, text };
}

export async function runShapes(opts: ShapesBenchOptions): Promise<SectionResult> {
  const sec = section("shapes");
  const { mcp, model } = opts;
  opts.say(`shapes: loading ${model} with mode "compile" (every shape of its plan compiles now)…`);
  const t0 = performance.now();
  const loaded = await load(mcp, { model, mode: "compile" });
  const loadS = (performance.now() - t0) / 1000;
  let compiled: Awaited<ReturnType<typeof rounds>> | undefined;
  let status: any;
  try {
    opts.say(`shapes: the mixed trace (${opts.requests} requests)…`);
    const cpu0 = readCpuTimes();
    const tTrace = performance.now();
    const calls = await trace(mcp, model, opts.requests);
    const traceS = (performance.now() - tTrace) / 1000;
    const traceHost = { load: loadavg()[0], steal: stealPct(cpu0, readCpuTimes()) };
    // After the trace's clock and the host's figures stop: the write is not the trace's.
    if (process.env.BENCH_SHAPES_DUMP)
      writeFileSync(process.env.BENCH_SHAPES_DUMP, JSON.stringify(calls, null, 1));
    opts.say(`shapes: trace done in ${traceS.toFixed(0)} s; compiled, 8 callers…`);
    compiled = await rounds(mcp, model, opts.rounds, opts.perCaller);
    status = await mcp.call("get_runtime_status", {});
    const row = (status.loaded ?? []).find((m: { model: string }) => m.model === model);
    const ttft = calls.map((c) => c.ttftMs);
    const tpot = calls.flatMap((c) => (c.tpotMs === null ? [] : [c.tpotMs]));
    const wallTpot = calls.flatMap((c) => (c.wallTpotMs === null ? [] : [c.wallTpotMs]));
    const ttftRatio = quantile(ttft, 0.99) / quantile(ttft, 0.5);
    const tpotRatio = quantile(tpot, 0.99) / quantile(tpot, 0.5);
    const plan = loaded.shape_plan?.size ?? NaN;
    const distinct = row?.shapes?.distinct_shapes ?? NaN;
    const recompiles = row?.compiles?.recompiles_since_load ?? NaN;
    const waste = row?.shapes?.padding_waste ?? NaN;
    sec.row(
      "graphs compiled at load",
      String(loaded.graphs_compiled),
      `${loadS.toFixed(0)} s load (warm-up ${Number(loaded.warmup_s).toFixed(1)} s, compile ${Number(loaded.compile_s).toFixed(1)} s), plan of ${plan} shapes${loaded.compile_cache?.warm ? ", warm compile cache" : ""}`,
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
      `p99 ÷ p50 ${tpotRatio.toFixed(2)}, target ≤ 3 (the worker's clock, as TTFT)`,
    );
    // The client's clock adds the call's trip through the server, which a short answer divides
    // by few tokens (the figure before 2026-12-03 was this one).
    const wallRatio = quantile(wallTpot, 0.99) / quantile(wallTpot, 0.5);
    sec.row(
      "  per token, the client's clock",
      `${quantile(wallTpot, 0.5).toFixed(2)} / ${quantile(wallTpot, 0.99).toFixed(2)} ms`,
      `p50 / p99, p99 ÷ p50 ${wallRatio.toFixed(2)} (the server's trip included)`,
    );
    sec.fig("tpot_wall_p99_over_p50", wallRatio);
    // Where a high TTFT comes from: the calls that arrived together at a segment's start wait for
    // each other's prefills (one forward per length bucket, one after another), the others not.
    const staggered = calls.filter((c) => !c.burst).map((c) => c.ttftMs);
    const burst = calls.filter((c) => c.burst).map((c) => c.ttftMs);
    const staggeredRatio = quantile(staggered, 0.99) / quantile(staggered, 0.5);
    sec.row(
      "  TTFT, arrivals one by one",
      `${quantile(staggered, 0.5).toFixed(1)} / ${quantile(staggered, 0.99).toFixed(1)} ms`,
      `p50 / p99, p99 ÷ p50 ${staggeredRatio.toFixed(2)} (${staggered.length} calls)`,
    );
    sec.row(
      "  TTFT, arrivals all at once",
      `${quantile(burst, 0.5).toFixed(1)} / ${quantile(burst, 0.99).toFixed(1)} ms`,
      `p50 / p99 (${burst.length} calls, 2–16 arriving together at a segment's start)`,
    );
    sec.fig("ttft_staggered_p99_over_p50", staggeredRatio);
    sec.fig("ttft_burst_p50_ms", quantile(burst, 0.5));
    sec.fig("ttft_max_ms", Math.max(...ttft));
    ttftBreakdown(sec, calls);
    burstCompute(sec, calls, quantile(ttft, 0.5));
    const ttftSpread = spread(ttft, traceHost, "ms");
    const tpotSpread = spread(tpot, traceHost, "ms");
    sec.row("  TTFT stability", ttftSpread.v.stable ? "stable" : "unstable", ttftSpread.text);
    sec.row("  per-token stability", tpotSpread.v.stable ? "stable" : "unstable", tpotSpread.text);
    sec.row(
      "padding waste",
      `${(waste * 100).toFixed(1)}%`,
      "1 - real ÷ padded tokens, all forwards",
    );
    sec.fig("graphs_compiled_at_load", loaded.graphs_compiled);
    sec.fig("load_s", loadS);
    sec.fig("plan_size", plan);
    sec.fig("recompiles_after_load", recompiles);
    sec.fig("distinct_shapes", distinct);
    sec.fig("ttft_p99_over_p50", ttftRatio);
    sec.fig("tpot_p99_over_p50", tpotRatio);
    sec.fig("padding_waste", waste);
    sec.fig("requests", calls.length);
    sec.fig("trace_s", traceS);
    sec.fig("trace_loadavg_1m", traceHost.load);
    sec.fig("ttft_p50_ms", ttftSpread.v.p50);
    sec.fig("ttft_mad_ms", ttftSpread.v.mad);
    sec.fig("tpot_p50_ms", tpotSpread.v.p50);
    sec.fig("tpot_mad_ms", tpotSpread.v.mad);
    sec.fig("tpot_p50_ci_pct", tpotSpread.v.ciPct);
  } finally {
    await mcp.call("unload_model", { model }).catch(() => {});
  }
  opts.say("shapes: eager, 8 callers…");
  await load(mcp, { model });
  try {
    const eager = await rounds(mcp, model, opts.rounds, opts.perCaller);
    const c = compiled!;
    const ratio = c.median / eager.median;
    sec.row(
      "compiled / eager tokens/s, 8 callers",
      `${ratio.toFixed(2)}×`,
      `medians of ${opts.rounds} rounds: ${c.median.toFixed(0)} vs ${eager.median.toFixed(0)} tokens/s, target ≥ 1.0×`,
    );
    for (const [name, side] of [
      ["compiled", c],
      ["eager", eager],
    ] as const)
      sec.row(
        `  ${name} rounds`,
        side.rates.map((r) => r.toFixed(0)).join(", "),
        `tokens/s; load ${side.load.toFixed(2)}, steal ${side.steal === null ? "n/a" : `${side.steal.toFixed(1)} %`}`,
      );
    sec.fig("compiled_tokens_per_s_8", c.median);
    sec.fig("eager_tokens_per_s_8", eager.median);
    sec.fig("compiled_over_eager_8", ratio);
  } finally {
    await mcp.call("unload_model", { model }).catch(() => {});
  }
  return sec.result();
}
