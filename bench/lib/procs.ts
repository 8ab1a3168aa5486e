// Processes the bench drives: tpu-mcp servers (stdio / HTTP) with a bench config, the direct
// Python baseline, and /proc readings. Servers are started through the same helpers the e2e
// tests use (test/helpers/server.ts), so the bench measures what the tests exercise.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { workerThreads } from "../../server/app/build_runtime.js";
import {
  getDefaultEnvironment,
  StdioClientTransport,
} from "@modelcontextprotocol/sdk/client/stdio.js";
import {
  CLI,
  ROOT,
  connectHttp,
  errorOf,
  startHttpServer,
  writeConfig,
} from "../../test/helpers/server.js";

export { ROOT };
export const PYTHON = join(ROOT, ".venv", "bin", "python");
export const WORKER_PATH = join(ROOT, "runtime", "worker");
export const MODEL = "all-minilm-l6-v2";
/** Same weights as MODEL with dynamic batching off (catalog max_wait_ms 0). */
export const MODEL_NOBATCH = "all-minilm-l6-v2-nobatch";

export function tempDir(): string {
  return mkdtempSync(join(tmpdir(), "tpu-mcp-bench-"));
}

/**
 * The built-in catalog plus a no-batching twin of the embedding model, written to `dir` with
 * absolute model roots (the built-in one uses a path relative to its own file).
 */
export function writeBenchCatalog(dir: string): string {
  const src = join(ROOT, "runtime", "catalog.builtin.json");
  const cat = JSON.parse(readFileSync(src, "utf8"));
  cat.model_roots = cat.model_roots.map((r: string) => resolve(dirname(src), r));
  cat.dataset_roots = (cat.dataset_roots ?? []).map((r: string) => resolve(dirname(src), r));
  const base = cat.models.find((m: { id: string }) => m.id === MODEL);
  cat.models.push({
    ...base,
    id: MODEL_NOBATCH,
    description: `${base.description} (bench twin: dynamic batching off)`,
    batching: { max_batch: 1, max_wait_ms: 0 },
  });
  const file = join(dir, "catalog.json");
  writeFileSync(file, JSON.stringify(cat, null, 2));
  return file;
}

/** A server config whose rate limits and budgets cannot throttle the bench. */
export function writeBenchConfig(dir = tempDir()): { config: string; catalog: string } {
  const catalog = writeBenchCatalog(dir);
  const config = writeConfig(
    {
      log_level: "warn",
      // Stamps only calls that ask for them (bench/decompose.ts); the others pay nothing.
      trace_calls: true,
      // BENCH_THREADS: the worker's torch threads (default: the config's, one fewer than the cores).
      runtime: {
        python: PYTHON,
        catalog,
        device: "cpu",
        ...(process.env.BENCH_THREADS ? { threads: Number(process.env.BENCH_THREADS) } : {}),
      },
      policy: {
        // Not what is measured: without this the default rules would stop every run_benchmark
        // (the stability and train sections) at an approval no one is there to give.
        approvals: { rules: [] },
        limits: {
          rate_limit: { per_principal_per_minute: 100_000_000 },
          budget: { device_seconds_per_window: 1e9, window_s: 3600 },
          // 32 callers must queue at the gate rather than be refused `busy`.
          queue_bound: { run_inference: 256 },
          // A compiled load warms every shape of its plan: on the loaded 2-core development VM
          // (load 13–17) tiny-gpt2's took more than the default 900 s (2026-12-03).
          call_timeout_s: { load_model: 3600 },
        },
      },
    },
    dir,
  );
  return { config, catalog };
}

export interface McpServer {
  kind: "stdio" | "http";
  client: Client;
  /** Pid of the tpu-mcp server process. */
  pid: number;
  call(name: string, args: Record<string, unknown>): Promise<any>;
  close(): Promise<void>;
}

function wrap(
  kind: McpServer["kind"],
  client: Client,
  pid: number,
  close: () => Promise<void>,
): McpServer {
  return {
    kind,
    client,
    pid,
    async call(name, args) {
      const r = await client.callTool({ name, arguments: args }, undefined, { timeout: 600_000 });
      if (r.isError) {
        const e = errorOf(r);
        throw new Error(
          `${name} failed: ${e?.code ?? "?"}: ${e?.message ?? JSON.stringify(r.content)}`,
        );
      }
      return r.structuredContent;
    },
    close,
  };
}

/**
 * Spawns `tpu-mcp stdio` and connects; the stderr tail is kept for error messages. `cli` may name
 * another checkout's bin/tpu-mcp.js (BENCH_BASELINE: the previous commit, side by side).
 */
