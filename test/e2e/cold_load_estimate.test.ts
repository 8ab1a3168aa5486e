// Issue 33 (row 10): a cold load_model was estimated far below what it took. A fresh worker's
// first model build is cold for every model kind, plain torch (mnist-cnn) included: its estimate
// is the floor (first_build_s) until a cold load has been measured, so an approval rule on device
// time sees it, while a warm load of the same model in the same worker is still priced as warm.
// A real HTTP server and worker, a real SDK client, the operator's CLI.
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
