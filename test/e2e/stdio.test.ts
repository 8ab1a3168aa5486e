// A real `tpu-mcp stdio` child process, the SDK's real Client, a real worker with torch on the CPU.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { spawn } from "node:child_process";
import { CLI, INITIALIZE, ROOT, connectStdio, errorOf, writeConfig } from "../helpers/server.js";
import { badInputs, call, coreJourney } from "./scenario.js";
import { scaled } from "../helpers/calibrate.js";

describe("tpu-mcp stdio", () => {
  let conn: Awaited<ReturnType<typeof connectStdio>>;
  beforeAll(async () => {
    conn = await connectStdio(writeConfig());
  });
  afterAll(async () => {
    await conn?.close();
  });

  it("serves list → load → infer → benchmark → unload with the real MiniLM", async () => {
    await coreJourney(conn.client);
  });

  it("refuses every bad input with its error code and keeps serving", async () => {
    await badInputs(conn.client);
  });

  it("follows a wait:false benchmark through get_job to its result", async () => {
    const started = await call(conn.client, "run_benchmark", {
      model: "mnist-cnn",
      batch_sizes: [1, 8],
      iterations: 10,
      warmup: 1,
      wait: false,
    });
    expect(started.isError, JSON.stringify(started)).toBeFalsy();
    const jobId = started.structuredContent.job_id;
    expect(jobId).toMatch(/^job_/);
    let job: any;
    for (let i = 0; i < 600; i++) {
      job = (await call(conn.client, "get_job", { job_id: jobId })).structuredContent;
      if (job.status !== "running") break;
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(job.status).toBe("succeeded");
    expect(job.result.configs).toHaveLength(2);
    expect(job.result.report_id).toMatch(/^bench_/);
  });

  it("cancels a running wait:false benchmark and keeps the finished part", async () => {
    const started = await call(conn.client, "run_benchmark", {
      model: "all-minilm-l6-v2",
      batch_sizes: [1, 2, 4, 8],
      seq_lens: [32],
      duration_s: 3,
      warmup: 1,
      wait: false,
    });
    const jobId = started.structuredContent.job_id;
    // Let it finish at least its first configuration (up to 4 x 3 s when its series is extended).
    const firstDone = Date.now() + scaled(60_000);
    for (;;) {
      const j = (await call(conn.client, "get_job", { job_id: jobId })).structuredContent;
      if ((j.progress ?? 0) >= 1 || j.status !== "running") break;
      expect(Date.now(), "the first configuration never finished").toBeLessThan(firstDone);
      await new Promise((r) => setTimeout(r, 100));
    }
    const cancelled = await call(conn.client, "cancel_job", { job_id: jobId });
    expect(cancelled.isError, JSON.stringify(cancelled)).toBeFalsy();
    let job: any = cancelled.structuredContent;
    const stopped = Date.now() + scaled(30_000);
    while (job.status === "running" && Date.now() < stopped) {
      await new Promise((r) => setTimeout(r, 100));
      job = (await call(conn.client, "get_job", { job_id: jobId })).structuredContent;
    }
    expect(job.status).toBe("cancelled");
    expect(job.result?.cancelled).toBe(true);
    expect(job.result.configs.length).toBeGreaterThanOrEqual(1);
    expect(job.result.configs.length).toBeLessThan(4);
    // The device is free again: a new call runs.
    const st = await call(conn.client, "get_runtime_status", {});
    expect(st.isError).toBeFalsy();
    expect(st.structuredContent.jobs_running).toBe(0);
  });

  it("sends progress notifications and runs tensor models on raw bytes", async () => {
    const progress: number[] = [];
    const r = await conn.client.callTool(
      {
        name: "run_benchmark",
        arguments: { model: "mnist-cnn", batch_sizes: [1, 2], iterations: 3, warmup: 0 },
      },
      undefined,
      { onprogress: (p) => progress.push(p.progress), timeout: scaled(120_000) },
    );
    expect(r.isError).toBeFalsy();
    expect(progress.length).toBeGreaterThanOrEqual(2);

    await call(conn.client, "load_model", { model: "mnist-cnn" });
    const x = new Float32Array(2 * 28 * 28).map((_, i) => (i % 7) / 7);
    const inf = await call(conn.client, "run_inference", {
      model: "mnist-cnn",
      tensors: [
        {
          dtype: "float32",
          shape: [2, 1, 28, 28],
          data_b64: Buffer.from(x.buffer).toString("base64"),
        },
      ],
    });
    expect(inf.isError, JSON.stringify(inf)).toBeFalsy();
    expect(inf.structuredContent.outputs[0].shape).toEqual([2, 10]);
    expect(inf.structuredContent.outputs[0].data).toHaveLength(20);
    const again = await call(conn.client, "load_model", { model: "mnist-cnn" });
    expect(errorOf(again)?.code).toBe("model_already_loaded");
    await call(conn.client, "unload_model", { model: "mnist-cnn" });
  });

  it("summarises a large output and links the full tensor as a resource", async () => {
    await call(conn.client, "load_model", { model: "all-minilm-l6-v2" });
    const texts = Array.from({ length: 20 }, (_, i) => `sentence number ${i}`);
    const r = await call(conn.client, "run_inference", { model: "all-minilm-l6-v2", texts });
    expect(r.isError, JSON.stringify(r).slice(0, 500)).toBeFalsy();
    const out = r.structuredContent.outputs[0];
    expect(out.shape).toEqual([20, 384]);
    expect(out.data).toBeUndefined();
    expect(out.summary.elements).toBe(7680);
    expect(out.resource_uri).toMatch(/^tpu:\/\/outputs\/out_[0-9a-f]{24}\/0$/);
    expect(
      r.content.some((c: any) => c.type === "resource_link" && c.uri === out.resource_uri),
    ).toBe(true);
    const res = await conn.client.readResource({ uri: out.resource_uri });
    const body = JSON.parse((res.contents[0] as any).text);
    const values = new Float32Array(Buffer.from(body.data_b64, "base64").buffer.slice(0));
    expect(body.shape).toEqual([20, 384]);
    expect(values.length).toBe(7680);
    expect(values[0]).toBeCloseTo(out.summary.first[0], 6);
    await call(conn.client, "unload_model", { model: "all-minilm-l6-v2" });
  });

  it("serves the catalog as tpu://models without paths", async () => {
    const res = await conn.client.readResource({ uri: "tpu://models" });
    const text = (res.contents[0] as any).text as string;
    expect(JSON.parse(text).models.map((m: any) => m.id)).toContain("tiny-gpt2");
    expect(text).not.toMatch(/source|\/work\/|\.data\//);
  });

  it("cancels a call when the client aborts it (notifications/cancelled) and frees the device", async () => {
    const ctrl = new AbortController();
    const pending = conn.client.callTool(
      {
        name: "run_benchmark",
        arguments: {
          model: "all-minilm-l6-v2",
          batch_sizes: [1],
          seq_lens: [64],
          duration_s: 60,
          warmup: 0,
        },
      },
      undefined,
      { signal: ctrl.signal, timeout: scaled(120_000) },
    );
    await new Promise((r) => setTimeout(r, 1500));
    ctrl.abort();
    await expect(pending).rejects.toThrow();
    // The cancel reached the worker: the 60 s benchmark is no longer in flight there (the only
    // request in flight is the status call itself), and the device takes new work.
    let inFlight = Infinity;
    for (let i = 0; i < 100 && inFlight > 1; i++) {
      inFlight = (await call(conn.client, "get_runtime_status", {})).structuredContent.worker
        .in_flight;
      if (inFlight > 1) await new Promise((r) => setTimeout(r, 100));
    }
    // At most the status call itself: whether it counts itself depends on when the count is read.
    expect(inFlight).toBeLessThanOrEqual(1);
    const ok = await call(conn.client, "load_model", { model: "mnist-cnn" });
    expect(ok.isError, JSON.stringify(ok)).toBeFalsy();
    await call(conn.client, "unload_model", { model: "mnist-cnn" });
  });
});

/** `tpu-mcp stdio` spoken to in raw JSON lines, without the SDK's client in between. */
function rawStdio() {
  const proc = spawn(process.execPath, [CLI, "stdio", "--config", writeConfig()], {
    cwd: ROOT,
    stdio: ["pipe", "pipe", "pipe"],
  });
  let out = "";
  let err = "";
  proc.stdout.on("data", (d) => (out += d));
  proc.stderr.on("data", (d) => (err += d));
  const exited = new Promise<number | null>((r) => proc.once("exit", (code) => r(code)));
  const send = (m: unknown) => proc.stdin.write(JSON.stringify(m) + "\n");
  return { proc, out: () => out, err: () => err, exited, send };
}

describe("stdio sessions at the edges", () => {
  it("a client that leaves during start-up ends the server quietly (nothing at error level)", async () => {
    const { proc, out, err, exited, send } = rawStdio();
    send(INITIALIZE);
    // As soon as the server answers, the client goes away: the worker is still starting.
    for (let i = 0; i < 600 && !out().includes('"result"'); i++)
      await new Promise((r) => setTimeout(r, 50));
    expect(out()).toContain('"protocolVersion"');
    proc.stdin.end();
    expect(await exited).toBe(0);
    const errors = err()
      .split("\n")
      .filter((l) => l.startsWith("{"))
      .map((l) => JSON.parse(l))
      .filter((l) => l.level >= 50);
    expect(errors).toEqual([]);
  });

  it(
    "answers each of three concurrent requests that reuse one id: one result, two errors",
    { timeout: scaled(120_000) },
    async () => {
      const { proc, out, exited, send } = rawStdio();
      const lines = () =>
        out()
          .split("\n")
          .filter((l) => l.trim())
          .map((l) => JSON.parse(l));
      const until = async (pred: () => boolean) => {
        for (let i = 0; i < 1200 && !pred(); i++) await new Promise((r) => setTimeout(r, 50));
      };
      try {
        send(INITIALIZE);
        await until(() => lines().some((m) => m.id === 1));
        send({ jsonrpc: "2.0", method: "notifications/initialized" });
        // load_model waits for the worker to start: the first call is in progress for seconds.
        const load = {
          jsonrpc: "2.0",
          id: 7,
          method: "tools/call",
          params: { name: "load_model", arguments: { model: "mnist-cnn" } },
        };
        send(load);
        send(load);
        send(load);
        await until(() => lines().filter((m) => m.id === 7).length >= 3);
        const answers = lines().filter((m) => m.id === 7);
        expect(answers).toHaveLength(3);
        expect(answers.filter((m) => m.result && !m.result.isError)).toHaveLength(1);
        const dup = answers.filter((m) => m.error);
        expect(dup).toHaveLength(2);
        for (const d of dup) {
          expect(d.error.code).toBe(-32600);
          expect(d.error.message).toMatch(/already used by a request in progress/);
        }
        // Answered: the id may be used again.
        send({ ...load, params: { name: "get_runtime_status", arguments: {} } });
        await until(() => lines().filter((m) => m.id === 7).length >= 4);
        expect(lines().filter((m) => m.id === 7)[3].result).toBeDefined();
      } finally {
        proc.stdin.end();
        await exited;
      }
    },
  );
});
