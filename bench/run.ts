// `npm run bench`: measures tpu-mcp against itself and against direct PyTorch, side by side in
// one run, prints a table and writes bench/results/latest.json. Every figure that a target
// judges is a ratio or a rate measured in this run; nothing is compared with stored numbers.
//
// Environment: BENCH_ONLY=coldstart,decompose,small,overhead,concurrency,payload,memory,pool,audit,
// tokens,estimates,budget,store,replicas,generate,train,fine_tune,shapes,prefix,stability,structured,
// structured_parse,tool_calls runs a subset (BENCH_SHAPES_REQUESTS
// scales the shapes trace, 300 requests by default, and BENCH_SHAPES_DUMP=file writes its calls
// as JSON; BENCH_PREFIX_SMOLLM2=0 leaves the real SmolLM2 model out of the prefix section);
// BENCH_THREADS sets the worker's torch threads;
// BENCH_QUICK=1 cuts the sample counts (a smoke run, not figures to quote).
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { cpus, loadavg } from "node:os";
import { join } from "node:path";
import { EventEmitter } from "node:events";
import { runAudit } from "./audit.js";
import { runBudget } from "./budget.js";
import { runColdStart } from "./coldstart.js";
import { runConcurrency } from "./concurrency.js";
import { runDecompose } from "./decompose.js";
import { runGenerate } from "./generate.js";
import { runEstimates } from "./estimates.js";
import {
  DirectPython,
  MODEL,
  MODEL_NOBATCH,
  ROOT,
  startHttp,
  startStdio,
  workerPid,
  writeBenchConfig,
  type McpServer,
} from "./lib/procs.js";
import { renderTable, type SectionResult } from "./lib/report.js";
import { runMemory } from "./memory.js";
import { runOverhead } from "./overhead.js";
import { baselineCheckout, otlpSink } from "./lib/baseline.js";
import { runPayload } from "./payload.js";
import { runPool } from "./pool.js";
import { runShapes } from "./shapes.js";
import { runPrefix, writePrefixCatalog } from "./prefix.js";
import { runSmall } from "./small.js";
import { runStability } from "./stability.js";
import { runStructured } from "./structured.js";
import { runToolCalls } from "./tool_calls.js";
import { runStructuredParse } from "./structured_parse.js";
import { runStore } from "./store.js";
import { runReplicas } from "./replicas.js";
import { runTokens } from "./tokens.js";
import { runTrain } from "./train.js";
import { runFineTune } from "./fine_tune.js";

// 32 concurrent callers each wait for 'drain' on the SDK client's pipe when it is full: a
// listener each is expected here, not a leak (Node warns from 11).
EventEmitter.defaultMaxListeners = 256;

const SECTIONS = [
  "coldstart",
  "decompose",
  "small",
  "overhead",
  "concurrency",
  "payload",
  "memory",
  "pool",
  "audit",
  "tokens",
  "estimates",
  "budget",
  "store",
  "replicas",
  "stability",
  "generate",
  "train",
  "fine_tune",
  "shapes",
  "structured",
  "structured_parse",
  "tool_calls",
  "prefix",
] as const;
const only = process.env.BENCH_ONLY?.split(",").map((x) => x.trim());
const quick = process.env.BENCH_QUICK === "1";
const want = (name: (typeof SECTIONS)[number]) => !only || only.includes(name);
for (const name of only ?? []) {
  if (!(SECTIONS as readonly string[]).includes(name))
    throw new Error(`BENCH_ONLY: unknown section ${name}; use ${SECTIONS.join(", ")}`);
}
const q = (full: number, small: number) => (quick ? small : full);

interface Target {
  name: string;
  figure: string;
  value: number;
  pass: boolean;
  threshold: string;
}

