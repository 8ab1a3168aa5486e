// get_runtime_status when no worker can answer: a real `tpu-mcp stdio` server whose workers
// cannot start (a "python" that prints one line and exits; a remote worker whose TLS files are
// missing), the SDK's real Client. Status must answer, not fail with worker_unavailable, with
// every worker's state and last error and the device part marked unavailable with the reason.
import { chmodSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { scaled } from "../helpers/calibrate.js";
import { connectStdio, writeConfig } from "../helpers/server.js";
import { call } from "./scenario.js";

type Conn = Awaited<ReturnType<typeof connectStdio>>;

async function until<T>(what: string, fn: () => Promise<T | undefined>, ms = 60_000): Promise<T> {
  const end = Date.now() + scaled(ms);
  for (;;) {
    const v = await fn();
    if (v !== undefined) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

describe("get_runtime_status with no worker able to answer", () => {
  let dir: string;
  let python: string;
  const conns: Conn[] = [];

  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), "tpu-mcp-status-down-"));
    python = join(dir, "python");
    writeFileSync(python, "#!/bin/sh\necho 'boom: this python has no torch' >&2\nexit 1\n");
    chmodSync(python, 0o755);
  });
  afterAll(async () => {
    for (const c of conns) await c.close();
  });

  const status = async (conn: Conn) => {
    const r = await call(conn.client, "get_runtime_status", {});
    expect(r.isError, JSON.stringify(r.content)).toBeFalsy();
    return r.structuredContent as any;
  };

  it("the single default worker in a crash loop: answers while it restarts and once it has failed", async () => {
    const conn = await connectStdio(
      writeConfig(
        { runtime: { python, device: "cpu", max_restarts: 2, restart_window_s: 60 } },
        mkdtempSync(join(dir, "single-")),
      ),
    );
    conns.push(conn);
    const first = await status(conn);
    expect(first.device).toBeNull();
    expect(first.device_unavailable.code).toBe("worker_unavailable");
    expect(["restarting", "failed"]).toContain(first.worker.state);
    expect(first.worker.last_error).toMatch(/code 1|crashed/);
    // The crash loop ends in `failed`; status says so, with the supervisor's reason.
    const failed = await until("the worker to fail", async () => {
      const s = await status(conn);
      return s.worker.state === "failed" ? s : undefined;
    });
    expect(failed.worker.last_error).toMatch(/crashed 3 times/);
    expect(failed.device_unavailable.message).toMatch(/crashed 3 times/);
    expect(failed.jobs_running).toBe(0);
  });

  it("a pool whose workers are all down: every worker with its state and last error", async () => {
    const conn = await connectStdio(
      writeConfig(
        {
          runtime: {
            python,
            device: "cpu",
            max_restarts: 1,
            workers: [
              { name: "w0", device: "cpu" },
              {
                name: "r1",
                connect: "127.0.0.1:9",
                tls: {
                  ca: join(dir, "no-ca.crt"),
                  cert: join(dir, "no.crt"),
                  key: join(dir, "no.key"),
                },
                token_file: join(dir, "no-token"),
              },
            ],
          },
        },
        mkdtempSync(join(dir, "pool-")),
      ),
    );
    conns.push(conn);
    const s = await until("both workers down with a reason", async () => {
      const x = await status(conn);
      const byName = Object.fromEntries(x.workers.map((w: any) => [w.name, w]));
      return byName.w0?.last_error && byName.r1?.last_error ? x : undefined;
    });
    expect(s.device_unavailable.code).toBe("worker_unavailable");
    const byName = Object.fromEntries(s.workers.map((w: any) => [w.name, w]));
    expect(byName.w0.state).not.toBe("ready");
    expect(byName.w0.last_error).toMatch(/boom: this python has no torch|crashed/);
    expect(byName.r1.state).toBe("failed");
    expect(byName.r1.last_error).toMatch(/cannot read the TLS files or token/);
    expect(s.worker.last_error).toMatch(/r1: .*cannot read/);
    expect(s.loaded).toEqual([]);
  });
});
