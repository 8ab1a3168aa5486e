// Bounded load on loopback: twice the server's capacity (concurrency + queue bounds) of mixed
// tool calls from several principals over HTTP for HARDENING_LOAD_S seconds (30 by default).
// Every admitted call must be answered, the excess refused at once with `busy`, /healthz must
// answer throughout, and the server's memory must stay flat.
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { connectHttp, startHttpServer } from "../helpers/server.js";
import {
  baseConfig,
  cleanupTemp,
  errorOf,
  recordFigure,
  sha256,
  sleep,
  tempDir,
} from "./helpers.js";
import { scaled } from "../helpers/calibrate.js";

const DURATION_S = Number(process.env.HARDENING_LOAD_S ?? 30);
const PRINCIPALS = ["load-a", "load-b", "load-c"];
const SCOPES = ["models:read", "models:load", "models:unload", "inference:run", "jobs:read"];
const CONC = 2;
const QUEUE = 2;
const TOOLS = ["list_models", "get_runtime_status", "run_inference"] as const;
/** Calls that can be running or queued at once, over the tools in the mix. */
const CAPACITY = TOOLS.length * (CONC + QUEUE);
const CLIENTS = 2 * CAPACITY;

function rssBytes(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return m ? Number(m[1]) * 1024 : NaN;
}

afterAll(() => cleanupTemp());

