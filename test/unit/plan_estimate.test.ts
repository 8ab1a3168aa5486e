// The load estimate knows each catalog model's shape plan (runtime/catalog.ts planShapes, the
// worker's runtime/worker/tpu_worker/shapes.py mirrored): a compiled load is priced at one
// compile and one warm forward per shape of the plan, so it scales with the catalog's buckets.
// The worker's own count of the same plans: runtime/worker/tests/test_padding.py.
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { DEFAULT_ASSUMPTIONS, estimateCost } from "../../policies/estimate.js";
import { parseCatalog, planShapes, planSize, readCatalog } from "../../runtime/catalog.js";
import { ROOT } from "../helpers/server.js";

const builtin = readCatalog(join(ROOT, "runtime/catalog.builtin.json"));
const entry = (id: string) => builtin.models.find((m) => m.id === id)!;
const perGraph = DEFAULT_ASSUMPTIONS.compile_s_per_graph.cpu!;
const cpu = { kind: "cpu", memory_free_bytes: null, memory_total_bytes: null };

describe("the plan a compiled load warms", () => {
  it("counts every model kind's buckets as the worker does", () => {
    // MiniLM: batches 1..64 (7) × lengths 8..256 (6); tiny-gpt2: prefills at batches 1, 4, 16 ×
    // lengths 8..128 (15), behind cached prefixes at the same batches × the four shorter lengths
    // (12), decode steps at batches 1..16 (5); mnist-cnn: batches 1..256 (9), items of one shape.
    expect(planSize(entry("all-minilm-l6-v2"))).toBe(42);
    expect(planSize(entry("tiny-gpt2"))).toBe(32);
    expect(planSize(entry("mnist-cnn"))).toBe(9);
    expect(planShapes(entry("mnist-cnn"))!.every((s) => s.length === 0)).toBe(true);
    const vllm = parseCatalog({
      ...builtin,
      models: [{ ...entry("tiny-gpt2"), engine: "vllm", format: "hf-safetensors" }],
    }).models[0];
    expect(planSize(vllm)).toBeNull();
  });

  it("prices a compiled MiniLM load at its 42 graphs and follows the catalog's buckets", () => {
    const minilm = entry("all-minilm-l6-v2");
    const load = (e: typeof minilm) =>
      estimateCost({
        kind: "load",
        args: { model: e.id, mode: "compile" },
        model: {
          id: e.id,
          parameters: 22_700_000,
          weight_bytes: 90_900_000,
          dtypes: e.dtypes,
          shape_plan: planShapes(e),
        },
        device: cpu,
      });
    expect(load(minilm).compile_s).toBe(42 * perGraph);
    const fewer = { ...minilm, shapes: { batch_buckets: [8, 64], length_buckets: [128, 256] } };
    expect(planSize(fewer)).toBe(4);
    expect(load(fewer).compile_s).toBe(4 * perGraph);
    expect(load(fewer).device_seconds).toBeLessThan(load(minilm).device_seconds);
  });
});
