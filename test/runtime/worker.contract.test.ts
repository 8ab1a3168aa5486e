// Contract tests: the TypeScript client against the REAL Python worker and real torch on the
// CPU. Nothing here mocks the worker; faults are injected the way they happen in production
// (raw bytes on its stdin, kill -9, SIGSTOP).
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { encodeFrame, tensorFrom, tensorView } from "../../runtime/wire/framing.js";
import { WorkerPool } from "../../runtime/pool/pool.js";
import { RuntimeCallError, type TensorData } from "../../runtime/types.js";
import { parseConfig } from "../../server/config/config.js";
import { MIN_SEQ_LEN } from "../../tools/run_benchmark.js";
import { alive, cpuRuntime, recordingSpawn, repoRoot, waitFor } from "./helpers.js";
import { scaled } from "../helpers/calibrate.js";

async function rejection(p: Promise<unknown>): Promise<RuntimeCallError> {
  try {
    await p;
  } catch (e) {
    expect(e).toBeInstanceOf(RuntimeCallError);
    return e as RuntimeCallError;
  }
  throw new Error("expected a rejection");
}

/** Deterministic pseudo-random MNIST-shaped input, different for each seed. */
function mnistInput(batch: number, seed: number): TensorData {
  const v = new Float32Array(batch * 28 * 28);
  let x = seed * 2654435761 + 1;
  for (let i = 0; i < v.length; i++) {
    x = (x * 1103515245 + 12345) % 2 ** 31;
    v[i] = x / 2 ** 31;
  }
  return tensorFrom("float32", [batch, 1, 28, 28], v);
}

/** The bounds the server sends with every benchmark: its config's, and its shortest sequence. */
const benchLimits = {
  ...parseConfig({}, { root: repoRoot }).benchmark,
  min_seq_len: MIN_SEQ_LEN,
};

/** A benchmark long enough to be interrupted (it is cancelled, killed or timed out), resolved
 * as the server resolves it (the v1 spelling `scenario: "forward"` names the work). */
const longBenchmark = {
  model: "mnist-cnn",
  batch_sizes: [1],
  dtypes: ["float32"],
  modes: ["eager"],
  scenario: "forward",
  duration_s: 60,
  warmup: 1,
  extend_factor: 1,
  limits: benchLimits,
};