describe("bounded load over HTTP", () => {
  it(
    `${CLIENTS} clients (2 × capacity ${CAPACITY}) for ${DURATION_S} s: all admitted calls answered, excess busy, /healthz up, memory flat`,
    { timeout: (DURATION_S + 240) * 1000 },
    async () => {
      const dir = tempDir();
      const policy = {
        tokens: PRINCIPALS.map((id) => ({
          id,
          token_sha256: sha256(`${id}-token`),
          scopes: SCOPES,
        })),
        limits: {
          per_tool_concurrency: { run_inference: CONC },
          default_concurrency: CONC,
          queue_bound: { run_inference: QUEUE },
          default_queue_bound: QUEUE,
          rate_limit: { per_principal_per_minute: 1_000_000 },
        },
      };
      const cfg = join(dir, "config.json");
      writeFileSync(cfg, JSON.stringify(baseConfig(dir, { policy })));
      const server = await startHttpServer(cfg);
      const base = server.url.replace(/\/mcp$/, "");
      const conns: Awaited<ReturnType<typeof connectHttp>>[] = [];
      try {
        const setup = await connectHttp(server.url, "load-a-token");
        conns.push(setup);
        for (const model of ["mnist-cnn", "all-minilm-l6-v2"]) {
          const r: any = await setup.client.callTool(
            { name: "load_model", arguments: { model } },
            undefined,
            { timeout: scaled(300_000) },
          );
          expect(r.isError, JSON.stringify(r).slice(0, 300)).toBeFalsy();
        }
        for (let i = 0; i < CLIENTS; i++)
          conns.push(await connectHttp(server.url, `${PRINCIPALS[i % PRINCIPALS.length]}-token`));
        // Warm up once per tool so lazy allocations are not counted as growth.
        const mnistX = { dtype: "float32", shape: [4, 1, 28, 28], data: Array(4 * 784).fill(0.2) };
        const argsFor = (tool: string, i: number): Record<string, unknown> => {
          if (tool !== "run_inference") return {};
          return i % 2
            ? { model: "mnist-cnn", tensors: [mnistX] }
            : { model: "all-minilm-l6-v2", texts: ["a load test sentence", "another one"] };
        };
        for (const t of TOOLS) await setup.client.callTool({ name: t, arguments: argsFor(t, 0) });
        const rssStart = rssBytes(server.proc.pid!);

        // /healthz poller.
        let stop = false;
        let healthMax = 0;
        let healthBad = 0;
        let healthN = 0;
        const rssSamples: number[] = [];
        const sampler = setInterval(
          () => rssSamples.push(+(rssBytes(server.proc.pid!) / 2 ** 20).toFixed(1)),
          5_000,
        );
        const poller = (async () => {
          while (!stop) {
            const t0 = performance.now();
            const r = await fetch(`${base}/healthz`).catch(() => null);
            healthMax = Math.max(healthMax, performance.now() - t0);
            healthN++;
            if (r?.status !== 200) healthBad++;
            await r?.text();
            await sleep(100);
          }
        })();

        const stats = {
          sent: 0,
          ok: 0,
          busy: 0,
          other: 0,
          protocol: 0,
          busyMaxMs: 0,
          okMaxMs: 0,
          others: [] as string[],
        };
        const deadline = Date.now() + DURATION_S * 1000;
        await Promise.all(
          conns.slice(1).map(async (c, k) => {
            let i = k;
            while (Date.now() < deadline) {
              const tool = TOOLS[i++ % TOOLS.length];
              const t0 = performance.now();
              stats.sent++;
              try {
                const r: any = await c.client.callTool(
                  { name: tool, arguments: argsFor(tool, i) },
                  undefined,
                  { timeout: scaled(120_000) },
                );
                const ms = performance.now() - t0;
                const code = errorOf(r)?.code;
                if (!r.isError) {
                  stats.ok++;
                  stats.okMaxMs = Math.max(stats.okMaxMs, ms);
                } else if (code === "busy") {
                  stats.busy++;
                  stats.busyMaxMs = Math.max(stats.busyMaxMs, ms);
                  expect(errorOf(r)!.details?.retry_after_ms).toBeGreaterThan(0);
                  await sleep(20); // a polite client would wait retry_after_ms; this one hammers
                } else {
                  stats.other++;
                  if (stats.others.length < 5)
                    stats.others.push(`${tool}: ${code} ${errorOf(r)?.message}`);
                }
              } catch (e) {
                stats.protocol++;
                if (stats.others.length < 5)
                  stats.others.push(`${tool}: ${String(e).slice(0, 200)}`);
              }
            }
          }),
        );
        stop = true;
        clearInterval(sampler);
        await poller;
        await sleep(1000);
        (globalThis as any).gc?.();
        const rssEnd = rssBytes(server.proc.pid!);
        const answered = stats.ok + stats.busy + stats.other;
        const figures = {
          duration_s: DURATION_S,
          clients: CLIENTS,
          capacity: CAPACITY,
          principals: PRINCIPALS.length,
          calls_sent: stats.sent,
          calls_admitted_and_answered: stats.ok,
          calls_refused_busy: stats.busy,
          other_errors: stats.other,
          unanswered_or_protocol_errors: stats.protocol,
          max_busy_answer_ms: Math.round(stats.busyMaxMs),
          max_ok_answer_ms: Math.round(stats.okMaxMs),
          healthz_polls: healthN,
          healthz_max_ms: Math.round(healthMax),
          server_rss_start_mib: +(rssStart / 2 ** 20).toFixed(1),
          server_rss_end_mib: +(rssEnd / 2 ** 20).toFixed(1),
          server_rss_every_5s_mib: rssSamples,
        };
        recordFigure("load", figures);
        expect(stats.others, JSON.stringify(figures)).toEqual([]);
        expect(answered).toBe(stats.sent);
        expect(stats.ok).toBeGreaterThan(0);
        expect(stats.busy).toBeGreaterThan(0); // 2 × capacity must overflow the bounds
        // Generous bounds, scaled to this machine's load: a busy answer never waits for a slot;
        // /healthz never waits on the worker.
        expect(stats.busyMaxMs).toBeLessThan(scaled(2_000));
        expect(healthBad).toBe(0);
        expect(healthMax).toBeLessThan(scaled(2_000));
        expect(rssEnd).toBeLessThan(rssStart * 1.5 + 64 * 2 ** 20);
        // Still serving normally afterwards.
        const after: any = await setup.client.callTool({
          name: "get_runtime_status",
          arguments: {},
        });
        expect(after.isError).toBeFalsy();
        expect(after.structuredContent.worker.restarts).toBe(0);
      } finally {
        await Promise.all(conns.map((c) => c.close().catch(() => {})));
        await server.stop();
      }
    },
  );
});