export async function startStdio(
  config: string,
  cli: string = CLI,
  /** Added to the server's environment (e.g. the OTEL_* variables of a traced side). */
  env?: Record<string, string>,
): Promise<McpServer> {
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: [cli, "stdio", "--config", config],
    cwd: dirname(dirname(cli)),
    stderr: "pipe",
    ...(env ? { env: { ...getDefaultEnvironment(), ...env } } : {}),
  });
  let tail = "";
  // Drain stderr: an unread pipe would eventually block the server's logging.
  transport.stderr?.on("data", (d: Buffer) => (tail = (tail + d.toString()).slice(-4000)));
  const client = new Client({ name: "tpu-mcp-bench", version: "0.0.0" });
  try {
    await client.connect(transport);
  } catch (e) {
    throw new Error(`tpu-mcp stdio did not start: ${(e as Error).message}\n${tail}`);
  }
  return wrap("stdio", client, transport.pid!, () => client.close());
}

export async function startHttp(config: string): Promise<McpServer> {
  const srv = await startHttpServer(config);
  const { client, close } = await connectHttp(srv.url, srv.token);
  return wrap("http", client, srv.proc.pid!, async () => {
    await close();
    await srv.stop();
  });
}

/** Waits until get_runtime_status says the worker is ready; returns its pid. */
export async function workerPid(s: McpServer): Promise<number> {
  for (;;) {
    const st = await s.call("get_runtime_status", {});
    if (st.worker.state === "ready" && st.worker.pid) return st.worker.pid;
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** CPU time (user + system) a process has used so far, in ms (Linux /proc; "self": this one). */
export function cpuMs(pid: number | "self"): number {
  // Fields after the command name: state is the 1st, utime the 12th, stime the 13th (clock ticks).
  const f = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1].split(" ");
  return ((Number(f[11]) + Number(f[12])) * 1000) / CLOCK_TICKS;
}
/** USER_HZ: 100 on every Linux configuration Node supports. */
const CLOCK_TICKS = 100;

/** VmRSS of a process in bytes (Linux /proc). */
export function rssBytes(pid: number): number {
  const m = /VmRSS:\s+(\d+)\s+kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  if (!m) throw new Error(`no VmRSS for pid ${pid}`);
  return Number(m[1]) * 1024;
}

/**
 * The direct-PyTorch baseline (bench/direct.py): one long-lived Python process with the model
 * loaded through the worker's own adapter; each request returns its own in-process timings.
 */
export class DirectPython {
  private readonly proc: ChildProcess;
  private readonly lines: AsyncIterator<string>;
  private stderr = "";

  private constructor(proc: ChildProcess) {
    this.proc = proc;
    this.lines = createInterface({ input: proc.stdout! })[Symbol.asyncIterator]();
    proc.stderr!.on(
      "data",
      (d: Buffer) => (this.stderr = (this.stderr + d.toString()).slice(-4000)),
    );
  }

  static async start(catalog: string, model: string): Promise<DirectPython> {
    const proc = spawn(PYTHON, [join(ROOT, "bench", "direct.py"), catalog, model], {
      cwd: ROOT,
      // The same torch thread count as the server's worker (server/app/build_runtime.ts), so the direct
      // side differs from the worker only by what the server adds.
      env: {
        ...process.env,
        PYTHONPATH: WORKER_PATH,
        BENCH_TORCH_THREADS: process.env.BENCH_TORCH_THREADS ?? String(workerThreads(0)),
      },
      stdio: ["pipe", "pipe", "pipe"],
    });
    const d = new DirectPython(proc);
    await d.next(); // {"ready": true} once the model is loaded
    return d;
  }

  private async next(): Promise<any> {
    const r = await this.lines.next();
    if (r.done) throw new Error(`direct.py exited:\n${this.stderr}`);
    return JSON.parse(r.value);
  }

  async request(cmd: Record<string, unknown>): Promise<any> {
    this.proc.stdin!.write(JSON.stringify(cmd) + "\n");
    const reply = await this.next();
    if (reply.error) throw new Error(`direct.py: ${reply.error}`);
    return reply;
  }

  /** Wall-clock ms of `n` back-to-back prepare+forward calls, measured inside Python. */
  async infer(texts: string[], n = 1): Promise<number[]> {
    return (await this.request({ op: "infer", texts, n })).ms;
  }

  /** The same for a tensor model: a float32 tensor of `shape` filled from `values`. */
  async inferTensor(shape: number[], values: number[], n = 1): Promise<number[]> {
    return (await this.request({ op: "infer", shape, values, n })).ms;
  }

  close(): Promise<void> {
    return new Promise((r) => {
      if (this.proc.exitCode !== null) return r();
      this.proc.once("exit", () => r());
      this.proc.stdin!.end();
    });
  }
}

/** Deterministic English-like sentences of varied length (same inputs on every side). */
export function sentences(n: number, seed = 1): string[] {
  const words =
    "the model maps each sentence to a vector so that similar meanings land close together in the embedding space while unrelated text stays far apart".split(
      " ",
    );
  let s = seed;
  const rnd = () => (s = (s * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
  return Array.from({ length: n }, () => {
    const len = 8 + Math.floor(rnd() * 12);
    return Array.from({ length: len }, () => words[Math.floor(rnd() * words.length)]).join(" ");
  });
}
