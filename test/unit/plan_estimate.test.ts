// The load estimate prices a compiled load at one compile and one warm forward per shape of the
// model's plan, so it scales with the plan's size. The plan itself comes from the worker
// (describe's plan_shapes): test/runtime/plan_estimate.test.ts reads it from a real worker.
import { describe, expect, it } from "vitest";
import { DEFAULT_ASSUMPTIONS, estimateCost, type PlanShapeFacts } from "../../policies/estimate.js";

const perGraph = DEFAULT_ASSUMPTIONS.compile_s_per_graph.cpu!;
const cpu = { kind: "cpu", memory_free_bytes: null, memory_total_bytes: null };
const grid = (batches: number[], lengths: number[]): PlanShapeFacts[] =>
  batches.flatMap((batch) => lengths.map((length) => ({ batch, length })));

describe("the plan a compiled load warms", () => {
  const load = (plan: PlanShapeFacts[] | null, mode = "compile") =>
    estimateCost({
      kind: "load",
      args: { model: "m", mode },
      model: {
        id: "m",
        parameters: 22_700_000,
        weight_bytes: 90_900_000,
        dtypes: ["float32"],
        shape_plan: plan,
      },
      device: cpu,
    });

  it("prices one compile per shape of the plan and follows its size", () => {
    const full = grid([1, 2, 4, 8, 16, 32, 64], [8, 16, 32, 64, 128, 256]);
    const fewer = grid([8, 64], [128, 256]);
    expect(load(full).compile_s).toBe(42 * perGraph);
    expect(load(fewer).compile_s).toBe(4 * perGraph);
    expect(load(fewer).device_seconds).toBeLessThan(load(full).device_seconds);
    expect(load(full, "eager").compile_s).toBe(0);
  });

  it("without a plan prices the load's warm-up shapes: one at batch 1", () => {
    expect(load(null).compile_s).toBe(perGraph);
  });
});
