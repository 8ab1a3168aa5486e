// The budget cap (issue 22): 8 concurrent benchmarks of one principal whose real cost is at
// least 2.5 × their estimate (test/helpers/budget_cap.ts: a worker test knob gives each
// iteration a floor of device time, the store of measured calls says the same work took 2.5 ×
// less), against a budget of 3.5 estimates. Prints the limit, what the budget charged and the overrun (what one
// stop latency cost), next to what the admitted calls would have used uncapped, and one
// benchmark stopped by call_timeout_s the same way. The same scenario as the e2e test.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  BENCH,
  charges,
  EST,
  FLOOR_S,
  LIMIT,
  N,
  startCapServer,
  TIMEOUT,
  TIMEOUT_BATCH,
  TOKENS,
} from "../test/helpers/budget_cap.js";
import { connectHttp } from "../test/helpers/server.js";
import { section, type SectionResult } from "./lib/report.js";

async function settledCharges(dataDir: string, line: string, n: number): Promise<number[]> {
  for (let i = 0; i < 300; i++) {
    const c = charges(dataDir, line);
    if (c.length >= n) return c;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`${line}: ${n} charges never settled`);
}

export async function runBudget(): Promise<SectionResult> {
  const s = section("budget");
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-bench-budget-"));
  const dataDir = join(dir, "data");
  const server = await startCapServer(dir);
  try {
    const clients = await Promise.all(
      Array.from({ length: 8 }, () => connectHttp(server.url, TOKENS.runner)),
    );
    let answers: any[];
    try {
      answers = await Promise.all(
        clients.map((c) =>
          c.client.callTool({ name: "run_benchmark", arguments: BENCH }, undefined, {
            timeout: 600_000,
          }),
        ),
      );
    } finally {
      await Promise.all(clients.map((c) => c.close()));
    }
    const admitted = answers.filter((a) => !a.isError);
    const stopped = admitted.filter((a) => a.structuredContent?.stopped === "budget");
    const used = await settledCharges(dataDir, "runner", admitted.length);
    const charged = used.reduce((a, b) => a + b, 0);
    // Uncapped by the budget, each would have run its whole window (at least (warmup +
    // iterations) × 2 waits), or to the scenario's call_timeout_s where that comes first.
    const floor = admitted.length * Math.min(FLOOR_S, TIMEOUT);
    s.row("budget limit", `${LIMIT.toFixed(3)} s`, `3.5 × the estimate ${EST} s`);
    s.row(
      "8 concurrent benchmarks",
      `${admitted.length} admitted, ${8 - admitted.length} refused`,
      `${stopped.length} stopped with partial reports (stopped: "budget"), iterations ` +
        `${stopped.map((a) => a.structuredContent.configs[0]?.iterations ?? 0).join(", ")} of ${N}`,
    );
    s.row(
      "charged",
      `${charged.toFixed(3)} s`,
      `per call ${used.map((x) => x.toFixed(3)).join(", ")} s; without the cap ≥ ${floor.toFixed(1)} s (each to call_timeout_s)`,
    );
    s.row("overrun (charged − limit)", `${(charged - LIMIT).toFixed(3)} s`, "target ≤ 1 s");
    s.fig("limit_s", LIMIT);
    s.fig("charged_s", charged);
    s.fig("overrun_s", charged - LIMIT);
    s.fig("admitted", admitted.length);
    s.fig("stopped", stopped.length);

    const slow = await connectHttp(server.url, TOKENS.slow);
    try {
      const r = (await slow.client.callTool(
        { name: "run_benchmark", arguments: { ...BENCH, batch_sizes: [TIMEOUT_BATCH] } },
        undefined,
        { timeout: 600_000 },
      )) as any;
      const [t] = await settledCharges(dataDir, "slow", 1);
      s.row(
        "call_timeout_s",
        `${TIMEOUT.toFixed(3)} s → charged ${t.toFixed(3)} s`,
        `overrun ${(t - TIMEOUT).toFixed(3)} s; stopped: ${r.structuredContent?.stopped ?? "no"}`,
      );
      s.fig("timeout_overrun_s", t - TIMEOUT);
    } finally {
      await slow.close();
    }
  } finally {
    await server.stop();
    rmSync(dir, { recursive: true, force: true });
  }
  return s.result();
}