function targets(f: Record<string, number>): Target[] {
  const t: Target[] = [];
  const add = (
    name: string,
    key: string,
    ok: (v: number) => boolean,
    threshold: string,
    show = (v: number) => v.toFixed(3),
  ) => {
    if (f[key] === undefined) return;
    t.push({
      name,
      figure: `${key} = ${show(f[key])}`,
      value: f[key],
      pass: ok(f[key]),
      threshold,
    });
  };
  const ms = (v: number) => `${v.toFixed(2)} ms`;
  const rate = (v: number) => `${v.toFixed(0)} calls/s`;
  add(
    "structured output: JSON schema tokens/s ÷ unconstrained",
    "structured.tokens_per_s_ratio",
    (v) => v >= 0.8,
    "≥ 0.8x",
  );
  add(
    "structured output: answers that parse and validate (smollm2, 160 tokens)",
    "structured_parse.valid_rate",
    (v) => v >= 0.99,
    "≥ 99 %",
    (v) => `${(v * 100).toFixed(1)} %`,
  );
  add(
    "tool calls with the grammar: calls that parse and validate (smollm2)",
    "tool_calls.valid_rate",
    (v) => v === 1,
    "100 %",
    (v) => `${(v * 100).toFixed(1)} %`,
  );
  add("mnist-cnn b1 stdio: added p50", "small.stdio.added_p50_ms", (v) => v <= 1.0, "≤ 1.0 ms", ms);
  add("mnist-cnn b1 stdio: added p99", "small.stdio.added_p99_ms", (v) => v <= 3.0, "≤ 3 ms", ms);
  add("mnist-cnn b1 HTTP: added p50", "small.http.added_p50_ms", (v) => v <= 1.5, "≤ 1.5 ms", ms);
  add(
    "mnist-cnn 32 callers stdio",
    "small.stdio.calls_per_s",
    (v) => v >= 2500,
    "≥ 2,500 calls/s",
    rate,
  );
  add(
    "mnist-cnn 32 callers HTTP",
    "small.http.calls_per_s",
    (v) => v >= 1500,
    "≥ 1,500 calls/s",
    rate,
  );
  add(
    "MiniLM batch-1 stdio MCP p50 vs direct",
    "overhead.b1.stdio_ratio_p50",
    (v) => v <= 1.1,
    "≤ 1.10×",
  );
  add(
    "MiniLM batch-32 stdio MCP p50 vs direct",
    "overhead.b32.stdio_ratio_p50",
    (v) => v <= 1.03,
    "≤ 1.03×",
  );
  for (const level of ["worker", "mcp-stdio"]) {
    add(
      `32 callers (${level}): batching on/off throughput`,
      `concurrency.${level}.throughput_ratio`,
      (v) => v >= 1.2,
      "≥ 1.2×",
    );
    add(
      `32 callers (${level}): batching on/off p99`,
      `concurrency.${level}.p99_ratio`,
      (v) => v <= 1.0,
      "≤ 1.0× (no worse)",
    );
  }
  add(
    "pipe 16 MiB round trip",
    `payload.pipe.${16 << 20}.mbps`,
    (v) => v >= 500,
    "≥ 500 MB/s",
    (v) => `${v.toFixed(0)} MB/s`,
  );
  add(
    "start → tools/list",
    "coldstart.tools_list_s",
    (v) => v <= 0.5,
    "≤ 0.5 s",
    (v) => `${v.toFixed(2)} s`,
  );
  for (const p of ["server", "worker"]) {
    add(
      `${p} RSS growth over 10,000 calls`,
      `memory.${p}_rss_growth`,
      (v) => v <= 0.1,
      "≤ +10 %",
      (v) => `${(v * 100).toFixed(1)} %`,
    );
  }
  add(
    "pool: 2 workers × 1 thread vs 1 × 1 (16 callers, batch 1)",
    "pool.throughput_ratio",
    (v) => v >= 1.6,
    "≥ 1.6×",
  );
  add(
    "pool: remote TLS loopback vs local pipe p50 (batch 1)",
    "pool.remote_latency_ratio_p50",
    (v) => v <= 1.2,
    "≤ 1.2×",
  );
  add(
    "audit page views during MCP traffic (1M-record trail), p99",
    "audit.p99_ratio",
    (v) => v <= 1.2,
    "≤ 1.2× of the same traffic without views",
  );
  add(
    "budget: 8 concurrent under-estimated benchmarks, charged − limit",
    "budget.overrun_s",
    (v) => v <= 1,
    "≤ 1 s (one stop latency)",
    (v) => `${v.toFixed(3)} s`,
  );
  add(
    "demo agent's tools/list (HTTP)",
    "tokens.list.agent_http.bytes",
    (v) => v <= 12_000,
    "≤ 12,000 B (~3,000 tokens)",
    (v) => `${v.toLocaleString("en")} B`,
  );
  add(
    "generate: 8 MCP callers / 1 caller, tokens/s (tiny-gpt2, 32 new tokens)",
    "generate.concurrency_ratio",
    (v) => v >= 3,
    "≥ 3×",
  );
  add(
    "generate: sequential MCP time / HF generate batch 1",
    "generate.sequential_ratio",
    (v) => v <= 1.2,
    "≤ 1.2×",
  );
  // The TTFT target is the real model's: tiny-chat's prefill (2 layers, 64 wide) costs less than
  // a call's overhead, so reuse cannot halve its time to first token (printed, not judged).
  add(
    "prefix: TTFT with reuse / without, 8 callers (smollm2_135m_instruct)",
    "prefix.smollm2_135m_instruct.ttft_ratio",
    (v) => v <= 0.5,
    "≤ 0.5×",
  );
  for (const m of ["tiny_chat", "smollm2_135m_instruct"]) {
    add(
      `prefix: greedy outputs identical with and without reuse (${m})`,
      `prefix.${m}.identical`,
      (v) => v === 1,
      "= 1",
    );
  }
  add("shapes: recompiles after load", "shapes.recompiles_after_load", (v) => v === 0, "= 0");
  add("shapes: TTFT p99 / p50", "shapes.ttft_p99_over_p50", (v) => v <= 3, "≤ 3");
  add("shapes: time per token p99 / p50", "shapes.tpot_p99_over_p50", (v) => v <= 3, "≤ 3");
  add(
    "shapes: compiled / eager tokens/s, 8 callers",
    "shapes.compiled_over_eager_8",
    (v) => v >= 1,
    "≥ 1.0×",
  );
  return t;
}

