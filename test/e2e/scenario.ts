// The same user journey and bad-input table, driven over stdio and over HTTP.
import type { Client as ClientV1 } from "@modelcontextprotocol/sdk/client/index.js";
import type { Client as ClientV2 } from "@modelcontextprotocol/client";
import { expect } from "vitest";
import { scaled } from "../helpers/calibrate.js";
import { cosine, errorOf } from "../helpers/server.js";

export const SENTENCES = [
  "A man is playing a guitar.",
  "A man is playing a musical instrument.",
  "The stock market fell sharply today.",
];

/** A 2025-era client (SDK 1.x) or an SDK v2 client in either era: the journeys run on all. */
export type Client = ClientV1 | ClientV2;

export async function call(client: Client, name: string, args: Record<string, unknown>, opts = {}) {
  const options = { timeout: scaled(300_000), ...opts };
  // v2's callTool takes (params, options); 1.x's takes (params, resultSchema, options).
  if ("getProtocolEra" in client)
    return (await client.callTool({ name, arguments: args }, options as any)) as any;
  return (await client.callTool({ name, arguments: args }, undefined, options)) as any;
}

export async function coreJourney(client: Client) {
  const tools = await client.listTools();
  expect(tools.tools.map((t) => t.name).sort()).toEqual(
    [
      "cancel_job",
      "check_model",
      "get_job",
      "get_runtime_status",
      "list_models",
      "load_model",
      "run_benchmark",
      "run_inference",
      "unload_model",
    ].sort(),
  );
  for (const t of tools.tools) {
    expect(t.outputSchema, t.name).toBeDefined();
    expect(t.annotations?.openWorldHint, t.name).toBe(false);
  }

  const models = await call(client, "list_models", {});
  expect(models.isError).toBeFalsy();
  const ids = models.structuredContent.models.map((m: any) => m.id);
  expect(ids).toEqual(expect.arrayContaining(["all-minilm-l6-v2", "tiny-gpt2", "mnist-cnn"]));
  const minilm = models.structuredContent.models.find((m: any) => m.id === "all-minilm-l6-v2");
  expect(minilm.available).toBe(true);
  expect(minilm.parameters).toBeGreaterThan(20_000_000);

  const loaded = await call(client, "load_model", { model: "all-minilm-l6-v2" });
  expect(loaded.isError, JSON.stringify(loaded)).toBeFalsy();
  expect(loaded.structuredContent).toMatchObject({
    model: "all-minilm-l6-v2",
    dtype: "float32",
    mode: "eager",
  });
  expect(loaded.structuredContent.load_s).toBeGreaterThan(0);

  const inf = await call(client, "run_inference", { model: "all-minilm-l6-v2", texts: SENTENCES });
  expect(inf.isError, JSON.stringify(inf)).toBeFalsy();
  const out = inf.structuredContent.outputs[0];
  expect(out.shape).toEqual([3, 384]);
  const rows = [0, 1, 2].map((i) => out.data.slice(i * 384, (i + 1) * 384));
  const near = cosine(rows[0], rows[1]);
  const far = cosine(rows[0], rows[2]);
  expect(near - far).toBeGreaterThanOrEqual(0.3);

  const bench = await call(client, "run_benchmark", {
    model: "all-minilm-l6-v2",
    batch_sizes: [1, 4],
    seq_lens: [16],
    iterations: 5,
    warmup: 1,
  });
  expect(bench.isError, JSON.stringify(bench)).toBeFalsy();
  const report = bench.structuredContent;
  expect(report.configs).toHaveLength(2);
  for (const c of report.configs) {
    expect(c.latency_ms.p50).toBeLessThanOrEqual(c.latency_ms.p90);
    expect(c.latency_ms.p90).toBeLessThanOrEqual(c.latency_ms.p99);
    expect(c.throughput_items_per_s).toBeGreaterThan(0);
  }
  const res = await client.readResource({ uri: report.resource_uri });
  expect(JSON.parse((res.contents[0] as any).text).report_id).toBe(report.report_id);

  const unloaded = await call(client, "unload_model", { model: "all-minilm-l6-v2" });
  expect(unloaded.isError, JSON.stringify(unloaded)).toBeFalsy();
  const after = await call(client, "run_inference", { model: "all-minilm-l6-v2", texts: ["x"] });
  expect(errorOf(after)?.code).toBe("model_not_loaded");
}

