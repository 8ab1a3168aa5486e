// run_benchmark work "train_step" end to end: the real `tpu-mcp stdio` server, the SDK's Client
// and a real torch worker on the CPU train a copy of each built-in model in both modes and both
// precisions, and the served model's weights are the same before and after (a checksum read
// over MCP). No assertion is about speed.
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connectStdio, writeConfig } from "../helpers/server.js";
import { call } from "./scenario.js";
import { scaled } from "../helpers/calibrate.js";

const MODELS = [
  { model: "tiny-gpt2", seq_lens: [8], optimizer: "adamw", loss: /^causal LM/ },
  { model: "all-minilm-l6-v2", seq_lens: [8], optimizer: "sgd", loss: /^MSE/ },
  { model: "mnist-cnn", seq_lens: undefined, optimizer: "adamw", loss: /^cross-entropy/ },
] as const;

async function checksum(client: any, model: string): Promise<string> {
  const s = await call(client, "get_runtime_status", { weights_checksum: true });
  expect(s.isError, JSON.stringify(s)).toBeFalsy();
  const m = s.structuredContent.loaded.find((l: any) => l.model === model);
  expect(m?.weights_checksum).toMatch(/^sha256:[0-9a-f]{64}$/);
  return m.weights_checksum;
}

describe("run_benchmark work train_step over MCP", () => {
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-train-e2e-"));
  let conn: Awaited<ReturnType<typeof connectStdio>>;
  beforeAll(async () => {
    const policy = {
      approvals: { rules: [] },
      limits: { rate_limit: { per_principal_per_minute: 6000 }, soft_deadline_s: 0 },
    };
    // Compile mode through AOTAutograd (forward and backward graphs) without inductor's C++
    // build, which takes minutes per graph on a busy 2-core machine.
    conn = await connectStdio(
      writeConfig({ policy }, dir),
      {},
      { TPU_WORKER_COMPILE_BACKEND: "aot_eager" },
    );
  });
  afterAll(async () => {
    await conn?.close();
  });

  for (const { model, seq_lens, optimizer, loss } of MODELS) {
    it(
      `trains a copy of ${model} in both modes and precisions and leaves the served one as it was`,
      { timeout: scaled(900_000) },
      async () => {
        const load = await call(conn.client, "load_model", { model });
        expect(load.isError, JSON.stringify(load)).toBeFalsy();
        const before = await checksum(conn.client, model);
        const r = await call(
          conn.client,
          "run_benchmark",
          {
            model,
            work: "train_step",
            optimizer,
            batch_sizes: [2],
            ...(seq_lens ? { seq_lens } : {}),
            dtypes: ["float32", "bfloat16"],
            modes: ["eager", "compile"],
            iterations: 2,
            warmup: 1,
          },
          { timeout: scaled(900_000) },
        );
        expect(r.isError, JSON.stringify(r)).toBeFalsy();
        const o = r.structuredContent;
        expect(o.work).toBe("train_step");
        expect(o.manifest.optimizer.name).toBe(optimizer);
        expect(o.manifest.train.loss).toMatch(loss);
        expect(o.manifest.compile_backend).toBe("aot_eager");
        expect(o.configs).toHaveLength(4);
        for (const c of o.configs) {
          expect(c.error, JSON.stringify(c.error)).toBeNull();
          expect(c.latency_ms.p50).toBeGreaterThan(0);
          expect(c.throughput_items_per_s).toBeGreaterThan(0);
          if (seq_lens) expect(c.tokens_per_s).toBeCloseTo(c.throughput_items_per_s * 8, 0);
          else expect(c.tokens_per_s).toBeNull();
          expect(Number.isFinite(c.loss_final)).toBe(true);
          expect(c.memory_split.weights_bytes).toBeGreaterThan(0);
          // Every parameter has a gradient; the weights add the model's buffers.
          expect(c.memory_split.gradients_bytes).toBeGreaterThan(0);
          expect(c.memory_split.gradients_bytes).toBeLessThanOrEqual(c.memory_split.weights_bytes);
          expect(c.memory_split.optimizer_state_bytes).toBeGreaterThan(0);
          expect(c.flops_per_step).toBeGreaterThan(0);
          // A fraction is a figure in (0, 1], or flagged as a fault and never printed.
          if (c.fraction_of_peak !== null) expect(c.fraction_of_peak).toBeLessThanOrEqual(1);
          else expect(c.fraction_of_peak_fault ?? c.peak_flops_per_s).toBeDefined();
          expect(c.stability.iterations_requested).toBe(2);
          // The warmup step (in compile mode the compiling one) and the window, which an unstable
          // series extends past the 2 asked for.
          expect(c.train_steps).toBe(c.iterations + 1);
          if (c.mode === "compile") expect(c.graphs_compiled).toBeGreaterThanOrEqual(1);
        }
        // bfloat16 against the float32 run of the same mode, over the steps both took.
        for (const c of o.configs.filter((x: any) => x.dtype === "bfloat16")) {
          const fp32 = o.configs.find((x: any) => x.dtype === "float32" && x.mode === c.mode);
          expect(c.loss_drift_vs_fp32.steps).toBe(Math.min(c.train_steps, fp32.train_steps));
          expect(c.loss_drift_vs_fp32.max_abs).toBeGreaterThanOrEqual(0);
        }
        // The text answer and the Markdown report show the training figures.
        const text = r.content.find((x: any) => x.type === "text")?.text ?? "";
        expect(text).toMatch(/ms\/step/);
        expect(text).toMatch(/loss [\d.]+ → [\d.]+ over \d+ steps/);
        const md = await conn.client.readResource({ uri: o.markdown_uri });
        const body = String((md.contents[0] as any).text);
        expect(body).toMatch(/\| p50 ms\/step \|/);
        expect(body).toMatch(/bf16 drift/);
        // The model an agent loaded was never trained.
        expect(await checksum(conn.client, model)).toBe(before);
        const unload = await call(conn.client, "unload_model", { model });
        expect(unload.isError, JSON.stringify(unload)).toBeFalsy();
        // No calibration helper on main yet: a generous bound for a loaded 2-core machine.
      },
    );
  }

  it("refuses what a training step cannot be, in words", async () => {
    const bad = [
      [{ work: "train_step", dtypes: ["float16"] }, /bfloat16 autocast: dtypes float32, bfloat16/],
      [{ work: "train_step", scenario: "offline" }, /one step at a time/],
      [{ optimizer: "sgd" }, /only work "train_step" takes an optimizer/],
      [{ modes: ["compile_step"] }, /"compile_step" compiles a whole training step/],
    ] as const;
    for (const [args, words] of bad) {
      const r = await call(conn.client, "run_benchmark", { model: "mnist-cnn", ...args });
      expect(r.isError).toBe(true);
      expect(r.content.map((x: any) => x.text).join("\n")).toMatch(words);
    }
  });
});
