// One worker per chip on the simulated TPU host (issues 10 + 12 joined): the REAL server
// (`tpu-mcp stdio`) with .venv-tpu's python (the real torch-tpu 0.2.0 wheel) and the simulated
// host's start-up hook on its environment; a real MCP client reads get_runtime_status and
// routes a load to a chip. Run by `npm run test:tpu-sim`.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CLI, ROOT, errorOf } from "../helpers/server.js";
import { pyRun, simEnv, tpuPython as setupTpuPython } from "./sim.js";
import { scaled } from "../helpers/calibrate.js";

let dir: string;
let tpuPython: string;

async function serve(host: string, runtime: Record<string, unknown>) {
  const config = join(dir, `config-${Math.random().toString(36).slice(2)}.json`);
  writeFileSync(
    config,
    JSON.stringify({
      data_dir: join(dir, `data-${Math.random().toString(36).slice(2)}`),
      log_level: "warn",
      runtime: {
        python: tpuPython,
        catalog: join(ROOT, "runtime/catalog.builtin.json"),
        start: "eager",
        ...runtime,
      },
    }),
  );
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: [CLI, "stdio", "--config", config],
    cwd: ROOT,
    env: simEnv(host, dir),
    stderr: "pipe",
  });
  let stderr = "";
  transport.stderr?.on("data", (c: Buffer) => (stderr += c.toString()));
  const client = new Client({ name: "tpu-sim-pool", version: "0.0.0" });
  await client.connect(transport);
  return { client, stderr: () => stderr, close: () => client.close() };
}

async function status(client: Client): Promise<any> {
  // Eager start: every worker says hello on its chip; wait until all are ready.
  let s: any;
  for (let i = 0; i < 240; i++) {
    const r: any = await client.callTool({ name: "get_runtime_status", arguments: {} });
    s = r.structuredContent ?? r;
    if (s?.workers?.length && s.workers.every((w: any) => w.state === "ready")) return s;
    if (s?.workers?.some((w: any) => w.state === "failed"))
      throw new Error(`a worker failed: ${JSON.stringify(s.workers)}`);
    await new Promise((r) => setTimeout(r, 500));
  }
  throw new Error(`the workers did not become ready: ${JSON.stringify(s).slice(0, 3000)}`);
}

function environOf(pid: number): Record<string, string> {
  const out: Record<string, string> = {};
  for (const kv of readFileSync(`/proc/${pid}/environ`, "latin1").split("\0")) {
    const i = kv.indexOf("=");
    if (i > 0) out[kv.slice(0, i)] = kv.slice(i + 1);
  }
  return out;
}

async function checkPool(host: string, runtime: Record<string, unknown>, chips: number) {
  const s = await serve(host, runtime);
  try {
    const st = await status(s.client);
    // One worker per chip, named in chip order.
    expect(st.workers.map((w: any) => [w.name, w.device, w.kind])).toEqual(
      Array.from({ length: chips }, (_, i) => [`w${i}`, `tpu:${i}`, "local"]),
    );
    // Each hello names its own chip (the worker reports it; the pool does not make it up).
    expect(st.workers.map((w: any) => w.chip)).toEqual(
      Array.from({ length: chips }, (_, i) => ({
        kind: "tpu",
        index: i,
        name: "TPU v6e",
        backend: "torch_tpu",
      })),
    );
    const pids = st.workers.map((w: any) => w.pid);
    expect(new Set(pids).size).toBe(chips);
    for (let i = 0; i < chips; i++) {
      const env = environOf(pids[i]);
      expect(env.TPU_VISIBLE_DEVICES, `w${i} (pid ${pids[i]})`).toBe(String(i));
    }
    // A load naming tpu:1 goes to w1; the simulated host cannot execute, so it fails there with
    // the catalogued error naming the worker and the chip, and the server keeps serving.
    const r: any = await s.client.callTool({
      name: "load_model",
      arguments: { model: "mnist-cnn", device: "tpu:1" },
    });
    expect(r.isError).toBe(true);
    const e = errorOf(r)!;
    expect(e.code).toBe("internal");
    expect(e.details.worker).toBe("w1");
    expect(e.message).toContain("w1 (tpu:1)");
    expect(e.message).toMatch(
      /load failed with an internal error \(RuntimeError\); see the worker log/,
    );
    // …and the worker log, tagged with w1, says why in libtpu's words.
    const why = s
      .stderr()
      .split("\n")
      .filter((l) => l.includes("No jellyfish device found"));
    expect(why.length, s.stderr().slice(-3000)).toBeGreaterThan(0);
    for (const l of why) expect(JSON.parse(l).worker).toBe("w1");
    const after = await status(s.client);
    expect(after.workers.map((w: any) => [w.name, w.calls, w.failures, w.pid])).toEqual(
      Array.from({ length: chips }, (_, i) => [`w${i}`, i === 1 ? 1 : 0, i === 1 ? 1 : 0, pids[i]]),
    );
  } catch (e) {
    throw new Error(`${(e as Error).message}\n--- server stderr ---\n${s.stderr().slice(-4000)}`);
  } finally {
    await s.close();
  }
}

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "tpu-sim-pool-"));
  tpuPython = setupTpuPython();
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe("one worker per chip on a simulated TPU v6e host", () => {
  it('runtime.workers: "per-device" on 3 chips', { timeout: scaled(600_000) }, async () => {
    const host = pyRun(["-m", "tpu_sim.host", join(dir, "host3"), "3", "v6e"]);
    await checkPool(host, { workers: "per-device" }, 3);
  });

  it(
    "runtime.workers unset with device auto (the default) on 2 chips",
    { timeout: scaled(600_000) },
    async () => {
      const host = pyRun(["-m", "tpu_sim.host", join(dir, "host2"), "2", "v6e"]);
      await checkPool(host, { device: "auto" }, 2);
    },
  );
});