/** [tool, arguments, expected error code] — each must be refused while the server keeps serving. */
export const BAD_INPUTS: [string, unknown, string][] = [
  ["list_models", { extra: 1 }, "invalid_argument"],
  ["get_runtime_status", { verbose: true }, "invalid_argument"],
  ["load_model", { model: 42 }, "invalid_argument"],
  ["load_model", { model: "no-such-model" }, "unknown_model"],
  ["load_model", { model: "../../etc/passwd" }, "unknown_model"],
  ["load_model", { model: "tiny-gpt2", dtype: "float8" }, "invalid_argument"],
  ["load_model", { model: "tiny-gpt2", mode: "turbo" }, "invalid_argument"],
  ["load_model", { model: "tiny-gpt2", device: "gpu; rm -rf /" }, "invalid_argument"],
  ["load_model", { model: "tiny-gpt2", warmup_shapes: [{ batch: 0 }] }, "invalid_argument"],
  ["load_model", { model: "tiny-gpt2", confirm: true }, "invalid_argument"],
  ["unload_model", {}, "invalid_argument"],
  ["run_inference", { model: "all-minilm-l6-v2", texts: "not a list" }, "invalid_argument"],
  ["run_inference", { model: "all-minilm-l6-v2", texts: [] }, "invalid_argument"],
  ["run_inference", { model: "all-minilm-l6-v2", texts: Array(65).fill("x") }, "invalid_argument"],
  ["run_inference", { model: "all-minilm-l6-v2", texts: ["x".repeat(5000)] }, "invalid_argument"],
  ["run_inference", { model: "all-minilm-l6-v2", texts: [1, 2] }, "invalid_argument"],
  ["run_inference", { model: "all-minilm-l6-v2" }, "invalid_argument"],
  ["run_inference", { model: "mnist-cnn", texts: ["x"] }, "invalid_argument"],
  [
    "run_inference",
    { model: "mnist-cnn", tensors: [{ dtype: "float32", shape: [1, 1, 28, 28], data: [1, 2] }] },
    "invalid_argument",
  ],
  [
    "run_inference",
    {
      model: "mnist-cnn",
      tensors: [{ dtype: "float32", shape: [1, 3, 3], data: Array(9).fill(0) }],
    },
    "invalid_argument",
  ],
  [
    "run_inference",
    { model: "tiny-gpt2", texts: ["hi"], max_new_tokens: 100000 },
    "invalid_argument",
  ],
  ["run_inference", { model: "tiny-gpt2", texts: ["hi"], max_new_tokens: -1 }, "invalid_argument"],
  ["run_benchmark", { model: "tiny-gpt2", batch_sizes: [0] }, "invalid_argument"],
  ["run_benchmark", { model: "tiny-gpt2", batch_sizes: [1], iterations: 1e9 }, "invalid_argument"],
  ["run_benchmark", { model: "tiny-gpt2", batch_sizes: "big" }, "invalid_argument"],
  [
    "run_benchmark",
    { model: "all-minilm-l6-v2", baseline_id: "bench_00000000000000000000" },
    "invalid_argument",
  ],
  ["get_job", { job_id: "job_../../x" }, "invalid_argument"],
  ["get_job", { job_id: "job_000000000000000000000000" }, "job_not_found"],
  ["cancel_job", { job_id: "job_000000000000000000000000" }, "job_not_found"],
  ["check_model", { model: "tiny-gpt2", batch: 1e6 }, "invalid_argument"],
];

export async function badInputs(client: Client) {
  for (const [name, args, code] of BAD_INPUTS) {
    const r = await call(client, name, args as Record<string, unknown>);
    expect(r.isError, `${name} ${JSON.stringify(args).slice(0, 80)}`).toBe(true);
    expect(
      errorOf(r)?.code,
      `${name} ${JSON.stringify(args).slice(0, 80)}: ${r.content?.[0]?.text}`,
    ).toBe(code);
    // Answers never carry paths or stack traces.
    expect(r.content[0].text).not.toMatch(/\/work\/|\/tmp\/|at .*\.ts:\d+|Traceback/);
  }
  // An unknown tool is a protocol error, not a tool result.
  await expect(client.callTool({ name: "rm_rf", arguments: {} })).rejects.toThrow(/Unknown tool/);
  // And the server still serves.
  const ok = await call(client, "list_models", {});
  expect(ok.isError).toBeFalsy();
}
