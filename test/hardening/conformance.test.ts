// The official MCP conformance suite (server scenarios) against `tpu-mcp http --no-auth`, in both
// protocol eras, run by scripts/conformance.sh with test/hardening/conformance-baseline.yml
// (2025-11-25) and conformance-baseline-2026.yml (2026-07-28); see those files for what cannot
// apply and why.
import { spawn } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { recordFigure, ROOT } from "./helpers.js";
import { scaled } from "../helpers/calibrate.js";

/** Scenarios that apply to this server, per era: each must pass every check. */
const MUST_PASS: Record<string, string[]> = {
  "2025-11-25": [
    "server-initialize",
    "server-session-lifecycle",
    "ping",
    "logging-set-level",
    "tools-list",
    "resources-list",
    "server-sse-multiple-streams",
    "dns-rebinding-protection",
  ],
  "2026-07-28": [
    "tools-list",
    "resources-list",
    "sep-2164-resource-not-found",
    "server-sse-multiple-streams",
    "dns-rebinding-protection",
    "http-header-validation",
    "input-required-result-unsupported-methods",
    "input-required-result-validate-input",
  ],
};

describe.each(Object.keys(MUST_PASS))("MCP conformance suite, %s", (era) => {
  it(
    "passes every applicable server scenario, and fails only the baselined checks",
    { timeout: scaled(600_000) },
    async () => {
      const out = join(ROOT, "test", "hardening", ".results", `conformance-${era}`);
      const { code, log } = await new Promise<{ code: number | null; log: string }>((resolve) => {
        const p = spawn("bash", [join(ROOT, "scripts", "conformance.sh")], {
          cwd: ROOT,
          env: { ...process.env, CONFORMANCE_OUT: out, CONFORMANCE_ERA: era },
        });
        let log = "";
        p.stdout.on("data", (d) => (log += d));
        p.stderr.on("data", (d) => (log += d));
        p.on("close", (code) => resolve({ code, log }));
      });
      expect(code, log.slice(-4000)).toBe(0);
      const results: Record<string, { passed: number; failed: number }> = {};
      for (const d of readdirSync(out)) {
        const m = /^server-(.+)-\d{4}-\d\d-\d\dT/.exec(d);
        if (!m) continue;
        const checks = JSON.parse(readFileSync(join(out, d, "checks.json"), "utf8")) as {
          status: string;
        }[];
        results[m[1]] = {
          passed: checks.filter((c) => c.status === "SUCCESS").length,
          failed: checks.filter((c) => c.status === "FAILURE").length,
        };
      }
      for (const s of MUST_PASS[era]) {
        expect(results[s], s).toBeDefined();
        expect(results[s].failed, s).toBe(0);
        expect(results[s].passed, s).toBeGreaterThan(0);
      }
      recordFigure(`conformance ${era}`, {
        passed: Object.entries(results)
          .filter(([, r]) => r.failed === 0 && r.passed > 0)
          .map(([s]) => s),
        baselined: Object.entries(results)
          .filter(([, r]) => r.failed > 0)
          .map(([s]) => s),
      });
    },
  );
});
