// Issue 32, item 3: the cap-and-kill scenario of budget_cap.test.ts with the budget set in money
// (limits.budget.money_per_window, priced by `pricing`): eight concurrent benchmarks whose real
// cost is about three times their estimate are admitted on their estimated cost, metered at the
// CPU's price and stopped when the money runs out, with what they charged (whole micro-units on
// the principal's money line in policy.db) within the limit plus the price of one stop latency
// (1 s on a quiet machine, scaled by its slowdown as the seconds twin does). The same server shows
// money beside device-seconds wherever it shows device-seconds: the refusal, the stop, the
// estimate in the audit, the benchmark report (JSON and markdown), the approval message, the
// approval webhook and the console API.
//
// A real HTTP server and worker, real SDK clients (test/helpers/budget_cap.ts has the scenario).
import { writeFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MONEY_KEY_SUFFIX } from "../../policies/gate/budget_lines.js";
import { ADMIN, BENCH, charges, EST, LIMIT, N, startCapServer } from "../helpers/budget_cap.js";
import { scaled, slowdown } from "../helpers/calibrate.js";
import { connectHttp, errorOf, type HttpServerProc } from "../helpers/server.js";
import { auditRows, cleanupTemp, recordFigure, tempDir, until } from "../hardening/helpers.js";
import { call } from "./scenario.js";

/** 45 USD per CPU chip-hour: 0.0125 USD (12 500 micro-units) per device-second. */
const PER_CHIP_HOUR = 45;
const MICROS_PER_S = 12_500;
/** The seconds twin's limit, in money: three estimates and a half of what CPU time costs. */
const MONEY_LIMIT = Math.round(LIMIT * MICROS_PER_S) / 1e6;
/** The stop latency (as budget_cap.test.ts), priced: what the cap may be passed by. */
const STOP_LATENCY_S = slowdown();
const SECRET = "whsec-money-0123456789abcdef";

const TOKENS = {
  runner: "money-runner-token-0123456789",
  asker: "money-asker-token-01234567890",
};
const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);

