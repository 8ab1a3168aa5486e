// Generation through MCP beside Hugging Face `generate` called directly, side by side in one run
// (issue 24): 8 concurrent MCP callers of one model at 32 new tokens against one caller (the
// worker's continuous batching should make 8 callers at least 3x the tokens/s of one), HF
// `generate` at batch 8 on the same weights as the ceiling, and one caller's sequential
// generation through MCP against HF `generate` at batch 1 (within 1.2x). Rounds interleave the
// four sides so that the shared machine's load falls on all of them alike.
import { spawn, type ChildProcess } from "node:child_process";
import { join } from "node:path";
import { createInterface } from "node:readline";
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

/** bench/generate_direct.py: HF `generate` on the worker's own adapter, one JSON line each way. */
class DirectGenerate {
  private readonly lines: AsyncIterator<string>;
  private stderr = "";
  private constructor(private readonly proc: ChildProcess) {
    this.lines = createInterface({ input: proc.stdout! })[Symbol.asyncIterator]();
    proc.stderr!.on("data", (d: Buffer) => (this.stderr = (this.stderr + d).slice(-4000)));
  }

  static async start(catalog: string, model: string): Promise<DirectGenerate> {
    const proc = spawn(PYTHON, [join(ROOT, "bench", "generate_direct.py"), catalog, model], {
      cwd: ROOT,
      // The server's worker thread count, so the two differ only by what the server adds.
      env: {
        ...process.env,
        PYTHONPATH: WORKER_PATH,
        BENCH_TORCH_THREADS: process.env.BENCH_TORCH_THREADS ?? String(workerThreads(0)),
      },
      stdio: ["pipe", "pipe", "pipe"],
    });
    const d = new DirectGenerate(proc);
    await d.next();
    return d;
  }

  private async next(): Promise<any> {
    const r = await this.lines.next();
    if (r.done) throw new Error(`generate_direct.py exited:\n${this.stderr}`);
    const reply = JSON.parse(r.value);
    if (reply.error) throw new Error(`generate_direct.py: ${reply.error}`);
    return reply;
  }

  async request(cmd: Record<string, unknown>): Promise<any> {
    this.proc.stdin!.write(JSON.stringify(cmd) + "\n");
    return this.next();
  }

  /** `n` generate calls on the whole batch: wall ms and tokens of each. */
  generate(texts: string[], maxNew: number, n = 1): Promise<{ ms: number[]; tokens: number[] }> {
    return this.request({ op: "generate", texts, max_new_tokens: maxNew, n });
  }

  close(): Promise<void> {
    return new Promise((r) => {
      if (this.proc.exitCode !== null) return r();
      this.proc.once("exit", () => r());
      this.proc.stdin!.end();
    });
  }
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
  const direct = await DirectGenerate.start(opts.catalog, model);
  try {
    const info = await direct.request({ op: "info" });
    // Warm both sides (first-call allocations, the tokenizer) outside the measured rounds.
    for (const p of prompts) await mcpGenerate(p);
    await direct.generate(prompts, maxNew);
    await direct.generate(prompts.slice(0, 1), maxNew);

    const one = new Tally();
    const many = new Tally();
    const directB1 = new Tally();
    const directB8 = new Tally();
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

      // HF generate, batch 1, the same prompts in turn (timed inside Python).
      for (let k = 0; k < opts.perCaller; k++)
        for (const p of prompts) {
          const r = await direct.generate([p], maxNew);
          directB1.add(r.tokens[0], r.ms[0] / 1000);
        }
      // HF generate, all prompts as one batch.
      const r8 = await direct.generate(prompts, maxNew, opts.perCaller);
      directB8.add(
        r8.tokens.reduce((a, b) => a + b, 0),
        r8.ms.reduce((a, b) => a + b, 0) / 1000,
      );
    }

    const status = await mcp.call("get_runtime_status", {});
    const loaded = (status.loaded ?? []).find((m: { model: string }) => m.model === model);

    const n = opts.callers;
    const tps = (v: number) => `${v.toFixed(0)} tokens/s`;
    sec.row("MCP, 1 caller", tps(one.rate), `${one.tokens} tokens, ${model}, ${maxNew} new each`);
    sec.row(`MCP, ${n} callers at once`, tps(many.rate), `${many.tokens} tokens`);
    sec.row("HF generate direct, batch 1", tps(directB1.rate), `${directB1.tokens} tokens`);
    sec.row(`HF generate direct, batch ${n}`, tps(directB8.rate), `${directB8.tokens} tokens`);
    const concurrency = many.rate / one.rate;
    const ceiling = many.rate / directB8.rate;
    const sequential = directB1.rate / one.rate;
    sec.row(`${n} callers / 1 caller (MCP)`, `${concurrency.toFixed(2)}×`, "target ≥ 3×");
    sec.row(
      `MCP ${n} callers / HF batch ${n}`,
      `${ceiling.toFixed(2)}×`,
      "the ceiling: ≤ 1× expected",
    );
    sec.row(
      "MCP 1 caller time / HF batch 1 time",
      `${sequential.toFixed(2)}×`,
      "sequential generation, target ≤ 1.2×",
    );
    sec.fig("mcp_1_tokens_per_s", one.rate);
    sec.fig(`mcp_${n}_tokens_per_s`, many.rate);
    sec.fig("direct_b1_tokens_per_s", directB1.rate);
    sec.fig(`direct_b${n}_tokens_per_s`, directB8.rate);
    sec.fig("concurrency_ratio", concurrency);
    sec.fig("vs_direct_batch_ratio", ceiling);
    sec.fig("sequential_ratio", sequential);
    sec.note(
      `generate: HF generate on the worker's own adapter (torch ${info.torch}, transformers ${info.transformers}, torch threads: ${info.torch_threads}), greedy, ${maxNew} new tokens; tokens counted up to the first EOS on every side` +
        (loaded?.batching
          ? `; worker decode loop after the run: ${JSON.stringify(loaded.batching)}`
          : ""),
    );
  } finally {
    await direct.close();
    await mcp.call("unload_model", { model }).catch(() => {});
  }
  return sec.result();
}
