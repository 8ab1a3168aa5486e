// Every registered tool declares its whole policy record in its own file (tools/<name>.ts), and
// the record agrees with the tool: a new tool cannot forget its scope, lane, job-ability or
// defaults, and the config schema's per-tool defaults are these records' values.
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { parsePolicyConfig, toolConcurrency, toolTimeoutMs } from "../../policies/config.js";
import { isScope } from "../../policies/scopes.js";
import type { ToolPolicy } from "../../policies/tool_policy.js";
import { readCatalog } from "../../runtime/catalog.js";
import { buildTools, TOOL_POLICIES } from "../../tools/registry.js";
import type { ToolEnv } from "../../tools/types.js";
import { ROOT } from "../helpers/server.js";

const env: ToolEnv = {
  catalog: readCatalog(join(ROOT, "runtime/catalog.builtin.json")),
  limits: {
    max_texts: 64,
    inline_max_elements: 4096,
    max_tensor_elements: 1 << 20,
    benchmark: { max_configs: 64, max_iterations: 10_000, max_duration_s: 600, max_warmup: 100 },
  },
};
const tools = buildTools(env);

/** Every key of a ToolPolicy: a record missing one is incomplete. */
const FIELDS: (keyof ToolPolicy)[] = [
  "name",
  "scope",
  "workerOp",
  "job",
  "deviceMode",
  "timeoutS",
  "concurrency",
  "estimate",
  "runWhileRecording",
];

/** The worker's ops, as its own source names them (`def op_<name>`). */
function workerOps(): Set<string> {
  const dir = join(ROOT, "runtime/worker/tpu_worker");
  const ops = new Set<string>();
  const walk = (d: string) => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      if (e.isDirectory()) walk(join(d, e.name));
      else if (e.name.endsWith(".py"))
        for (const m of readFileSync(join(d, e.name), "utf8").matchAll(/def op_(\w+)\(self/g))
          ops.add(m[1]!);
    }
  };
  walk(dir);
  return ops;
}

describe("tool descriptors", () => {
  it("registers one record per built tool, in the same order, under the tool's own name", () => {
    expect(TOOL_POLICIES.map((p) => p.name)).toEqual(tools.map((t) => t.name));
    for (const t of tools) expect(TOOL_POLICIES).toContain(t.policy);
    expect(new Set(tools.map((t) => t.name)).size).toBe(tools.length);
  });

  const ops = workerOps();
  it.each(tools.map((t) => [t.name, t] as const))(
    "%s has a complete, consistent record",
    (_n, t) => {
      const p = t.policy;
      expect(Object.keys(p).sort()).toEqual([...FIELDS].sort());
      for (const f of FIELDS) expect(p[f], f).not.toBeUndefined();
      expect(isScope(p.scope), p.scope).toBe(true);
      if (p.workerOp !== null) expect(ops, `worker op ${p.workerOp}`).toContain(p.workerOp);
      // A job runs on a worker, and the tool takes `wait` (false: answer with a job id at once).
      if (p.job) {
        expect(p.workerOp).not.toBeNull();
        expect((t.input as any).shape?.wait, "wait argument").toBeDefined();
      }
      // A lane (deviceMode) is taken only for worker work.
      if (p.deviceMode !== null) expect(p.workerOp).not.toBeNull();
      // An estimate kind exactly when the tool estimates its cost.
      expect(p.estimate !== null).toBe(t.estimate !== undefined);
      // Starting before the record commits is only for work that leaves the device as it was.
      if (p.runWhileRecording) expect(p.deviceMode).not.toBe("exclusive");
      if (p.timeoutS !== null) expect(p.timeoutS).toBeGreaterThan(0);
      if (p.concurrency !== null)
        expect(Number.isInteger(p.concurrency) && p.concurrency > 0).toBe(true);
    },
  );

  it("gives the config its per-tool defaults from the records", () => {
    const limits = parsePolicyConfig({}, TOOL_POLICIES).limits;
    for (const p of TOOL_POLICIES) {
      expect(toolConcurrency(limits, p.name)).toBe(p.concurrency ?? limits.default_concurrency);
      expect(toolTimeoutMs(limits, p.name)).toBe(
        Math.round((p.timeoutS ?? limits.default_call_timeout_s) * 1000),
      );
      expect(limits.device_exclusive_tools.includes(p.name)).toBe(p.deviceMode === "exclusive");
      expect(limits.device_shared_tools.includes(p.name)).toBe(p.deviceMode === "shared");
    }
  });
});