describe("worker contract (real worker, CPU)", () => {
  const spawner = recordingSpawn();
  const rt = cpuRuntime({ spawn: spawner.spawn });
  // The model bookkeeping (loaded, lost) is the pool's, read from the worker's ended requests.
  const pool = WorkerPool.single(rt);
  const protocolErrors: Array<{ id: string | null; message: string; source: string }> = [];
  rt.on("protocol_error", (e) => protocolErrors.push(e));

  beforeAll(async () => {
    await rt.start();
  });
  afterAll(async () => {
    await rt.close();
  });

  it("is ready after a hello describing the CPU device", () => {
    expect(rt.state).toBe("ready");
    const hello = rt.hello!;
    expect(hello.protocol).toBe(1);
    expect(hello.device.kind).toBe("cpu");
    expect(hello.pid).toBe(rt.pid);
    expect(hello.torch_version).toMatch(/^\d+\.\d+/);
    expect(hello.probe.some((s) => s.backend === "cpu" && s.matched)).toBe(true);
  });

  it("describes the built-in catalog with parameter counts read from the weights", async () => {
    const { result } = await rt.call<{ models: Array<Record<string, unknown>> }>("describe", {});
    const byId = new Map(result.models.map((m) => [m.id, m]));
    for (const id of ["all-minilm-l6-v2", "tiny-gpt2", "mnist-cnn"]) {
      expect(byId.get(id)).toMatchObject({ id, available: true });
      expect(byId.get(id)!.parameters).toBeGreaterThan(0);
    }
  });

  it("loads all-minilm-l6-v2 and returns unit-norm float32 embeddings of shape [n, 384]", async () => {
    const load = await rt.call("load", { model: "all-minilm-l6-v2", dtype: "float32" });
    expect(load.result).toMatchObject({ model: "all-minilm-l6-v2", dtype: "float32" });
    expect(pool.loadedModels().map((m) => m.model)).toContain("all-minilm-l6-v2");
    const texts = [
      "The cat sits on the mat.",
      "A feline rests on a rug.",
      "Quarterly revenue grew by 4%.",
    ];
    const { result, tensors } = await rt.call("infer", { model: "all-minilm-l6-v2", texts });
    expect(result).toMatchObject({ task: "embedding", shape: [3, 384] });
    expect(tensors).toHaveLength(1);
    expect(tensors[0].dtype).toBe("float32");
    expect(tensors[0].shape).toEqual([3, 384]);
    const e = tensorView(tensors[0]) as Float32Array;
    const row = (i: number) => e.subarray(i * 384, (i + 1) * 384);
    const dot = (a: Float32Array, b: Float32Array) => a.reduce((s, x, i) => s + x * b[i], 0);
    for (let i = 0; i < 3; i++) expect(Math.sqrt(dot(row(i), row(i)))).toBeCloseTo(1, 3);
    // A real sentence model: paraphrases are closer than unrelated sentences.
    expect(dot(row(0), row(1))).toBeGreaterThan(dot(row(0), row(2)));
    const un = await rt.call("unload", { model: "all-minilm-l6-v2" });
    expect(un.result).toMatchObject({ model: "all-minilm-l6-v2" });
    expect(pool.loadedModels().map((m) => m.model)).not.toContain("all-minilm-l6-v2");
  });

  it("generates text with tiny-gpt2, deterministically", async () => {
    await rt.call("load", { model: "tiny-gpt2" });
    const args = {
      model: "tiny-gpt2",
      texts: ["Hello there", "Once upon a time"],
      max_new_tokens: 6,
    };
    const a = await rt.call<{ task: string; texts: string[]; new_tokens: number[] }>("infer", args);
    expect(a.result.task).toBe("text-generation");
    expect(a.result.texts).toHaveLength(2);
    for (const t of a.result.texts) expect(typeof t).toBe("string");
    expect(a.result.new_tokens).toHaveLength(2);
    for (const n of a.result.new_tokens) expect(n).toBeGreaterThan(0);
    for (const n of a.result.new_tokens) expect(n).toBeLessThanOrEqual(6);
    const b = await rt.call<{ texts: string[] }>("infer", args);
    expect(b.result.texts).toEqual(a.result.texts);
    await rt.call("unload", { model: "tiny-gpt2" });
  });

  it("an infer sent while its model loads waits for the load (a slow load handed off as a job)", async () => {
    const args = { model: "tiny-gpt2", texts: ["Hello there"], max_new_tokens: 4 };
    // Without a load in flight the worker answers model_not_loaded at once.
    const missing = await rt.call("infer", args).catch((e: unknown) => e);
    expect((missing as RuntimeCallError).code).toBe("model_not_loaded");
    const load = rt.call("load", { model: "tiny-gpt2" });
    const r = await rt.call<{ texts: string[] }>("infer", args);
    expect(r.result.texts).toHaveLength(1);
    await load;
    await rt.call("unload", { model: "tiny-gpt2" });
  });

  it("runs mnist-cnn on raw tensors: [N,1,28,28] in, [N,10] float32 out", async () => {
    await rt.call("load", { model: "mnist-cnn" });
    const { result, tensors } = await rt.call(
      "infer",
      { model: "mnist-cnn" },
      { tensors: [mnistInput(5, 1)] },
    );
    expect(result.task).toBe("tensor");
    expect(tensors).toHaveLength(1);
    expect(tensors[0].dtype).toBe("float32");
    expect(tensors[0].shape).toEqual([5, 10]);
    expect([...(tensorView(tensors[0]) as Float32Array)].every(Number.isFinite)).toBe(true);
  });

  it("answers 16 concurrent requests, each with its own correct output", async () => {
    const inputs = Array.from({ length: 16 }, (_, i) => mnistInput(1, 100 + i));
    const sequential: Float32Array[] = [];
    for (const t of inputs) {
      const r = await rt.call("infer", { model: "mnist-cnn" }, { tensors: [t] });
      sequential.push(Float32Array.from(tensorView(r.tensors[0]) as Float32Array));
    }
    const concurrent = await Promise.all(
      inputs.map((t) => rt.call("infer", { model: "mnist-cnn" }, { tensors: [t] })),
    );
    concurrent.forEach((r, i) => {
      expect(r.tensors[0].shape).toEqual([1, 10]);
      const got = tensorView(r.tensors[0]) as Float32Array;
      got.forEach((x, j) => expect(x).toBeCloseTo(sequential[i][j], 4));
    });
    // Outputs differ between inputs, so a mix-up would have been caught above.
    expect(sequential[0][0]).not.toBeCloseTo(sequential[1][0], 6);
    expect(rt.inFlight()).toBe(0);
  });

  it("cancels a running benchmark when the caller's signal aborts, keeping its partial result", async () => {
    const ac = new AbortController();
    let progressed = 0;
    const { result } = await rt.call<{ cancelled: boolean; configs: unknown[] }>(
      "benchmark",
      longBenchmark,
      {
        signal: ac.signal,
        onProgress: () => {
          progressed++;
          ac.abort();
        },
      },
    );
    // The worker stopped early (well before duration_s) and flagged the result as partial.
    expect(result.cancelled).toBe(true);
    expect(progressed).toBeGreaterThan(0);
    expect(rt.inFlight()).toBe(0);
    // The worker still serves.
    const status = await rt.call("status", {});
    expect(status.result.device).toBeTruthy();
    expect(rt.restarts()).toBe(0);
  });

  it("stops a running benchmark for the gate's reason, answering what it measured marked stopped", async () => {
    const ac = new AbortController();
    let timer: NodeJS.Timeout | undefined;
    const { result } = await rt.call<{
      cancelled: boolean;
      stopped?: string;
      configs: Array<{ iterations: number }>;
    }>("benchmark", longBenchmark, {
      signal: ac.signal,
      // The gate's stop: an abort whose reason carries `stop`, sent on as the cancel's reason.
      onProgress: () => {
        timer ??= setTimeout(() => ac.abort({ stop: "budget" }), 1500);
      },
    });
    clearTimeout(timer);
    // A result, not a cancellation: stopped, with what it measured (well before duration_s).
    expect(result.stopped).toBe("budget");
    expect(result.cancelled).toBe(false);
    expect(result.configs.length).toBeLessThanOrEqual(1);
    for (const c of result.configs) expect(c.iterations).toBeGreaterThan(0);
    expect(rt.inFlight()).toBe(0);
  });

  it("refuses a benchmark that is not fully resolved, naming the missing field", async () => {
    // The server resolves every default and bound (tools/run_benchmark.ts); the worker has none.
    const { warmup: _w, ...noWarmup } = longBenchmark;
    let err = await rejection(rt.call("benchmark", noWarmup));
    expect([err.code, err.message]).toEqual([
      "invalid_argument",
      expect.stringContaining("args.warmup"),
    ]);
    const { min_seq_len: _m, ...partial } = benchLimits;
    err = await rejection(rt.call("benchmark", { ...longBenchmark, limits: partial }));
    expect(err.message).toContain("args.limits.min_seq_len");
    err = await rejection(
      rt.call("benchmark", { ...longBenchmark, warmup: benchLimits.max_warmup + 1 }),
    );
    expect(err.message).toContain(`args.warmup must be an integer in 0..${benchLimits.max_warmup}`);
    expect(rt.restarts()).toBe(0);
  });

  it("rejects a call aborted before it reached the worker with `cancelled`", async () => {
    const ac = new AbortController();
    const call = rt.call(
      "infer",
      { model: "mnist-cnn" },
      { signal: ac.signal, tensors: [mnistInput(1, 3)] },
    );
    ac.abort(); // call() is still awaiting readiness: nothing is sent
    const err = await rejection(call);
    expect(err.code).toBe("cancelled");
    expect(rt.inFlight()).toBe(0);
  });

  it("rejects an aborted load with `cancelled` and keeps its view of loaded models true", async () => {
    const ac = new AbortController();
    const call = rt.call("load", { model: "all-minilm-l6-v2" }, { signal: ac.signal });
    await waitFor(() => rt.inFlight() === 1, 5_000, 1);
    ac.abort();
    const err = await rejection(call);
    expect(err.code).toBe("cancelled");
    // Whether the worker stopped the load or finished it first, the client agrees with it.
    await waitFor(() => rt.inFlight() === 0, 10_000);
    const { result } = await rt.call<{ loaded: Array<{ model: string }> }>("status", {});
    expect(
      pool
        .loadedModels()
        .map((m) => m.model)
        .sort(),
    ).toEqual(result.loaded.map((m) => m.model).sort());
    if (pool.loadedModels().some((m) => m.model === "all-minilm-l6-v2")) {
      await rt.call("unload", { model: "all-minilm-l6-v2" });
    }
  });

  it("fails a call that exceeds its timeout with `timeout`, and the worker keeps serving", async () => {
    const err = await rejection(rt.call("benchmark", longBenchmark, { timeoutMs: 1500 }));
    expect(err.code).toBe("timeout");
    expect(err.recoverable).toBe(true);
    const r = await rt.call("infer", { model: "mnist-cnn" }, { tensors: [mnistInput(1, 7)] });
    expect(r.tensors[0].shape).toEqual([1, 10]);
    expect(rt.restarts()).toBe(0);
  });

  it("answers a malformed frame written raw to stdin with protocol_error and keeps serving", async () => {
    const child = spawner.children.at(-1)!;
    const before = protocolErrors.length;
    // 1. A header that is not JSON: the worker cannot read an id and answers with id null.
    const junk = Buffer.from("{this is not json", "utf8");
    const prefix = Buffer.alloc(8);
    prefix.writeUInt32BE(junk.length, 0);
    child.stdin!.write(Buffer.concat([prefix, junk]));
    // 2. A request whose tensor lies outside the body: answered with the request's id.
    const [head] = encodeFrame({
      type: "request",
      id: "raw-1",
      op: "infer",
      args: { model: "mnist-cnn" },
    });
    const header = JSON.parse(head.subarray(8).toString());
    header.tensors = [{ dtype: "float32", shape: [1, 1, 28, 28], offset: 0, nbytes: 3136 }];
    const json = Buffer.from(JSON.stringify(header));
    const p2 = Buffer.alloc(8);
    p2.writeUInt32BE(json.length, 0);
    p2.writeUInt32BE(16, 4);
    child.stdin!.write(Buffer.concat([p2, json, Buffer.alloc(16)]));
    await waitFor(() => protocolErrors.length >= before + 2, 10_000);
    const got = protocolErrors.slice(before);
    expect(got.every((e) => e.source === "worker" && /protocol_error/.test(e.message))).toBe(true);
    expect(got.map((e) => e.id).sort()).toEqual([null, "raw-1"].sort());
    const { result } = await rt.call<{ models: unknown[] }>("describe", {});
    expect(result.models.length).toBeGreaterThan(0);
    expect(rt.restarts()).toBe(0);
  });

  it("passes worker errors through with their stable code", async () => {
    expect((await rejection(rt.call("infer", { model: "no-such-model" }))).code).toBe(
      "unknown_model",
    );
    expect((await rejection(rt.call("infer", { model: "tiny-gpt2", texts: ["x"] }))).code).toBe(
      "model_not_loaded",
    );
  });
});

