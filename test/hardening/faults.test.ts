// Faults through the MCP surface: the worker killed mid-request, hung (SIGSTOP), out of memory
// under an address-space limit, crash-looping; the SQLite stores on a full or read-only disk;
// the server itself killed with a job running and an approval pending.
import { spawnSync } from "node:child_process";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { LoggingMessageNotificationSchema } from "@modelcontextprotocol/sdk/types.js";
import Database from "better-sqlite3";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { ERROR_CATALOGUE } from "../../tools/errors.js";
import { INITIALIZE, connectHttp, connectStdio, startHttpServer } from "../helpers/server.js";
import {
  auditRows,
  baseConfig,
  cleanupTemp,
  cli,
  DEMO_POLICY,
  errorOf,
  inProcess,
  LEAK_RE,
  PYTHON,
  pythonWrapper,
  recordFigure,
  ROOT,
  sleep,
  tempDir,
  TOKENS,
  until,
} from "./helpers.js";
import { scaled } from "../helpers/calibrate.js";

const T = { timeout: scaled(300_000) };
const call = (client: any, name: string, args: Record<string, unknown> = {}, opts = {}) =>
  client.callTool({ name, arguments: args }, undefined, {
    timeout: scaled(300_000),
    ...opts,
  }) as Promise<any>;

