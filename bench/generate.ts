// Generation through MCP beside Hugging Face `generate` called directly, side by side in one run
// (issue 24): 8 concurrent MCP callers of one model at 32 new tokens against one caller (the
// worker's continuous batching should make 8 callers at least 3x the tokens/s of one), HF
// `generate` at batch 8 on the same weights as the ceiling, and one caller's sequential
// generation through MCP against HF `generate` one prompt at a time (within 1.2x); beside them
// the worker's decode loop in process (bench/generate_direct.py), what the server and pipe add.
// Rounds interleave the sides so that the shared machine's load falls on all of them alike.
import { execFile } from "node:child_process";
import { join } from "node:path";
import { workerThreads } from "../server/app/build_runtime.js";
import { PYTHON, ROOT, WORKER_PATH, sentences, type McpServer } from "./lib/procs.js";
import { section, type SectionResult } from "./lib/report.js";

export interface GenerateBenchOptions {
  mcp: McpServer;
  catalog: string;
  model: string;
  callers: number;
  newTokens: number;
  /** Calls per caller per round on the concurrent side (and batches per round on the direct one). */
  perCaller: number;
  rounds: number;
  say: (msg: string) => void;
}

/** One section of bench/generate_direct.py's report: tokens of one call, median wall seconds. */
interface DirectSection {
  tokens: number;
  seconds: number;
}

interface DirectReport {
  torch: string;
  transformers: string;
  torch_threads: number;
  hf_generate_batch: DirectSection;
  hf_generate_sequential: DirectSection;
  worker_decode_sequential: DirectSection;
  worker_decode_concurrent: DirectSection;
}

/**
 * bench/generate_direct.py (one run per round, so it interleaves with the MCP sides): HF
 * `generate` on the worker's own adapter at batch N and one prompt at a time, and the worker's
 * decode loop in process without a server, on the same prompts and thread count as the server's
 * worker.
 */
function runDirect(
  catalog: string,
  model: string,
  prompts: string[],
  maxNew: number,
  repeats: number,
): Promise<DirectReport> {
  const threads = process.env.BENCH_TORCH_THREADS ?? String(workerThreads(0));
  const args = [
    join(ROOT, "bench", "generate_direct.py"),
    ...["--catalog", catalog, "--model", model, "--batch", String(prompts.length)],
    ...["--max-new-tokens", String(maxNew), "--repeats", String(repeats)],
    ...["--threads", threads, "--prompts", JSON.stringify(prompts)],
  ];
  return new Promise((resolve, reject) => {
    execFile(
      PYTHON,
      args,
      { cwd: ROOT, env: { ...process.env, PYTHONPATH: WORKER_PATH }, maxBuffer: 1 << 24 },
      (err, stdout, stderr) => {
        if (err) return reject(new Error(`generate_direct.py failed: ${err.message}\n${stderr}`));
        resolve(JSON.parse(stdout) as DirectReport);
      },
    );
  });
}

/** Tokens and seconds accumulated over rounds: the rate is total tokens over total time. */
class Tally {
  tokens = 0;
  seconds = 0;
  add(tokens: number, seconds: number) {
    this.tokens += tokens;
    this.seconds += seconds;
  }
  get rate() {
    return this.seconds > 0 ? this.tokens / this.seconds : 0;
  }
}