describe("worker death and restart (real worker, CPU)", () => {
  it("rejects a call in flight with worker_died within 2 s of kill -9, then serves again after the restart", async () => {
    const rt = cpuRuntime({ restartBackoffBaseMs: 50 });
    const pool = WorkerPool.single(rt);
    const restarts: Array<{ lostModels: string[] }> = [];
    pool.on("restart", (i) => restarts.push(i));
    try {
      await rt.start();
      await rt.call("load", { model: "mnist-cnn" });
      const pid = rt.pid!;
      let killedAt = 0;
      const call = rt.call("benchmark", longBenchmark, {
        onProgress: () => {
          if (!killedAt) {
            killedAt = Date.now();
            process.kill(pid, "SIGKILL");
          }
        },
      });
      const err = await rejection(call);
      const elapsed = Date.now() - killedAt;
      expect(killedAt).toBeGreaterThan(0);
      expect(err.code).toBe("worker_died");
      expect(err.recoverable).toBe(true);
      expect(err.message).toMatch(/retry/i);
      expect(elapsed).toBeLessThan(scaled(2000));
      expect(pool.lostModels()).toEqual(["mnist-cnn"]);
      expect(restarts[0]?.lostModels).toEqual(["mnist-cnn"]);

      // The next call waits for the automatic restart and succeeds.
      const { result } = await rt.call("status", {});
      expect(result.device).toBeTruthy();
      expect(rt.restarts()).toBe(1);
      expect(rt.pid).not.toBe(pid);
      // Lost models are not reloaded behind the caller's back.
      const notLoaded = await rejection(
        rt.call("infer", { model: "mnist-cnn" }, { tensors: [mnistInput(1, 1)] }),
      );
      expect(notLoaded.code).toBe("model_not_loaded");
      expect(pool.lostModels()).toEqual(["mnist-cnn"]);
      // Loading it again clears the loss.
      await rt.call("load", { model: "mnist-cnn" });
      expect(pool.lostModels()).toEqual([]);
    } finally {
      await rt.close();
    }
  });

  it("kills and restarts a worker that stops answering heartbeats", async () => {
    const rt = cpuRuntime({
      heartbeatIntervalMs: 200,
      heartbeatTimeoutMs: 1000,
      restartBackoffBaseMs: 50,
    });
    const exits: Array<{ signal: string | null }> = [];
    rt.on("exit", (i) => exits.push(i));
    try {
      await rt.start();
      const pid = rt.pid!;
      process.kill(pid, "SIGSTOP"); // hung: alive, but silent
      await waitFor(() => exits.length > 0, 20_000);
      expect(exits[0].signal).toBe("SIGKILL");
      expect(alive(pid)).toBe(false);
      await rt.ready();
      expect(rt.pid).not.toBe(pid);
      expect((await rt.call("status", {})).result.device).toBeTruthy();
    } finally {
      await rt.close();
    }
  });

  it("after a call times out, kills a worker that does not answer the follow-up ping", async () => {
    // Periodic heartbeats off: only the timeout's own liveness probe can catch the hang.
    const rt = cpuRuntime({
      heartbeatIntervalMs: 0,
      heartbeatTimeoutMs: 1000,
      restartBackoffBaseMs: 50,
    });
    const exits: Array<{ signal: string | null }> = [];
    rt.on("exit", (i) => exits.push(i));
    try {
      await rt.start();
      const pid = rt.pid!;
      process.kill(pid, "SIGSTOP");
      const err = await rejection(rt.call("status", {}, { timeoutMs: 500 }));
      expect(err.code).toBe("timeout");
      await waitFor(() => exits.length > 0, 20_000);
      expect(exits[0].signal).toBe("SIGKILL");
      expect((await rt.call("status", {})).result.device).toBeTruthy();
      expect(rt.restarts()).toBe(1);
    } finally {
      await rt.close();
    }
  });

  it("starts by itself in eager mode, waits for the first call in lazy mode, and forwards worker logs", async () => {
    const lazy = cpuRuntime({ startMode: "lazy" });
    const eager = cpuRuntime({ startMode: "eager" });
    const lines: Array<{ level: string; msg: string }> = [];
    eager.on("log", (l) => lines.push(l));
    try {
      await waitFor(() => eager.state === "ready", 60_000);
      expect(lazy.state).toBe("stopped");
      // The worker's JSON stderr lines arrive as structured log events.
      expect(lines.some((l) => l.level === "info" && l.msg === "worker ready")).toBe(true);
      const { result } = await lazy.call("status", {}); // starts it
      expect(result.device).toBeTruthy();
      expect(lazy.state).toBe("ready");
    } finally {
      await Promise.all([lazy.close(), eager.close()]);
    }
  });

  it("close() ends the worker process: no orphans", async () => {
    const rt = cpuRuntime();
    await rt.start();
    const pid = rt.pid!;
    expect(alive(pid)).toBe(true);
    await rt.close();
    expect(rt.state).toBe("stopped");
    expect(alive(pid)).toBe(false);
  });
});

describe("worker start-up refusals (real worker, CPU)", () => {
  it("fails at once, without restarts, when the requested device does not exist", async () => {
    const rt = cpuRuntime({ device: "tpu" });
    try {
      const err = await rejection(rt.start());
      expect(err.code).toBe("worker_unavailable");
      expect(err.message).toMatch(/could not start \(unsupported_device/);
      expect(err.message).toMatch(/tpu-mcp doctor/);
      expect(rt.state).toBe("failed");
      expect(rt.restarts()).toBe(0);
      expect((await rejection(rt.call("status", {}))).code).toBe("worker_unavailable");
    } finally {
      await rt.close();
    }
  });

  it("fails at once when the catalog is rejected", async () => {
    const rt = cpuRuntime({ catalogPath: "runtime/no-such-catalog.json" });
    try {
      const err = await rejection(rt.start());
      expect(err.code).toBe("worker_unavailable");
      expect(err.message).toMatch(/catalog/);
      expect(rt.restarts()).toBe(0);
    } finally {
      await rt.close();
    }
  });
});
