// A compiled load's estimate is priced by the shape plan the worker reports (describe's
// plan_shapes, from runtime/worker/tpu_worker/shapes.py): one compile per shape, read from a real
// worker through the server's own model facts and estimator, with no copy of the plan here. The
// worker's side (describe's plan is the loaded adapter's): runtime/worker/tests/test_padding.py.
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DEFAULT_ASSUMPTIONS } from "../../policies/estimate.js";
import { readCatalog } from "../../runtime/catalog.js";
import type { Runtime } from "../../runtime/types.js";
import { WorkerModelFacts } from "../../tools/stores/facts.js";
import { estimateFor } from "../../tools/support/estimate.js";
import type { ToolContext } from "../../tools/types.js";
import { cpuRuntime, repoRoot } from "./helpers.js";

const builtin = readCatalog(join(repoRoot, "runtime/catalog.builtin.json"));
const perGraph = DEFAULT_ASSUMPTIONS.compile_s_per_graph.cpu!;

describe("the plan a compiled load is priced by", () => {
  const rt = cpuRuntime();
  // One worker, not a pool: the facts read only its `describe` and its "ready" event.
  const facts = new WorkerModelFacts(rt as unknown as Runtime);
  // The estimator's context: the real worker and its facts (no model loaded: a pool would say
  // so), a history store with nothing in it.
  const ctx = {
    env: { catalog: builtin },
    facts,
    runtime: { call: rt.call.bind(rt), hello: null, loadedModels: () => [] },
    signal: new AbortController().signal,
    reports: { calls: async () => [], history: async () => [], measuredHere: () => false },
  } as unknown as ToolContext;
  const load = (model: string, mode: string) =>
    estimateFor({ estimate: "load" }, { model, mode }, ctx);

  beforeAll(() => rt.start());
  afterAll(() => rt.close());

  it("is the worker's plan for every built-in model, one compile per shape", async () => {
    for (const entry of builtin.models) {
      const plan = (await facts.get(entry.id))?.plan_shapes;
      expect(plan?.length, entry.id).toBeGreaterThan(0);
      expect((await load(entry.id, "compile"))!.compile_s, entry.id).toBe(plan!.length * perGraph);
      expect((await load(entry.id, "eager"))!.compile_s, entry.id).toBe(0);
    }
  });

  it("has no plan where no worker has described the model: the load's warm-up shapes are priced", async () => {
    const silent = { ...ctx, facts: { get: async () => undefined } } as unknown as ToolContext;
    const e = await estimateFor(
      { estimate: "load" },
      { model: "tiny-gpt2", mode: "compile" },
      silent,
    );
    expect(e!.compile_s).toBe(perGraph); // one warm-up shape at batch 1
  });
});
