// The Python MCP SDK (the `mcp` package, 2.x) as a client, in both protocol eras and over both
// transports: the handshake era, its `auto` probe and the 2026-07-28 pin all run the same
// journey through the same gate, with an approval answered in band by the client's form.
import { execFile } from "node:child_process";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  CLI,
  DEMO_POLICY,
  DEMO_TOKENS,
  ROOT,
  startHttpServer,
  writeConfig,
  type HttpServerProc,
} from "../helpers/server.js";
import { scaled } from "../helpers/calibrate.js";

const run = promisify(execFile);
const PY = join(ROOT, ".venv/bin/python");
const SCRIPT = join(ROOT, "test/e2e/py_client.py");

const POLICY = {
  ...DEMO_POLICY,
  limits: { ...DEMO_POLICY.limits, rate_limit: { per_principal_per_minute: 6000 } },
  // The opt-in that lets the client's form decide (issue 33: no rule of the default does).
  approvals: {
    rules: [{ tool: "load_model", assurance: "client_form" }],
    elicitation: true,
    elicitation_timeout_s: 120,
  },
};

async function py(args: string[]) {
  try {
    const r = await run(PY, [SCRIPT, ...args], { cwd: ROOT, timeout: scaled(240_000) });
    return JSON.parse(r.stdout.trim().split("\n").at(-1)!);
  } catch (e: any) {
    throw new Error(
      `python client failed: ${e.stdout ?? ""}\n${String(e.stderr ?? e).slice(-3000)}`,
    );
  }
}

const MODES: [string, string][] = [
  ["legacy", "2025-11-25"],
  ["auto", "2026-07-28"],
  ["2026-07-28", "2026-07-28"],
];

describe("the Python MCP SDK as a client", () => {
  let srv: HttpServerProc;
  let config: string;
  beforeAll(async () => {
    config = writeConfig({ policy: POLICY });
    srv = await startHttpServer(config);
  });
  afterAll(async () => srv?.stop());

  for (const [mode, version] of MODES) {
    it(`over HTTP, mode ${mode}: lands on ${version}, approves in band, runs the journey`, async () => {
      const out = await py([
        "--transport",
        "http",
        "--mode",
        mode,
        "--url",
        srv.url,
        "--token",
        DEMO_TOKENS.agent,
      ]);
      expect(out.protocol_version).toBe(version);
      expect(out.tools).toContain("run_benchmark");
      expect(out.models).toContain("mnist-cnn");
      expect(out.loaded).toBe("mnist-cnn");
      expect(out.prompts).toHaveLength(1);
      expect(out.prompts[0]).toMatch(/load_model/);
    });
  }

  for (const [mode, version] of MODES) {
    it(`over stdio, mode ${mode}: lands on ${version} and runs the journey`, async () => {
      const out = await py([
        "--transport",
        "stdio",
        "--mode",
        mode,
        "--cli",
        CLI,
        "--config",
        config,
      ]);
      expect(out.protocol_version).toBe(version);
      expect(out.loaded).toBe("mnist-cnn");
      expect(out.prompts).toHaveLength(1);
    });
  }
});
