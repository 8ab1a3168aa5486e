// 3. Payload: tensor bytes per second.
//  - pipe: WorkerRuntime ⇄ the worker's frame server (bench/pipe_echo.py: real tpu_worker
//    Server + codecs, an echo op) — exact sizes 4 KiB … 16 MiB each way. MB/s counts the bytes
//    that crossed the pipe (request + reply tensors) over the round-trip time.
//  - worker-ingest: the real worker reading the same tensor attached to a `status` request (it
//    decodes and then ignores it; the reply is small): the one-way client → worker rate.
//  - mcp: run_inference on mnist-cnn with data_b64 through `tpu-mcp stdio`, next to the same
//    infer through WorkerRuntime (so the MCP/base64/JSON cost is separable from the forward).
//    mnist-cnn takes [N,1,28,28] with N ≤ 256, so the largest MCP payload is 784 KiB.
import { spawn } from "node:child_process";
import { join } from "node:path";
import { WorkerRuntime } from "../runtime/client.js";
import type { TensorData } from "../runtime/types.js";
import { quietLogger } from "./concurrency.js";
import { PYTHON, ROOT, type McpServer } from "./lib/procs.js";
import { section, type SectionResult } from "./lib/report.js";
import { fmt, median } from "./lib/stats.js";
import { workerThreads } from "../server/app/build_runtime.js";

export interface PayloadOptions {
  catalog: string;
  mcp: McpServer; // mnist-cnn loaded
  reps: (bytes: number) => number;
}

const SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20];
const MB = 1e6;

function f32Tensor(bytes: number, shape?: number[]): TensorData {
  const n = bytes / 4;
  const data = Buffer.alloc(bytes);
  const view = new Float32Array(data.buffer, data.byteOffset, n);
  for (let i = 0; i < n; i++) view[i] = ((i * 2654435761) % 1000) / 1000; // finite, non-trivial
  return { dtype: "float32", shape: shape ?? [n], data };
}

async function timeReps(reps: number, fn: () => Promise<void>): Promise<number[]> {
  await fn(); // warm-up
  const out: number[] = [];
  for (let i = 0; i < reps; i++) {
    const t0 = performance.now();
    await fn();
    out.push((performance.now() - t0) / 1000);
  }
  return out;
}

function runtime(catalog: string, echo: boolean): WorkerRuntime {
  return new WorkerRuntime({
    repoRoot: ROOT,
    pythonPath: PYTHON,
    catalogPath: catalog,
    device: "cpu",
    // The thread count the server gives its worker (server/app/build_runtime.ts), as on the MCP sides.
    extraArgs: ["--threads", String(workerThreads(0))],
    logger: quietLogger,
    // The echo server keeps WorkerRuntime's spawn (env, pipes, supervision) and swaps the program.
    ...(echo
      ? { spawn: (cmd, _args, opts) => spawn(cmd, [join(ROOT, "bench", "pipe_echo.py")], opts) }
      : {}),
  });
}

export async function runPayload(o: PayloadOptions): Promise<SectionResult> {
  const s = section("payload");
  const echo = runtime(o.catalog, true);
  const worker = runtime(o.catalog, false);
  try {
    await Promise.all([echo.start(), worker.start()]);
    await worker.call("load", { model: "mnist-cnn" });
    for (const bytes of SIZES) {
      const t = f32Tensor(bytes);
      const echoS = median(
        await timeReps(o.reps(bytes), async () => {
          const r = await echo.call("echo", {}, { tensors: [t] });
          if (r.tensors[0]?.data.length !== bytes) throw new Error("echo returned the wrong size");
        }),
      );
      const ingestS = median(
        await timeReps(o.reps(bytes), async () => {
          await worker.call("status", {}, { tensors: [t] });
        }),
      );
      const rt = (2 * bytes) / MB / echoS;
      const ing = bytes / MB / ingestS;
      s.row(
        `pipe round trip ${fmt.bytes(bytes)}`,
        fmt.mbps(rt),
        `${fmt.ms(echoS * 1000)} per echo (median)`,
      );
      s.row(
        `worker ingest ${fmt.bytes(bytes)}`,
        fmt.mbps(ing),
        `${fmt.ms(ingestS * 1000)} per status+tensor`,
      );
      s.fig(`pipe.${bytes}.mbps`, rt);
      s.fig(`ingest.${bytes}.mbps`, ing);
    }

    // MCP: the nearest mnist batches to 4 KiB / 64 KiB / 1 MiB (one item is 3,136 bytes).
    for (const n of [1, 21, 256]) {
      const bytes = n * 784 * 4;
      const t = f32Tensor(bytes, [n, 1, 28, 28]);
      const b64 = t.data.toString("base64");
      const reps = o.reps(bytes);
      const times = { mcp: [] as number[], rt: [] as number[] };
      // Interleaved: MCP call, then the same infer through WorkerRuntime.
      for (let i = -1; i < reps; i++) {
        let t0 = performance.now();
        const r = await o.mcp.call("run_inference", {
          model: "mnist-cnn",
          tensors: [{ dtype: "float32", shape: t.shape, data_b64: b64 }],
        });
        const mcpS = (performance.now() - t0) / 1000;
        if (r.outputs[0].shape[0] !== n) throw new Error("mnist-cnn returned the wrong batch");
        t0 = performance.now();
        await worker.call("infer", { model: "mnist-cnn" }, { tensors: [t] });
        const rtS = (performance.now() - t0) / 1000;
        if (i >= 0) {
          times.mcp.push(mcpS);
          times.rt.push(rtS);
        }
      }
      const mcp = median(times.mcp);
      const direct = median(times.rt);
      s.row(
        `mcp data_b64 ${fmt.bytes(bytes)} (N=${n})`,
        fmt.mbps(bytes / MB / mcp),
        `${fmt.ms(mcp * 1000)} vs ${fmt.ms(direct * 1000)} via WorkerRuntime (${fmt.x(mcp / direct)})`,
      );
      s.fig(`mcp.${bytes}.mbps`, bytes / MB / mcp);
      s.fig(`mcp.${bytes}.ratio_vs_runtime`, mcp / direct);
    }
    s.note(
      "MB = 10^6 bytes. pipe MB/s counts request + reply tensor bytes; mcp MB/s counts input bytes only (outputs are N×10 logits).",
    );
    s.note(
      "16 MiB through MCP is not possible with the built-in catalog: mnist-cnn limits.max_batch 256 caps the input at 784 KiB.",
    );
  } finally {
    await Promise.all([echo.close(), worker.close()]);
  }
  return s.result();
}