async function main() {
  const started = new Date();
  const t0 = performance.now();
  const { config, catalog } = writeBenchConfig();
  const results: Record<string, SectionResult> = {};
  // The machine is shared: record how busy it was around each section, next to the figures.
  const load: Record<string, number[]> = { start: loadavg() };
  const say = (msg: string) =>
    process.stderr.write(`[bench ${((performance.now() - t0) / 1000).toFixed(0)}s] ${msg}\n`);

  // Cold start first, while nothing else of ours is running.
  if (want("coldstart")) {
    say("cold start…");
    results.coldstart = await runColdStart({ config, reps: q(3, 1) });
  }

  if (want("decompose")) {
    say("decomposition of one mnist-cnn call (traced) beside the SDK floor…");
    results.decompose = await runDecompose({
      config,
      catalog,
      model: "mnist-cnn",
      calls: q(400, 60),
      warmup: q(30, 10),
    });
  }

  const needServers =
    want("small") || want("overhead") || want("concurrency") || want("payload") || want("memory");
  let stdio: McpServer | undefined;
  let http: McpServer | undefined;
  let direct: DirectPython | undefined;
  let baseline: McpServer | undefined;
  try {
    if (needServers) {
      say("starting tpu-mcp stdio, tpu-mcp http and the direct Python baseline…");
      [stdio, http, direct] = await Promise.all([
        startStdio(config),
        want("overhead") || want("small") ? startHttp(config) : Promise.resolve(undefined),
        want("overhead") ? DirectPython.start(catalog, MODEL) : Promise.resolve(undefined),
      ]);
      const stdioWorker = await workerPid(stdio);
      await stdio.call("load_model", { model: MODEL });
      if (http) await http.call("load_model", { model: MODEL });
      if (want("concurrency") || want("overhead"))
        await stdio.call("load_model", { model: MODEL_NOBATCH });
      if (want("payload") || want("memory") || want("small"))
        await stdio.call("load_model", { model: "mnist-cnn" });
      if (want("small")) {
        await http!.call("load_model", { model: "mnist-cnn" });
        // BENCH_BASELINE=<another checkout>: its stdio server as a fourth side (same config
        // minus keys it may not know), e.g. the previous commit, so a change is measured side
        // by side rather than against numbers from another day.
        const base = process.env.BENCH_BASELINE;
        if (base) {
          const { config: baseConfig } = writeBenchConfig();
          const c = JSON.parse(readFileSync(baseConfig, "utf8"));
          delete c.trace_calls;
          writeFileSync(baseConfig, JSON.stringify(c));
          baseline = await startStdio(baseConfig, join(base, "bin", "tpu-mcp.js"));
          await baseline.call("load_model", { model: "mnist-cnn" });
        }
        say(
          "small calls: mnist-cnn batch 1 latency and 32-caller throughput, stdio / http / direct…",
        );
        results.small = await runSmall({
          stdio,
          http: http!,
          baseline,
          catalog,
          model: "mnist-cnn",
          calls: q(300, 40),
          warmup: q(30, 5),
          callers: 32,
          throughputCalls: q(2000, 300),
          rounds: q(3, 1),
        });
        await http!.call("unload_model", { model: "mnist-cnn" });
        await baseline?.close();
        baseline = undefined;
      }

      if (want("overhead")) {
        // Tracing's sides: the build without it, and this build exporting spans to a sink.
        say("overhead: starting the build without tracing and a traced stdio server…");
        const untraced = baselineCheckout();
        const sink = await otlpSink();
        const [untracedBuild, traced] = await Promise.all([
          startStdio(config, join(untraced.dir, "bin", "tpu-mcp.js")),
          startStdio(config, undefined, {
            OTEL_EXPORTER_OTLP_ENDPOINT: sink.url,
            OTEL_SERVICE_NAME: "tpu-mcp-bench",
          }),
        ]);
        await Promise.all([
          untracedBuild.call("load_model", { model: MODEL }),
          traced.call("load_model", { model: MODEL }),
        ]);
        say("overhead (stdio / http / direct / tracing off, on and absent, interleaved)…");
        try {
          results.overhead = await runOverhead({
            tracing: { untracedBuild, traced, ref: untraced.ref },
            stdio,
            http: http!,
            direct: direct!,
            catalog,
            iterations: { 1: q(200, 30), 32: q(40, 8) },
            budgetS: { 1: q(60, 15), 32: q(75, 15) },
            warmup: q(10, 3),
          });
        } finally {
          await Promise.allSettled([untracedBuild.close(), traced.close()]);
          say(`overhead: the traced server exported ${sink.posts()} OTLP batches`);
          await sink.close();
        }
      }
      // The HTTP server and the baseline are done: stop them so they cost nothing later.
      await Promise.all([http?.close(), direct?.close()]);
      http = direct = undefined;
      if (want("concurrency")) {
        say("concurrency (batching on / off)…");
        results.concurrency = await runConcurrency({
          catalog,
          mcp: stdio,
          callers: 32,
          perRound: q(320, 64),
          rounds: q(4, 2),
        });
      }
      if (want("payload")) {
        say("payload…");
        results.payload = await runPayload({
          catalog,
          mcp: stdio,
          reps: (bytes) => (quick ? 3 : bytes >= 8 << 20 ? 8 : bytes >= 512 << 10 ? 20 : 50),
        });
      }
      if (want("memory")) {
        say("memory (10,000 calls)…");
        results.memory = await runMemory({
          mcp: stdio,
          workerPid: stdioWorker,
          calls: q(10_000, 1_000),
          callers: 16,
          warmup: q(500, 100),
        });
      }
    }
  } finally {
    await Promise.allSettled([stdio?.close(), http?.close(), direct?.close(), baseline?.close()]);
  }

  // The pool last: it runs its own workers (and a remote one), none of the servers above.
  if (want("pool")) {
    say("pool (2 workers vs 1, remote TLS vs local pipe)…");
    results.pool = await runPool({
      catalog,
      callers: 16,
      perRound: q(320, 64),
      rounds: q(4, 2),
      latencyCalls: q(100, 20),
    });
  }

  // Its own server and a fresh data dir: a trail of a million records nobody else writes to.
  if (want("audit")) {
    say("audit (page views beside MCP traffic over a 1M-record trail)…");
    results.audit = await runAudit({
      config: writeBenchConfig().config,
      records: q(1_000_000, 100_000),
      callers: 8,
      perRound: q(2000, 300),
      rounds: q(4, 2),
      viewGapMs: 500,
      say,
    });
  }

  // What the tool surface costs an agent's context; BENCH_BASELINE's lists side by side.
  if (want("tokens")) {
    say("tokens (tools/list per demo principal, a typical result of each tool)…");
    const base = process.env.BENCH_BASELINE;
    results.tokens = await runTokens({
      baselineCli: base ? join(base, "bin", "tpu-mcp.js") : undefined,
      say,
    });
  }

  // A budget is a cap: 8 concurrent under-estimated benchmarks, charged against the limit.
  if (want("budget")) {
    say("budget (8 concurrent benchmarks at ≥ 2.5× their estimate against 3.5 estimates)…");
    results.budget = await runBudget();
  }

  // The shared store's cost per call: Postgres admission and audit against SQLite (issue 30).
  if (want("store")) {
    say(
      "store (budget admission and audit append: SQLite and a local Postgres, 1 and 3 replicas)…",
    );
    results.store = await runStore({ calls: q(2000, 300) });
  }

  // Calls per second through HAProxy with 1 and 3 replicas on one machine (issue 30).
  if (want("replicas")) {
    say(
      "replicas (the shared store per call: admission and run_inference on Postgres against SQLite; calls/s through HAProxy with 1 and 3 replicas on Postgres)…",
    );
    results.replicas = await runReplicas({
      rounds: q(5, 2),
      callers: 8,
      per: q(40, 10),
      calls: q(200, 60),
    });
  }

  // Estimates against what the gate charged, on a fresh and on a warm data dir of their own.
  if (want("estimates")) {
    say("estimates (a corpus of real calls, fresh data dir then warm)…");
    results.estimates = await runEstimates({ say });
  }

  // Generation on its own server, after the others: 8 callers and HF generate side by side.
  if (want("generate")) {
    say("generate (8 MCP callers vs 1, HF generate batch 8 and one prompt at a time, direct)…");
    const { config: genConfig, catalog: genCatalog } = writeBenchConfig();
    const server = await startStdio(genConfig);
    try {
      results.generate = await runGenerate({
        mcp: server,
        catalog: genCatalog,
        model: "tiny-gpt2",
        callers: 8,
        newTokens: 32,
        perCaller: q(4, 1),
        rounds: q(3, 1),
        say,
      });
    } finally {
      await server.close();
    }
  }

  if (want("train")) {
    say("train (run_benchmark work train_step: eager vs compile, float32 vs bfloat16 autocast)…");
    results.train = await runTrain({
      config: writeBenchConfig().config,
      model: "tiny-gpt2",
      seqLen: 32,
      batch: 4,
      iterations: q(30, 5),
      optimizer: "adamw",
      say,
    });
  }

  // A fine-tune on real text (issue 47): SmolLM2, float32 and bfloat16 side by side.
  if (want("fine_tune")) {
    say("fine_tune (run_benchmark work fine_tune: smollm2 on us-founding-texts, fp32 vs bf16)…");
    results.fine_tune = await runFineTune({
      config: writeBenchConfig().config,
      model: "smollm2-135m-instruct",
      dataset: "us-founding-texts",
      seqLen: 64,
      batch: 4,
      steps: q(200, 20),
      evalEvery: q(20, 5),
      learningRate: 1e-5,
      say,
    });
  }

  // Structured output on the real instruction model (issue 32): constrained vs not, one run.
  if (want("structured")) {
    say("structured (smollm2: JSON schema vs unconstrained tokens/s, grammar compile times)…");
    const server = await startStdio(writeBenchConfig().config);
    try {
      results.structured = await runStructured({
        mcp: server,
        callers: 8,
        rounds: q(4, 1),
        say,
      });
    } finally {
      await server.close();
    }
  }

  // Structured answers that parse, over a set of prompts and schemas (issue 44).
  if (want("structured_parse")) {
    say("structured_parse (smollm2: JSON-schema answers at 160 tokens that parse and validate)…");
    const server = await startStdio(writeBenchConfig().config);
    try {
      results.structured_parse = await runStructuredParse({
        mcp: server,
        callers: 8,
        limit: quick ? 16 : undefined,
        say,
      });
    } finally {
      await server.close();
    }
  }

  // Tool calls with and without the grammar, over a function-calling set (issue 46).
  if (want("tool_calls")) {
    say("tool_calls (smollm2: calls that validate, accuracy, with and without the grammar)…");
    const server = await startStdio(writeBenchConfig().config);
    try {
      results.tool_calls = await runToolCalls({
        mcp: server,
        // A quick run asks its 8 requests as one decode batch.
        callers: quick ? 8 : 4,
        limit: quick ? 8 : undefined,
        say,
      });
    } finally {
      await server.close();
    }
  }

  // The static decode loop and compile-once on a server of their own (issue 28).
  if (want("shapes")) {
    say("shapes (tiny-gpt2 compiled at load, a mixed trace of generations, compiled vs eager)…");
    const server = await startStdio(writeBenchConfig().config);
    try {
      results.shapes = await runShapes({
        mcp: server,
        model: "tiny-gpt2",
        requests: Number(process.env.BENCH_SHAPES_REQUESTS ?? q(300, 60)),
        perCaller: q(2, 1),
        rounds: q(3, 1),
        say,
      });
    } finally {
      await server.close();
    }
  }

  // Prefix reuse against a twin without a prefix cache, on a server of its own (issue 32):
  // tiny-chat (a 200-token system prompt: its 256 positions hold no more) and SmolLM2 (400).
  if (want("prefix")) {
    say("prefix (8 callers behind one long system prompt, prefix cache on vs off)…");
    const { config, catalog } = writeBenchConfig();
    const models: Record<string, number> = { "tiny-chat": 200 };
    if (process.env.BENCH_PREFIX_SMOLLM2 !== "0") models["smollm2-135m-instruct"] = 400;
    writePrefixCatalog(catalog, { "tiny-chat": 240, "smollm2-135m-instruct": 1024 });
    const server = await startStdio(config);
    try {
      results.prefix = await runPrefix({
        mcp: server,
        models,
        callers: 8,
        rounds: q(3, 1),
        maxNewTokens: 16,
        say,
      });
    } finally {
      await server.close();
    }
  }

  // Last: it loads the machine on purpose (CPU burners), which would disturb every other section.
  if (want("stability")) {
    say("stability (one model quiet, then under CPU burners: MAD, p50 interval, verdict)…");
    results.stability = await runStability({
      config: writeBenchConfig().config,
      model: MODEL,
      seqLen: 32,
      batchSizes: [1, 4],
      iterations: q(40, 10),
      burnersPerCpu: 2,
      rampS: q(60, 20),
      say,
    });
  }

  load.end = loadavg();
  const rows = Object.values(results).flatMap((r) => r.rows);
  const figures = Object.assign({}, ...Object.values(results).map((r) => r.figures)) as Record<
    string,
    number
  >;
  const notes = Object.values(results).flatMap((r) => r.notes ?? []);
  const verdicts = targets(figures);
  const elapsed = (performance.now() - t0) / 1000;

  const out: string[] = [];
  const la = (x: number[]) => x.map((v) => v.toFixed(2)).join(" ");
  out.push(
    `tpu-mcp bench — ${started.toISOString()} — ${cpus().length} CPUs — load average ${la(load.start)} at start, ${la(load.end)} at end` +
      (quick ? " — QUICK (smoke) run" : ""),
  );
  out.push("");
  out.push(renderTable(rows));
  out.push("");
  out.push("targets");
  for (const v of verdicts)
    out.push(`  ${v.pass ? "PASS" : "MISS"}  ${v.name} ${v.threshold}: ${v.figure}`);
  if (notes.length) {
    out.push("");
    out.push("notes");
    for (const n of notes) out.push(`  - ${n}`);
  }
  out.push("");
  out.push(`total ${elapsed.toFixed(0)} s`);
  process.stdout.write(out.join("\n") + "\n");

  const dir = join(ROOT, "bench", "results");
  mkdirSync(dir, { recursive: true });
  // The command that produced these figures, so a reader can regenerate and compare them.
  const envUsed = ["BENCH_ONLY", "BENCH_QUICK", "BENCH_BASELINE"]
    .filter((k) => process.env[k])
    .map((k) => `${k}=${process.env[k]}`);
  const command = [
    ...envUsed,
    process.env.npm_lifecycle_event === "bench" ? "npm run bench" : "npx tsx bench/run.ts",
  ].join(" ");
  const report = {
    command,
    started_at: started.toISOString(),
    elapsed_s: elapsed,
    quick,
    sections: Object.keys(results),
    machine: {
      cpus: cpus().length,
      cpu_model: cpus()[0]?.model,
      loadavg: load,
      node: process.version,
    },
    figures,
    targets: verdicts,
    rows,
    notes,
  };
  const text = JSON.stringify(report, null, 2) + "\n";
  // One file per run (kept, for comparisons) plus latest.json; both gitignored.
  const dated = `bench-${started.toISOString().replace(/[:.]/g, "-")}.json`;
  writeFileSync(join(dir, dated), text);
  writeFileSync(join(dir, "latest.json"), text);
  say(`wrote bench/results/${dated} and bench/results/latest.json (${command})`);
  // The estimate corpus case by case, shaped as its reference (bench/reference/estimates.json).
  if (results.estimates?.data) {
    const ref = {
      command,
      started_at: report.started_at,
      machine: report.machine,
      figures: results.estimates.figures,
      notes: results.estimates.notes,
      ...results.estimates.data,
    };
    writeFileSync(join(dir, "estimates.json"), JSON.stringify(ref, null, 2) + "\n");
    say("wrote bench/results/estimates.json (copy to bench/reference/ to update the reference)");
  }
}

main().catch((e) => {
  process.stderr.write(
    `bench failed: ${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`,
  );
  process.exitCode = 1;
});
