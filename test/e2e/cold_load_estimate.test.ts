// Issue 33 (row 10): a cold load_model was estimated far below what it took. A fresh worker's
// first model build is cold for every model kind, plain torch (mnist-cnn) included: its estimate
// is the floor (first_build_s) until a cold load has been measured, so an approval rule on device
// time sees it, while a warm load of the same model in the same worker is still priced as warm.
// A real HTTP server and worker, a real SDK client, the operator's CLI.
import { createHash } from "node:crypto";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DEFAULT_ASSUMPTIONS } from "../../policies/estimate.js";
import { scaled } from "../helpers/calibrate.js";
import {
  cli,
  connectHttp,
  DEMO_POLICY,
  DEMO_TOKENS,
  errorOf,
  startHttpServer,
  writeConfig,
  type HttpServerProc,
} from "../helpers/server.js";
import { call } from "./scenario.js";
import { auditRows } from "../helpers/audit_rows.js";

describe("a cold load is estimated as one (mnist-cnn in a fresh worker)", () => {
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-cold-load-"));
  const dataDir = join(dir, "data");
  // A load estimated at a second or more asks the operator; a warm mnist-cnn load is ~10 ms.
  const policy = {
    ...DEMO_POLICY,
    approvals: {
      ...DEMO_POLICY.approvals,
      rules: [{ tool: "load_model", when: { min_device_seconds: 1 } }],
    },
  };
  const config = writeConfig({ policy }, dir);
  let server: HttpServerProc;
  beforeAll(async () => {
    server = await startHttpServer(config);
  }, scaled(120_000));
  afterAll(async () => {
    await server?.stop();
  });

  it(
    "shows the first build's cost in the approval, and prices the next load in that worker warm",
    async () => {
      const agent = await connectHttp(server.url, DEMO_TOKENS.agent);
      try {
        const asked = await call(agent.client, "load_model", { model: "mnist-cnn" });
        expect(errorOf(asked)?.code, JSON.stringify(asked)).toBe("approval_required");
        const { approval_id, estimate } = errorOf(asked)!.details;
        expect(estimate.device_seconds).toBeGreaterThanOrEqual(DEFAULT_ASSUMPTIONS.first_build_s);
        const ok = await cli(
          config,
          "approvals",
          "approve",
          approval_id,
          "--token",
          DEMO_TOKENS.operator,
        );
        expect(ok.code, ok.stderr).toBe(0);
        const loaded = await call(agent.client, "load_model", { model: "mnist-cnn", approval_id });
        expect(loaded.isError, JSON.stringify(loaded)).toBeFalsy();

        // Unloaded and loaded again in the same worker: warm, under the rule, no approval.
        const unloaded = await call(agent.client, "unload_model", { model: "mnist-cnn" });
        expect(unloaded.isError, JSON.stringify(unloaded)).toBeFalsy();
        const again = await call(agent.client, "load_model", { model: "mnist-cnn" });
        expect(again.isError, JSON.stringify(again)).toBeFalsy();
        const allowed = auditRows(dataDir).filter(
          (r) => r.tool === "load_model" && r.outcome === "allowed",
        );
        expect(allowed).toHaveLength(2);
        expect(allowed[0].estimate.device_seconds).toBe(estimate.device_seconds);
        expect(allowed[1].estimate.device_seconds).toBeLessThan(1);
      } finally {
        await agent.close();
      }
    },
    scaled(180_000),
  );
});

// Issue 44 (item 5): a principal whose whole budget is under a cold load's default price (20 s for
// a transformers model's first import) could never load one, though the load takes 1–10 s. An
// estimate on defaults alone is admitted holding the whole budget (the meter stops it there);
// one that rests on measured calls and exceeds the whole budget is still refused outright.
describe("an unmeasured estimate over the whole budget is admitted; a measured one is refused", () => {
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-cold-budget-"));
  const dataDir = join(dir, "data");
  const BUDGET_S = 10;
  // A second principal measures a benchmark of the model on its own budget line.
  const PROBER_TOKEN = "h8-prober-token";
  const policy = {
    ...DEMO_POLICY,
    tokens: [
      ...DEMO_POLICY.tokens,
      {
        id: "prober",
        token_sha256: createHash("sha256").update(PROBER_TOKEN).digest("hex"),
        scopes: ["benchmark:run", "models:read"],
      },
    ],
    approvals: { ...DEMO_POLICY.approvals, rules: [] },
    limits: {
      ...DEMO_POLICY.limits,
      budget: { device_seconds_per_window: BUDGET_S, window_s: 3600 },
    },
  };
  const config = writeConfig({ policy }, dir);
  let server: HttpServerProc;
  beforeAll(async () => {
    server = await startHttpServer(config);
  }, scaled(120_000));
  afterAll(async () => {
    await server?.stop();
  });

  it(
    "loads tiny-gpt2 cold on a 10 s budget, and refuses a measured benchmark over it as never fitting",
    async () => {
      const agent = await connectHttp(server.url, DEMO_TOKENS.agent);
      const prober = await connectHttp(server.url, PROBER_TOKEN);
      try {
        const loaded = await call(agent.client, "load_model", { model: "tiny-gpt2" });
        expect(loaded.isError, JSON.stringify(loaded)).toBeFalsy();
        const load = auditRows(dataDir).find(
          (r) => r.tool === "load_model" && r.outcome === "allowed",
        )!;
        // Priced as a cold load by default, above the whole budget, and admitted all the same.
        expect(load.estimate.basis).toBe("default");
        expect(load.estimate.device_seconds).toBeGreaterThan(BUDGET_S);

        // A small benchmark measured (the prober's line), then a large one of the same class
        // on the agent's: its estimate scales the measurement, and it can never fit 10 s.
        const small = await call(prober.client, "run_benchmark", {
          model: "tiny-gpt2",
          batch_sizes: [1],
          seq_lens: [8],
          iterations: 5,
          warmup: 0,
        });
        expect(small.isError, JSON.stringify(small).slice(0, 500)).toBeFalsy();
        const large = await call(agent.client, "run_benchmark", {
          model: "tiny-gpt2",
          batch_sizes: [1],
          seq_lens: [8],
          iterations: 10_000,
          warmup: 0,
        });
        const e = errorOf(large);
        expect(e?.code, JSON.stringify(large)).toBe("budget_exceeded");
        expect(e?.message).toMatch(/can never fit \(the whole budget is 10 s\)/);
        const refused = auditRows(dataDir).find(
          (r) => r.tool === "run_benchmark" && r.principal === "agent",
        )!;
        expect(refused.estimate.basis).toBe("measured");
      } finally {
        await prober.close();
        await agent.close();
      }
    },
    scaled(240_000),
  );
});