export async function runGenerate(opts: GenerateBenchOptions): Promise<SectionResult> {
  const sec = section("generate");
  const { mcp, model, newTokens: maxNew } = opts;
  const prompts = sentences(opts.callers, 7);
  const mcpGenerate = async (text: string): Promise<number> => {
    const r = await mcp.call("run_inference", { model, texts: [text], max_new_tokens: maxNew });
    return r.new_tokens[0];
  };

  await mcp.call("load_model", { model });
  try {
    // Warm the server side (first-call allocations, the tokenizer); the direct script warms its own.
    for (const p of prompts) await mcpGenerate(p);

    const one = new Tally();
    const many = new Tally();
    const directB1 = new Tally();
    const directBn = new Tally();
    const loopOne = new Tally();
    const loopMany = new Tally();
    let info: DirectReport | undefined;
    for (let round = 0; round < opts.rounds; round++) {
      opts.say(`generate: round ${round + 1}/${opts.rounds}`);
      // One caller: each prompt in turn, each waiting for the previous answer.
      let t0 = performance.now();
      let tokens = 0;
      for (let k = 0; k < opts.perCaller; k++)
        for (const p of prompts) tokens += await mcpGenerate(p);
      one.add(tokens, (performance.now() - t0) / 1000);

      // `callers` callers at once, each with its own prompt, `perCaller` calls each.
      t0 = performance.now();
      const counts = await Promise.all(
        prompts.map(async (p) => {
          let n = 0;
          for (let k = 0; k < opts.perCaller; k++) n += await mcpGenerate(p);
          return n;
        }),
      );
      many.add(
        counts.reduce((a, b) => a + b, 0),
        (performance.now() - t0) / 1000,
      );

      // The direct sides on the same prompts (timed inside Python: medians of perCaller calls).
      const d = await runDirect(opts.catalog, model, prompts, maxNew, opts.perCaller);
      info = d;
      const add = (t: Tally, x: DirectSection) => t.add(x.tokens, x.seconds);
      add(directB1, d.hf_generate_sequential);
      add(directBn, d.hf_generate_batch);
      add(loopOne, d.worker_decode_sequential);
      add(loopMany, d.worker_decode_concurrent);
    }

    const status = await mcp.call("get_runtime_status", {});
    const loaded = (status.loaded ?? []).find((m: { model: string }) => m.model === model);

    const n = opts.callers;
    const tps = (v: number) => `${v.toFixed(0)} tokens/s`;
    sec.row("MCP, 1 caller", tps(one.rate), `${one.tokens} tokens, ${model}, ${maxNew} new each`);
    sec.row(`MCP, ${n} callers at once`, tps(many.rate), `${many.tokens} tokens`);
    sec.row("HF generate direct, 1 prompt at a time", tps(directB1.rate));
    sec.row(`HF generate direct, batch ${n}`, tps(directBn.rate));
    sec.row("worker decode loop in process, 1 caller", tps(loopOne.rate), "no server, no pipe");
    sec.row(`worker decode loop in process, ${n} threads`, tps(loopMany.rate));
    const concurrency = many.rate / one.rate;
    const ceiling = many.rate / directBn.rate;
    const sequential = directB1.rate / one.rate;
    sec.row(`${n} callers / 1 caller (MCP)`, `${concurrency.toFixed(2)}×`, "target ≥ 3×");
    sec.row(`MCP ${n} callers / HF batch ${n}`, `${ceiling.toFixed(2)}×`, "the ceiling");
    sec.row(
      "MCP 1 caller time / HF 1 prompt at a time",
      `${sequential.toFixed(2)}×`,
      "sequential generation, target ≤ 1.2×",
    );
    sec.row(
      `MCP ${n} callers / in-process loop ${n} threads`,
      `${(many.rate / loopMany.rate).toFixed(2)}×`,
      "what the server and the pipe cost",
    );
    sec.fig("mcp_1_tokens_per_s", one.rate);
    sec.fig(`mcp_${n}_tokens_per_s`, many.rate);
    sec.fig("direct_b1_tokens_per_s", directB1.rate);
    sec.fig(`direct_b${n}_tokens_per_s`, directBn.rate);
    sec.fig("loop_1_tokens_per_s", loopOne.rate);
    sec.fig(`loop_${n}_tokens_per_s`, loopMany.rate);
    // The census of the decode step's work around the forward (issue 42): op shapes first run
    // after the load's warm-up, over every call above. Each is a compile on an eager TPU backend.
    const opShapes = loaded?.batching?.op_shapes;
    if (opShapes) {
      sec.row(
        "op shapes after warm-up (decode step census)",
        String(opShapes.new_since_load),
        `target 0; ${opShapes.signatures} (op, input shapes) signatures warmed at load`,
      );
      sec.fig("census_new_op_shapes", opShapes.new_since_load);
    }
    sec.fig("concurrency_ratio", concurrency);
    sec.fig("vs_direct_batch_ratio", ceiling);
    sec.fig("sequential_ratio", sequential);
    sec.note(
      `generate: bench/generate_direct.py on the worker's own adapter (torch ${info?.torch}, transformers ${info?.transformers}, torch threads: ${info?.torch_threads}), greedy, ${maxNew} new tokens; tokens counted up to the first EOS on every side` +
        (loaded?.batching
          ? `; the server's decode loop after the run: ${JSON.stringify(loaded.batching)}`
          : ""),
    );
  } finally {
    await mcp.call("unload_model", { model }).catch(() => {});
  }
  return sec.result();
}
