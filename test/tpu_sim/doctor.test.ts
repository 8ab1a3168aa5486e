// `tpu-mcp doctor --tpu` and `tpu-mcp doctor` on the simulated TPU host (the real torch-tpu
// 0.2.0 wheel in .venv-tpu; only the PCI/VFIO scan and the accelerator memory/sync calls faked,
// see runtime/worker/tpu_sim/hook/sitecustomize.py). Run by `npm run test:tpu-sim`.
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { pyRun, simEnv as simHostEnv, tpuPython as setupTpuPython } from "./sim.js";
import { scaled } from "../helpers/calibrate.js";

/** The built-in catalog's models: the doctor loads each (twice in strict mode: eager, compile). */
const BUILTINS = JSON.parse(
  readFileSync(resolve(import.meta.dirname, "../../runtime/catalog.builtin.json"), "utf8"),
).models.length as number;

/** The simulated host's environment for the CLI, its logs kept to errors. */
const simEnv = (host: string) => simHostEnv(host, dir, { TPU_MCP_LOG_LEVEL: "error" });

const root = resolve(import.meta.dirname, "../..");
let dir: string;
let tpuPython: string;

function cli(args: string[], python: string, env: NodeJS.ProcessEnv) {
  const config = join(dir, `config-${Math.random().toString(36).slice(2)}.json`);
  writeFileSync(config, JSON.stringify({ data_dir: join(dir, "data"), runtime: { python } }));
  return new Promise<{ code: number | null; stdout: string; stderr: string }>((done) => {
    const child = spawn(
      process.execPath,
      [join(root, "bin/tpu-mcp.js"), ...args, "--config", config],
      {
        cwd: root,
        env,
        stdio: ["ignore", "pipe", "pipe"],
      },
    );
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (c: Buffer) => (stdout += c));
    child.stderr.on("data", (c: Buffer) => (stderr += c));
    child.on("close", (code) => done({ code, stdout, stderr }));
  });
}

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "tpu-sim-doctor-"));
  tpuPython = setupTpuPython();
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe("doctor --tpu on a simulated 2-chip TPU v6e host", () => {
  it(
    "checks every chip in every eager mode and says which steps need a real chip",
    { timeout: scaled(600_000) },
    async () => {
      const host = pyRun(["-m", "tpu_sim.host", join(dir, "host"), "2", "v6e"]);
      const r = await cli(["doctor", "--tpu", "--json"], tpuPython, simEnv(host));
      const report = JSON.parse(r.stdout);
      expect(report.format).toBe("tpu-mcp/tpu-self-test@1");
      expect(report.inventory).toEqual({
        kind: "tpu",
        count: 2,
        name: "TPU v6e",
        devices_per_chip: 1,
        problems: [],
      });
      expect(report.chips.map((c: any) => [c.chip, c.name])).toEqual([
        ["tpu:0", "TPU v6e"],
        ["tpu:1", "TPU v6e"],
      ]);
      const by = (chip: string, mode: string, check: string) =>
        report.checks.find(
          (c: any) => c.chip === chip && c.eager_mode === mode && c.check === check,
        );
      for (const chip of ["tpu:0", "tpu:1"]) {
        for (const [mode, inForce] of [
          ["strict", "DEFER_NEVER"],
          ["fused", "DEFER_AND_FUSE"],
          ["blocking", "DEFER_NEVER_AND_LAUNCH_BLOCKING"],
        ]) {
          expect(by(chip, mode, "worker starts on the chip")).toMatchObject({ ok: true });
          expect(by(chip, mode, "worker starts on the chip").detail).toContain(
            `hello: ${chip} (TPU v6e), 0.2.0 (libtpu 0.0.52)`,
          );
          expect(by(chip, mode, "eager mode in force")).toMatchObject({ ok: true });
          expect(by(chip, mode, "eager mode in force").detail).toContain(`in force ${inForce}`);
          for (const check of [
            "memory",
            "synchronize",
            "matmul_precision medium",
            "matmul_precision high",
            "matmul_precision highest",
          ])
            expect(by(chip, mode, check), `${chip} ${mode} ${check}`).toMatchObject({ ok: true });
          // The simulated host cannot execute: every model load fails where libtpu looks for the
          // chip, and the report says so in libtpu's words (the worker survives it).
          const loads = report.checks.filter(
            (c: any) => c.chip === chip && c.eager_mode === mode && c.check.startsWith("load "),
          );
          for (const l of loads) {
            expect(l.ok, l.check).toBe(false);
            expect(l.detail).toContain("load failed with an internal error (RuntimeError)");
            expect(l.detail).toContain("TPU initialization failed: No jellyfish device found");
          }
          expect(loads.length).toBe(mode === "strict" ? 2 * BUILTINS : BUILTINS);
        }
      }
      expect(report.ok).toBe(false);
      expect(r.code).toBe(1);
    },
  );

  it(
    "diagnoses a TorchTPU install without libtpu in words, with and without --tpu",
    { timeout: scaled(300_000) },
    async () => {
      const host = pyRun(["-m", "tpu_sim.host", join(dir, "host2"), "2", "v6e"]);
      const broken = pyRun([
        "-m",
        "tpu_sim.overlay",
        join(dir, "nolibtpu"),
        tpuPython,
        "--hide",
        "libtpu",
      ]);
      const t = await cli(["doctor", "--tpu"], broken, simEnv(host));
      expect(t.code).toBe(1);
      expect(t.stdout).toContain(
        "inventory: FAILED: broken TorchTPU install: torch_tpu is installed but libtpu is missing",
      );
      expect(t.stdout).toMatch(/FAIL host\s+-\s+TorchTPU install: broken TorchTPU install/);
      const d = await cli(["doctor"], broken, simEnv(host));
      expect(d.code).toBe(1);
      expect(d.stdout).toContain("FAIL the device inventory failed: broken TorchTPU install:");
      expect(d.stdout).toContain("libtpu is missing");
      // The worker still starts (on the CPU) and its probe step says why TorchTPU was not used.
      expect(d.stdout).toMatch(
        /no\s+torch_tpu\s+import failed: torch_tpu is installed but libtpu is missing/,
      );
      expect(d.stdout).toContain("→ serving on cpu");
    },
  );
});
