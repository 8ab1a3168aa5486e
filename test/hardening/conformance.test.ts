// The official MCP conformance suite (server scenarios) against `tpu-mcp http --no-auth`, run by
// scripts/conformance.sh with test/hardening/conformance-baseline.yml; see that file for the
// scenarios that cannot apply and why.
import { spawn } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { recordFigure, ROOT } from "./helpers.js";

/** Scenarios that apply to this server: each must pass every check. */
const MUST_PASS = [
  "server-initialize",
  "ping",
  "logging-set-level",
  "tools-list",
  "resources-list",
  "server-sse-multiple-streams",
  "dns-rebinding-protection",
];

describe("MCP conformance suite", () => {
  it(
    "passes every applicable server scenario, and fails only the baselined ones",
    { timeout: 600_000 },
    async () => {
      const out = join(ROOT, "test", "hardening", ".results", "conformance");
      const { code, log } = await new Promise<{ code: number | null; log: string }>((resolve) => {
        const p = spawn("bash", [join(ROOT, "scripts", "conformance.sh")], {
          cwd: ROOT,
          env: { ...process.env, CONFORMANCE_OUT: out },
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
      for (const s of MUST_PASS) {
        expect(results[s], s).toBeDefined();
        expect(results[s].failed, s).toBe(0);
        expect(results[s].passed, s).toBeGreaterThan(0);
      }
      recordFigure("conformance", {
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