/** A webhook receiver on loopback that keeps every body it is sent. */
function startReceiver(): Promise<{ url: string; bodies: any[]; close(): Promise<void> }> {
  const bodies: any[] = [];
  const server: Server = createServer(async (req, res) => {
    let raw = "";
    for await (const c of req) raw += c;
    bodies.push(JSON.parse(raw));
    res.writeHead(200).end();
  });
  return new Promise((resolve) =>
    server.listen(0, "127.0.0.1", () =>
      resolve({
        url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/hooks`,
        bodies,
        close: () =>
          new Promise<void>((r) => {
            server.closeAllConnections();
            server.close(() => r());
          }),
      }),
    ),
  );
}

describe("a budget in money is a cap: the cap-and-kill scenario priced", () => {
  const dir = tempDir("tpu-mcp-budget-money-");
  const dataDir = join(dir, "data");
  let server: HttpServerProc;
  let rx: Awaited<ReturnType<typeof startReceiver>>;

  beforeAll(async () => {
    rx = await startReceiver();
    writeFileSync(join(dir, "webhook.secret"), SECRET + "\n", { mode: 0o600 });
    recordFigure("budget_cap_money_setup", { EST, LIMIT, MONEY_LIMIT, N });
    server = await startCapServer(dir, {
      pricing: { currency: "USD", per_chip_hour: { cpu: PER_CHIP_HOUR } },
      budget: { money_per_window: MONEY_LIMIT, window_s: 3600 },
      tokens: TOKENS,
      approvals: {
        rules: [{ tool: "run_benchmark", principals: ["asker"] }],
        elicitation: false,
        notify: [{ url: rx.url, secret_file: "webhook.secret" }],
      },
    });
  }, scaled(180_000));

  afterAll(async () => {
    await server?.stop();
    await rx?.close();
    cleanupTemp();
  });

  it(
    "holds 8 concurrent under-estimated benchmarks to the money budget plus the price of one stop latency",
    async () => {
      const clients = await Promise.all(
        Array.from({ length: 8 }, () => connectHttp(server.url, TOKENS.runner)),
      );
      try {
        const started = await call(clients[0].client, "run_benchmark", { ...BENCH, wait: false });
        expect(started.isError, JSON.stringify(started)).toBeFalsy();
        const jobId = started.structuredContent.job_id as string;
        const answers = await Promise.all(
          clients.slice(1).map((c) => call(c.client, "run_benchmark", BENCH)),
        );
        const job = await until(async () => {
          const j = (await call(clients[0].client, "get_job", { job_id: jobId })).structuredContent;
          return j.status !== "running" && j;
        }, scaled(120_000));

        // Admitted on their estimated cost, priced at the CPU's rate (the audit's estimate).
        const allowed = auditRows(dataDir).filter(
          (r) => r.principal === "runner" && r.tool === "run_benchmark" && r.outcome === "allowed",
        );
        expect(allowed.length).toBeGreaterThanOrEqual(2);
        expect(allowed.length).toBeLessThanOrEqual(3);
        for (const a of allowed) {
          expect(a.estimate.device_seconds).toBeCloseTo(EST, 2);
          expect(a.estimate.cost).toMatchObject({
            currency: "USD",
            device_kind: "cpu",
            price_per_chip_hour: "45.00",
          });
          expect(a.estimate.cost.amount_micros).toBe(
            Math.round(a.estimate.device_seconds * MICROS_PER_S),
          );
        }
        // The others refused before they ran, in money.
        const refused = answers.filter((a) => a.isError);
        expect(refused.length).toBe(8 - allowed.length);
        for (const r of refused) {
          const e = errorOf(r)!;
          expect(e.code).toBe("budget_exceeded");
          expect(e.message).toMatch(/this call costs ~[\d.]+ USD, [\d.]+ USD of [\d.]+ USD per/);
          expect(e.details.currency).toBe("USD");
        }

        // Stopped by the budget, with partial reports that price what they measured.
        expect(job.status, JSON.stringify(job)).toBe("succeeded");
        expect(job.result.stopped).toBe("budget");
        const reports = [
          job.result,
          ...answers.filter((a) => !a.isError).map((a) => a.structuredContent),
        ];
        expect(reports.length).toBe(allowed.length);
        for (const r of reports) {
          expect(r.stopped).toBe("budget");
          for (const c of r.configs) expect(c.iterations).toBeLessThan(N);
          expect(r.cost).toMatchObject({ currency: "USD", device_kind: "cpu" });
          const measuredS = sum(r.configs.map((c: any) => c.measured_s));
          // Each configuration's window priced to the millisecond (as charges are): within 0.5 ms
          // of its price per configuration.
          expect(
            Math.abs(Number(r.cost.measured) * 1e6 - measuredS * MICROS_PER_S),
          ).toBeLessThanOrEqual(0.0005 * MICROS_PER_S * r.configs.length + 1);
        }
        const md = await clients[1].client.readResource({ uri: reports[1].markdown_uri });
        expect(String((md.contents[0] as { text: string }).text)).toMatch(
          /Cost: [\d.]+ USD for [\d.]+ s measured on cpu at 45\.00 USD per chip-hour/,
        );

        // Charged in whole micro-units on the money line, within the limit plus the price of
        // one stop latency; nothing on a device-seconds line.
        const ended = await until(() => {
          const c = charges(dataDir, `runner${MONEY_KEY_SUFFIX}`);
          return c.length === allowed.length && c;
        }, scaled(30_000));
        for (const c of ended) expect(Number.isInteger(c)).toBe(true);
        expect(charges(dataDir, "runner")).toEqual([]);
        const used = sum(ended);
        const limitMicros = Math.round(MONEY_LIMIT * 1e6);
        recordFigure("budget_cap_money_8_concurrent", {
          limit_usd: MONEY_LIMIT,
          charged_usd: used / 1e6,
          overrun_usd: (used - limitMicros) / 1e6,
          overrun_s_at_price: (used - limitMicros) / MICROS_PER_S,
          charges_micros: ended,
        });
        expect(used).toBeLessThanOrEqual(limitMicros + STOP_LATENCY_S * MICROS_PER_S);
        // The stops say so in money.
        const failed = auditRows(dataDir).filter(
          (r) => r.principal === "runner" && r.tool === "run_benchmark" && r.outcome === "failed",
        );
        const stops = failed.filter((r) => r.code === "budget_exceeded");
        expect(stops.length).toBeGreaterThanOrEqual(allowed.length);
        expect(stops.some((r) => /ran out \([\d.]+ USD per 3600 s window/.test(r.reason))).toBe(
          true,
        );
      } finally {
        await Promise.all(clients.map((c) => c.close()));
      }
    },
    scaled(300_000),
  );

  it(
    "shows the estimate in money in the approval message, the webhook and the console API",
    async () => {
      const asker = await connectHttp(server.url, TOKENS.asker);
      try {
        const r = await call(asker.client, "run_benchmark", { ...BENCH, batch_sizes: [3] });
        const e = errorOf(r)!;
        expect(e.code).toBe("approval_required");
        expect(e.message).toMatch(/estimate: ~[\d.]+ device-seconds \(~[\d.]+ USD\)/);
        const id = e.details.approval_id as string;

        const hook = await until(
          () => rx.bodies.find((b) => b.approval?.id === id),
          scaled(30_000),
        );
        expect(hook.text).toMatch(/device-s \(~[\d.]+ USD\)/);
        expect(hook.approval.estimate.cost).toMatchObject({ currency: "USD", device_kind: "cpu" });

        const base = server.url.replace(/\/mcp$/, "");
        const signIn = await fetch(`${base}/console/api/session`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ token: ADMIN }),
        });
        expect(signIn.status).toBe(200);
        const cookie = (signIn.headers.get("set-cookie") ?? "").split(";")[0];
        const listed = await (
          await fetch(`${base}/console/api/approvals`, { headers: { cookie } })
        ).json();
        const shown = JSON.stringify(listed);
        expect(shown).toContain(id);
        expect(shown).toMatch(/"cost":\{"currency":"USD","amount":"[\d.]+"/);
      } finally {
        await asker.close();
      }
    },
    scaled(120_000),
  );
});
