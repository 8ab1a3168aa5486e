// The audit trail against a caller that only gets refused (issue 23, finding 3): the
// lowest-privilege token sends 2,000 calls past its rate limit and 200 calls outside its scope
// through a real server and a real MCP client. Every refusal must stay accountable (the counts of
// the records add up to the refusals the client saw, the chain verifies, `audit tail` shows the
// count), and the trail must grow by a bounded number of records, not one per refusal.
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { connectHttp, startHttpServer } from "../helpers/server.js";
import {
  auditRows,
  baseConfig,
  cleanupTemp,
  cli,
  DEMO_POLICY,
  errorOf,
  recordFigure,
  tempDir,
  TOKENS,
} from "./helpers.js";
import { scaled } from "../helpers/calibrate.js";

const T = { timeout: scaled(300_000) };
const RATE = 20;
/** check_model calls: RATE of them within the rate, the rest (2,000 or more) over it. */
const CHECKS = 2_050;
const OUT_OF_SCOPE = 200;
/** Distinct arguments among the calls within the rate (each a different digest). */
const MODELS = 4;

afterAll(() => cleanupTemp());

describe("repeated refusals", () => {
  it("counts 2,250 refusals of a reader in a bounded number of chained records", T, async () => {
    const dir = tempDir();
    const data = join(dir, "data");
    const cfg = join(dir, "config.json");
    writeFileSync(
      cfg,
      JSON.stringify(
        baseConfig(dir, {
          policy: {
            ...DEMO_POLICY,
            limits: { ...DEMO_POLICY.limits, rate_limit: { per_principal_per_minute: RATE } },
            // One window for the whole test, however slow the machine: its end is the close.
            audit: { ...DEMO_POLICY.audit, refusal_window_s: 600 },
            // 2,250 refusals are what this test counts: the default refusal-flood rule (1,000 a
            // minute) would suspend the reader half-way and turn the rest into principal_suspended.
            alerts: { rules: [] },
          },
          // No call here reaches the worker: every one is refused before it would run.
          runtime: { start: "lazy" },
        }),
      ),
    );
    const server = await startHttpServer(cfg);
    const seen: Record<string, number> = {};
    const count = (code: string) => (seen[code] = (seen[code] ?? 0) + 1);
    let before = 0;
    try {
      before = auditRows(data).length;
      const reader = await connectHttp(server.url, TOKENS.reader);
      try {
        // Unknown models: refused after the rate step (each counts), then rate_limited.
        for (let b = 0; b < CHECKS / 50; b++) {
          const results = await Promise.all(
            Array.from({ length: 50 }, (_, i) =>
              reader.client.callTool({
                name: "check_model",
                arguments: { model: `nope-${(b * 50 + i) % MODELS}` },
              }),
            ),
          );
          for (const r of results) count(errorOf(r)?.code ?? "ok");
        }
        // load_model needs models:load: HTTP 403 before dispatch, audited by the gate.
        for (let b = 0; b < OUT_OF_SCOPE / 50; b++) {
          const results = await Promise.allSettled(
            Array.from({ length: 50 }, () =>
              reader.client.callTool({ name: "load_model", arguments: { model: "tiny-gpt2" } }),
            ),
          );
          for (const r of results) count(r.status === "rejected" ? "insufficient_scope" : "ok");
        }
      } finally {
        await reader.close();
      }
      // The bucket refills while the test runs (RATE a minute): a few more get past the rate.
      expect(Object.keys(seen).sort()).toEqual([
        "insufficient_scope",
        "rate_limited",
        "unknown_model",
      ]);
      expect(seen.unknown_model + seen.rate_limited).toBe(CHECKS);
      expect(seen.unknown_model).toBeGreaterThanOrEqual(RATE);
      expect(seen.rate_limited).toBeGreaterThanOrEqual(2_000);
      expect(seen.insufficient_scope).toBe(OUT_OF_SCOPE);
      // The first refusal of each window is on disk at once, before the window ends.
      const live = auditRows(data).filter((r) => r.principal === "reader");
      expect(live.some((r) => r.code === "rate_limited")).toBe(true);
      expect(live.some((r) => r.code === "insufficient_scope")).toBe(true);
    } finally {
      await server.stop();
    }

    // Closed: the counts of the open windows were written as aggregate records.
    const rows = auditRows(data);
    const grown = rows.length - before;
    const denied = rows.filter((r) => r.principal === "reader" && r.outcome === "denied");
    const refusals: Record<string, number> = {};
    for (const r of denied) refusals[r.code] = (refusals[r.code] ?? 0) + (r.count ?? 1);
    expect(refusals).toEqual(seen);
    // Per key and window: the first refusal and one aggregate. Keys: rate_limited (the reader),
    // insufficient_scope (the reader, load_model), unknown_model (one per digest).
    expect(denied.length).toBeLessThanOrEqual(2 * (2 + MODELS));
    expect(grown).toBe(denied.length);
    for (const a of denied.filter((r) => r.count !== undefined)) {
      const first = rows.find((r) => r.seq === a.first_seq);
      expect(first).toMatchObject({ principal: "reader", code: a.code, outcome: "denied" });
      expect(first!.count).toBeUndefined();
    }
    const limited = denied.find((r) => r.code === "rate_limited" && r.count !== undefined);
    expect(limited).toMatchObject({
      count: seen.rate_limited - 1,
      tools: { check_model: seen.rate_limited - 1 },
      tool: "check_model",
    });
    recordFigure("audit_growth_for_2250_refusals", {
      records: grown,
      refusals: CHECKS + OUT_OF_SCOPE,
    });

    const verify = await cli(cfg, "audit", "verify");
    expect(verify.code, verify.stdout + verify.stderr).toBe(0);
    const tail = await cli(cfg, "audit", "tail", "-n", "20");
    expect(tail.code, tail.stderr).toBe(0);
    expect(tail.stdout).toMatch(
      new RegExp(`\\(rate_limited\\) ×${seen.rate_limited - 1} more after #`),
    );
  });
});
