// `tpu-mcp doctor` starts its workers with exactly the server's worker options (threads, timeouts,
// heartbeats, paths): only the named doctor overrides differ (issue 19, item 5).
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import { afterAll, describe, expect, it } from "vitest";
import type { WorkerRuntime, WorkerRuntimeOptions } from "../../runtime/client.js";
import { baseRuntimeOptions } from "../../server/app/build_runtime.js";
import { parseConfig } from "../../server/config/config.js";
import { runDoctor } from "../../server/doctor/index.js";
import { tpuWorkerOptions } from "../../server/doctor/tpu.js";
import { DOCTOR_OVERRIDES } from "../../server/doctor/worker_options.js";
import { ROOT } from "../helpers/server.js";

const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-doctor-opts-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

// Settings that differ from every default, so a doctor that builds its own options shows.
const config = parseConfig(
  {
    data_dir: join(dir, "data"),
    runtime: {
      // Exists (the doctor checks before starting a worker); the inventory run simply fails.
      python: process.execPath,
      device: "cpu",
      threads: 3,
      request_timeout_s: 77,
      heartbeat_interval_s: 7,
      heartbeat_timeout_s: 33,
      stop_grace_s: 44,
      max_restarts: 9,
      restart_window_s: 99,
    },
  },
  { root: ROOT },
);

const { logger: _l, ...server } = baseRuntimeOptions(config, pino({ level: "silent" }));

describe("the doctors' worker options", () => {
  it("`tpu-mcp doctor` starts its worker with the server's options", async () => {
    const seen: WorkerRuntimeOptions[] = [];
    const io = { out: () => {}, err: () => {}, json: true };
    await runDoctor(config, io, (opts) => {
      seen.push(opts);
      return {
        ready: () => Promise.reject(new Error("not started in this test")),
        close: async () => {},
      } as unknown as WorkerRuntime;
    });
    expect(seen).toHaveLength(1);
    const { logger: _x, ...doctor } = seen[0]!;
    expect(doctor).toEqual({ ...server, ...DOCTOR_OVERRIDES });
    expect(doctor.extraArgs).toEqual([
      "--threads",
      "3",
      "--compile-cache",
      `${config.paths.data_dir}/compile-cache`,
      "--kept-dir",
      `${config.paths.data_dir}/kept`,
    ]);
    expect(doctor.heartbeatTimeoutMs).toBe(33_000);
    expect(doctor.stopGraceMs).toBe(44_000);
  });

  it("`tpu-mcp doctor --tpu` adds only the chip and its eager mode", () => {
    const env = { PATH: "/bin" };
    const { logger: _x, ...tpu } = tpuWorkerOptions(
      config,
      "tpu:1",
      "fused",
      env,
      pino({ level: "silent" }),
    );
    expect(tpu).toEqual({
      ...server,
      ...DOCTOR_OVERRIDES,
      device: "tpu:1",
      env,
      extraArgs: [
        "--threads",
        "3",
        "--compile-cache",
        `${config.paths.data_dir}/compile-cache`,
        "--kept-dir",
        `${config.paths.data_dir}/kept`,
        "--tpu-eager",
        "fused",
      ],
    });
  });
});
