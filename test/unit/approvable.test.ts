// A rule on a tool that takes no approval_id can be met only in band: the server says so.
import { join } from "node:path";
import { readCatalog } from "../../runtime/catalog.js";
import { buildTools, TOOL_POLICIES } from "../../tools/registry.js";
import { inBandOnly, takesApprovalId } from "../../tools/support/approvable.js";
import { describe, expect, it } from "vitest";
import { ROOT } from "../helpers/server.js";

describe("approval rules a tool cannot take out of band", () => {
  const tools = buildTools({
    catalog: readCatalog(join(ROOT, "runtime/catalog.builtin.json")),
    limits: {
      max_texts: 64,
      inline_max_elements: 4096,
      max_tensor_elements: 1 << 20,
      benchmark: { max_configs: 64, max_iterations: 10_000, max_duration_s: 600, max_warmup: 100 },
    },
  });

  it("knows which tools carry approval_id", () => {
    const takes = tools
      .filter(takesApprovalId)
      .map((t) => t.name)
      .sort();
    expect(takes).toEqual(["check_model", "load_model", "run_benchmark", "run_inference"]);
    expect(TOOL_POLICIES.length).toBe(tools.length);
  });

  it("names the gated tools without it, and nothing for the default rules or a wildcard", () => {
    expect(inBandOnly([{ tool: "unload_model" }, { tool: "run_benchmark" }], tools)).toEqual([
      "unload_model",
    ]);
    expect(
      inBandOnly(
        [{ tool: "run_benchmark" }, { tool: "load_model" }, { tool: "check_model" }],
        tools,
      ),
    ).toEqual([]);
    expect(inBandOnly([{ tool: "*" }], tools)).toEqual([]);
  });
});