function writeCfg(dir: string, extra: Record<string, any> = {}): string {
  const file = join(dir, "config.json");
  writeFileSync(file, JSON.stringify(baseConfig(dir, extra), null, 2));
  return file;
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** A clean tool error: a catalogue code, a message without paths or stack frames. */
function expectCleanError(r: any, codes?: string[]) {
  expect(r.isError, JSON.stringify(r).slice(0, 300)).toBe(true);
  const e = errorOf(r)!;
  expect(Object.keys(ERROR_CATALOGUE)).toContain(e.code);
  if (codes) expect(codes, `${e.code}: ${e.message}`).toContain(e.code);
  expect(r.content[0].text).not.toMatch(LEAK_RE);
}

afterAll(() => cleanupTemp());

describe("worker killed with SIGKILL mid-request", () => {
  it(
    "answers the caller worker_died within seconds, replaces the worker, reports the lost model and recovers",
    T,
    async () => {
      const dir = tempDir();
      const conn = await connectStdio(writeCfg(dir));
      try {
        const c = conn.client;
        const notices: any[] = [];
        c.setNotificationHandler(LoggingMessageNotificationSchema, (n) => {
          notices.push(n.params);
        });
        expect((await call(c, "load_model", { model: "mnist-cnn" })).isError).toBeFalsy();
        const before = (await call(c, "get_runtime_status")).structuredContent.worker;
        expect(before.pid).toBeGreaterThan(0);

        // A 60-second benchmark: the worker is certainly busy with it when it is killed.
        const pending = call(c, "run_benchmark", {
          model: "mnist-cnn",
          duration_s: 60,
          warmup: 0,
        }).then((r) => ({ r, t: Date.now() }));
        await sleep(2500);
        const killedAt = Date.now();
        process.kill(before.pid, "SIGKILL");
        const { r, t } = await pending;
        const answerMs = t - killedAt;
        expectCleanError(r, ["worker_died"]);
        expect(answerMs).toBeLessThan(scaled(5_000));

        // The server keeps serving while the worker restarts.
        expect((await c.listTools()).tools.length).toBe(9);
        expect((await call(c, "list_models")).isError).toBeFalsy();

        const after = await until(
          async () => {
            const s = await call(c, "get_runtime_status");
            return !s.isError && s.structuredContent.worker.state === "ready"
              ? s.structuredContent
              : undefined;
          },
          60_000,
          200,
        );
        expect(after.worker.pid).not.toBe(before.pid);
        expect(after.worker.restarts).toBeGreaterThanOrEqual(1);
        expect(after.worker.lost_models).toEqual(["mnist-cnn"]);
        expect(after.loaded).toEqual([]);
        expect(alive(before.pid)).toBe(false);
        // Every session hears about the restart as an MCP log message.
        expect(
          notices.some(
            (n) => n.level === "warning" && /worker restarted/.test(JSON.stringify(n.data)),
          ),
        ).toBe(true);

        // The lost model is not silently back: inference says model_not_loaded until it is loaded.
        const x = { dtype: "float32", shape: [1, 1, 28, 28], data: Array(784).fill(0.5) };
        expectCleanError(await call(c, "run_inference", { model: "mnist-cnn", tensors: [x] }), [
          "model_not_loaded",
        ]);
        expect((await call(c, "load_model", { model: "mnist-cnn" })).isError).toBeFalsy();
        const ok = await call(c, "run_inference", { model: "mnist-cnn", tensors: [x] });
        expect(ok.isError, JSON.stringify(ok).slice(0, 300)).toBeFalsy();
        const recoveryMs = Date.now() - killedAt;
        recordFigure("worker_kill", {
          caller_answered_ms: answerMs,
          kill_to_next_successful_inference_ms: recoveryMs,
        });
        expect(recoveryMs).toBeLessThan(scaled(120_000));
      } finally {
        await conn.close();
      }
    },
  );
});

describe("worker hung (SIGSTOP)", () => {
  it(
    "is detected by heartbeats, killed and restarted; a caller in flight gets an error, not a hang",
    T,
    async () => {
      const dir = tempDir();
      const conn = await connectStdio(
        writeCfg(dir, { runtime: { heartbeat_interval_s: 1, heartbeat_timeout_s: 3 } }),
      );
      let stopped = 0;
      try {
        const c = conn.client;
        expect((await call(c, "load_model", { model: "mnist-cnn" })).isError).toBeFalsy();
        const pid = (await call(c, "get_runtime_status")).structuredContent.worker.pid as number;
        process.kill(pid, "SIGSTOP");
        stopped = pid;
        const t0 = Date.now();
        const x = { dtype: "float32", shape: [2, 1, 28, 28], data: Array(2 * 784).fill(0.1) };
        const r = await call(
          c,
          "run_inference",
          { model: "mnist-cnn", tensors: [x] },
          { timeout: scaled(60_000) },
        );
        const answeredMs = Date.now() - t0;
        expectCleanError(r, ["worker_died", "timeout"]);
        expect(answeredMs).toBeLessThan(scaled(30_000));
        await until(() => !alive(pid), 10_000);
        const s = await until(
          async () => {
            const s = await call(c, "get_runtime_status");
            return !s.isError && s.structuredContent.worker.state === "ready"
              ? s.structuredContent
              : undefined;
          },
          60_000,
          200,
        );
        expect(s.worker.pid).not.toBe(pid);
        expect(s.worker.lost_models).toEqual(["mnist-cnn"]);
        recordFigure("worker_hang", { caller_answered_ms: answeredMs });
      } finally {
        if (stopped && alive(stopped)) {
          process.kill(stopped, "SIGKILL");
        }
        await conn.close();
      }
    },
  );
});

describe("worker out of memory (address-space limit)", () => {
  it(
    "answers out_of_memory (or worker_died) cleanly and keeps serving the same model",
    T,
    async () => {
      const dir = tempDir();
      // A one-model catalog whose batch limit lets one request need far more memory than the limit.
      const cat = JSON.parse(readFileSync(join(ROOT, "runtime/catalog.builtin.json"), "utf8"));
      cat.model_roots = [join(ROOT, ".data/models")];
      cat.models = cat.models.filter((m: any) => m.id === "mnist-cnn");
      cat.models[0].limits.max_batch = 100_000;
      writeFileSync(join(dir, "catalog.json"), JSON.stringify(cat));
      // 1.3 GB of address space: torch and the model fit (about 0.9 GB), a batch of 8000 does not.
      const python = pythonWrapper(dir, `ulimit -v 1300000 || exit 1\nexec ${PYTHON} "$@"`);
      const h = await inProcess(
        baseConfig(dir, { runtime: { python, catalog: join(dir, "catalog.json") } }),
      );
      try {
        const c = await h.connect({ id: "t", scopes: ["admin"], via: "stdio" });
        expect((await call(c, "load_model", { model: "mnist-cnn" })).isError).toBeFalsy();
        const n = 8000;
        const big = Buffer.alloc(n * 784 * 4).toString("base64");
        const r = await call(c, "run_inference", {
          model: "mnist-cnn",
          tensors: [{ dtype: "float32", shape: [n, 1, 28, 28], data_b64: big }],
        });
        expectCleanError(r, ["out_of_memory", "worker_died"]);
        // Recovered: a small request on the same server succeeds (after reloading if the worker died).
        if (errorOf(r)!.code === "worker_died") {
          await until(
            async () => !(await call(c, "load_model", { model: "mnist-cnn" })).isError,
            60_000,
            500,
          );
        }
        const ok = await call(c, "run_inference", {
          model: "mnist-cnn",
          tensors: [{ dtype: "float32", shape: [1, 1, 28, 28], data: Array(784).fill(0) }],
        });
        expect(ok.isError, JSON.stringify(ok).slice(0, 300)).toBeFalsy();
      } finally {
        await h.close();
      }
    },
  );
});

describe("worker crash loop", () => {
  it(
    "ends in worker_unavailable while tools/list, /healthz and /metrics keep answering",
    T,
    async () => {
      const dir = tempDir();
      const python = pythonWrapper(dir, "echo 'boom' >&2\nexit 1");
      const server = await startHttpServer(
        writeCfg(dir, { runtime: { python, max_restarts: 2, restart_window_s: 60 } }),
      );
      try {
        const base = server.url.replace(/\/mcp$/, "");
        const conn = await connectHttp(server.url, server.token);
        // Status answers throughout (issue 23): the worker failed, why, and the device part
        // marked unavailable with the supervisor's reason; it never fails itself.
        const r = await until(
          async () => {
            const r = await call(conn.client, "get_runtime_status");
            expect(r.isError, JSON.stringify(r.content)).toBeFalsy();
            return r.structuredContent.worker.state === "failed" ? r : undefined;
          },
          60_000,
          250,
        );
        expect(r.structuredContent.device_unavailable.code).toBe("worker_unavailable");
        expect(r.structuredContent.worker.last_error).toMatch(/crashed 3 times/);
        expect((await conn.client.listTools()).tools.length).toBe(9);
        // The catalog is still listed, every model unavailable with the reason.
        const lm = await call(conn.client, "list_models");
        expect(lm.isError).toBeFalsy();
        for (const m of lm.structuredContent.models) {
          expect(m.available).toBe(false);
          expect(m.problem).toMatch(/worker is unavailable/);
        }
        expectCleanError(await call(conn.client, "load_model", { model: "mnist-cnn" }), [
          "worker_unavailable",
        ]);
        expect((await fetch(`${base}/healthz`)).status).toBe(200);
        expect((await fetch(`${base}/readyz`)).status).toBe(503);
        expect((await fetch(`${base}/metrics`)).status).toBe(200);
        await conn.close();
      } finally {
        await server.stop();
      }
    },
  );
});

/**
 * Mounts a small tmpfs (root) so the stores can really hit a full or read-only disk; mode 0700,
 * as the server refuses a data directory others may write.
 */
function mountTmpfs(dir: string, size: string): boolean {
  if (process.getuid?.() !== 0) return false;
  mkdirSync(dir, { recursive: true });
  return (
    spawnSync("mount", ["-t", "tmpfs", "-o", `size=${size},mode=0700`, "tmpfs", dir]).status === 0
  );
}
const canMount = (() => {
  if (process.platform !== "linux" || process.getuid?.() !== 0) return false;
  const probe = join(tempDir("tpu-mcp-mnt-"), "m");
  const ok = mountTmpfs(probe, "1m");
  if (ok) spawnSync("umount", [probe]);
  return ok;
})();

describe.skipIf(!canMount)("SQLite stores on a full or read-only disk (tmpfs)", () => {
  it(
    "refuses calls cleanly, executes nothing unaudited, and leaves an audit chain that verifies",
    T,
    async () => {
      const dir = tempDir();
      const data = join(dir, "data");
      expect(mountTmpfs(data, "3m")).toBe(true);
      const cfgFile = writeCfg(dir);
      const h = await inProcess(JSON.parse(readFileSync(cfgFile, "utf8")));
      try {
        const c = await h.connect({ id: "local-user", scopes: ["admin"], via: "stdio" });
        expect((await call(c, "list_models")).isError).toBeFalsy();
        expect((await call(c, "load_model", { model: "mnist-cnn" })).isError).toBeFalsy();
        const x = { dtype: "float32", shape: [1, 1, 28, 28], data: Array(784).fill(0.5) };

        // 1. Disk full.
        const filler = join(data, "filler");
        spawnSync("dd", ["if=/dev/zero", `of=${filler}`, "bs=64k"], { stdio: "ignore" });
        const full: any[] = [];
        for (let i = 0; i < 30; i++) {
          full.push(
            await call(c, "run_inference", {
              model: "mnist-cnn",
              tensors: [x],
              approval_id: undefined,
            }),
          );
          full.push(await call(c, "list_models"));
        }
        full.push(await call(c, "unload_model", { model: "mnist-cnn" }));
        // With no room for the audit record, nothing runs: every call is refused (fail closed),
        // each with a clean error, and none answers as if it had run.
        const refusedFull = full.filter((r) => r.isError);
        expect(refusedFull).toHaveLength(full.length);
        for (const r of full) expectCleanError(r);
        // The model is still loaded unless the unload was audited (nothing destructive runs unaudited).
        const unloadRes = full[full.length - 1];
        rmSync(filler);

        // 2. Back to normal: the chain verifies, every executed unload is in the trail, calls work.
        const rows = auditRows(data);
        const v = await cli(cfgFile, "audit", "verify");
        expect(v.code, v.stdout + v.stderr).toBe(0);
        if (!unloadRes.isError) {
          expect(rows.some((r) => r.tool === "unload_model" && r.outcome === "allowed")).toBe(true);
        }
        expect((await call(c, "list_models")).isError).toBeFalsy();
        await h.close();

        // 3. Read-only: the same stores bind-mounted read-only (a volume that went read-only).
        // A read-only volume cannot be remounted under open files, so the server is started on it.
        const ro = join(dir, "ro");
        mkdirSync(ro);
        expect(spawnSync("mount", ["--bind", data, ro]).status).toBe(0);
        try {
          expect(spawnSync("mount", ["-o", "remount,ro,bind", ro]).status).toBe(0);
          const roCfg = join(dir, "config-ro.json");
          writeFileSync(
            roCfg,
            JSON.stringify({ ...JSON.parse(readFileSync(cfgFile, "utf8")), data_dir: ro }),
          );
          const init = JSON.stringify(INITIALIZE);
          const r = spawnSync(
            process.execPath,
            [join(ROOT, "bin/tpu-mcp.js"), "stdio", "--config", roCfg],
            { input: init + "\n", timeout: scaled(60_000), encoding: "utf8" },
          );
          // Refused at start with a one-line reason: no stack trace, nothing served half-broken.
          expect(r.status).not.toBe(0);
          expect(r.stdout).toBe("");
          expect(r.stderr).toMatch(/database/);
          expect(r.stderr).not.toMatch(/\bat [\w.<>]+ \(|\.ts:\d+/);
        } finally {
          spawnSync("umount", [ro]);
        }
        // Nothing was corrupted by either episode.
        const v2 = await cli(cfgFile, "audit", "verify");
        expect(v2.code, v2.stdout + v2.stderr).toBe(0);
        recordFigure("disk_faults", {
          calls_during_full_disk: full.length,
          refused_during_full_disk: refusedFull.length,
        });
      } finally {
        await h.close();
        spawnSync("umount", [data]);
      }
    },
  );
});

describe("server killed with a job running and an approval pending", () => {
  it(
    "reports the job interrupted (never run twice) and keeps the approval usable exactly once",
    T,
    async () => {
      const dir = tempDir();
      const policy = {
        ...DEMO_POLICY,
        approvals: {
          ...DEMO_POLICY.approvals,
          rules: [{ tool: "load_model", when: { min_weight_bytes: 50_000_000 } }],
        },
      };
      const cfg = writeCfg(dir, { policy });
      let server = await startHttpServer(cfg);
      let agent = await connectHttp(server.url, TOKENS.agent);
      const asked = await call(agent.client, "load_model", { model: "all-minilm-l6-v2" });
      expect(errorOf(asked)?.code).toBe("approval_required");
      const approvalId = errorOf(asked)!.details.approval_id;
      const job = await call(agent.client, "run_benchmark", {
        model: "mnist-cnn",
        duration_s: 60,
        warmup: 0,
        wait: false,
      });
      expect(job.isError, JSON.stringify(job)).toBeFalsy();
      const jobId = job.structuredContent.job_id;
      await sleep(2000);
      const workerPid = (await call(agent.client, "get_runtime_status")).structuredContent.worker
        .pid;
      expect(
        (await call(agent.client, "get_job", { job_id: jobId })).structuredContent.status,
      ).toBe("running");
      await agent.close().catch(() => {});
      // A crash, not a shutdown: no chance to tidy up.
      server.proc.kill("SIGKILL");
      await new Promise((r) => server.proc.once("exit", r));
      // The orphaned worker notices its parent is gone and exits (stdin EOF).
      try {
        await until(() => !alive(workerPid), 20_000, 200);
      } finally {
        if (alive(workerPid)) process.kill(workerPid, "SIGKILL");
      }

      server = await startHttpServer(cfg);
      try {
        agent = await connectHttp(server.url, TOKENS.agent);
        const j = await call(agent.client, "get_job", { job_id: jobId });
        expect(j.structuredContent.status).toBe("interrupted");
        await sleep(1500);
        const st = (await call(agent.client, "get_runtime_status")).structuredContent;
        expect(st.jobs_running).toBe(0);
        expect(
          (await call(agent.client, "get_job", { job_id: jobId })).structuredContent.status,
        ).toBe("interrupted");
        // No benchmark report was ever stored for it: it was not resumed or re-run.
        const reports = new Database(join(dir, "data", "reports.db"), { readonly: true });
        expect(
          (reports.prepare("SELECT COUNT(*) AS n FROM benchmark_reports").get() as any).n,
        ).toBe(0);
        reports.close();

        const ok = await cli(cfg, "approvals", "approve", approvalId, "--token", TOKENS.operator);
        expect(ok.code, ok.stderr).toBe(0);
        const done = await call(agent.client, "load_model", {
          model: "all-minilm-l6-v2",
          approval_id: approvalId,
        });
        expect(done.isError, JSON.stringify(done).slice(0, 300)).toBeFalsy();
        await call(agent.client, "unload_model", { model: "all-minilm-l6-v2" });
        expectCleanError(
          await call(agent.client, "load_model", {
            model: "all-minilm-l6-v2",
            approval_id: approvalId,
          }),
          ["approval_used"],
        );
        const v = await cli(cfg, "audit", "verify");
        expect(v.code, v.stdout).toBe(0);
        await agent.close();
      } finally {
        await server.stop();
      }
    },
  );
});
