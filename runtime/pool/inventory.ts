// `python -m tpu_worker inventory` (contract (a) with the TorchTPU work): which accelerator kind
// and how many chips this host has, without claiming any of them. The pool runs it once to
// expand `runtime.workers: "per-device"` into one local worker per chip.
import { spawn } from "node:child_process";
import { readdirSync } from "node:fs";
import { join } from "node:path";
import type { LocalWorkerEntry } from "./entries.js";
import { isDeviceKind, type DeviceKind } from "../../lib/device.js";

export interface Inventory {
  kind: DeviceKind;
  count: number;
  name: string;
  devices_per_chip?: number;
  problems?: string[];
}

export type InventoryFn = () => Promise<Inventory>;

/** Runs the worker's inventory command; rejects with its one-line explanation on failure. */
export function workerInventory(opts: {
  pythonPath: string;
  repoRoot: string;
  /** The worker's Python package folder. Default: runtime/worker under repoRoot. */
  workerDir?: string;
  env?: NodeJS.ProcessEnv;
  timeoutMs?: number;
}): InventoryFn {
  return () =>
    new Promise((resolve, reject) => {
      const workerPath = opts.workerDir ?? join(opts.repoRoot, "runtime", "worker");
      const base = opts.env ?? process.env;
      const child = spawn(opts.pythonPath, ["-m", "tpu_worker", "inventory"], {
        cwd: opts.repoRoot,
        env: {
          ...base,
          PYTHONPATH: base.PYTHONPATH ? `${workerPath}:${base.PYTHONPATH}` : workerPath,
        },
        stdio: ["ignore", "pipe", "pipe"],
      });
      let out = "";
      let err = "";
      const timer = setTimeout(() => child.kill("SIGKILL"), opts.timeoutMs ?? 60_000);
      child.stdout.on("data", (c: Buffer) => (out += c.toString("utf8")));
      child.stderr.on("data", (c: Buffer) => (err += c.toString("utf8")));
      child.on("error", (e) => {
        clearTimeout(timer);
        reject(new Error(`inventory: cannot run ${opts.pythonPath}: ${e.message}`));
      });
      child.on("close", (code) => {
        clearTimeout(timer);
        const lastErr = err.trim().split("\n").pop() ?? "";
        if (code !== 0)
          return reject(
            new Error(
              `inventory failed (exit ${code}): ${lastErr || "no explanation"}; run \`tpu-mcp doctor\``,
            ),
          );
        try {
          resolve(parseInventory(out.trim().split("\n").pop() ?? ""));
        } catch (e) {
          reject(e as Error);
        }
      });
    });
}

export function parseInventory(line: string): Inventory {
  let v: any;
  try {
    v = JSON.parse(line);
  } catch {
    throw new Error(`inventory: expected one JSON line, got ${JSON.stringify(line.slice(0, 200))}`);
  }
  if (!v || !isDeviceKind(v.kind) || !Number.isInteger(v.count) || v.count < 0)
    throw new Error(`inventory: unexpected answer ${JSON.stringify(v).slice(0, 200)}`);
  return { kind: v.kind, count: v.count, name: String(v.name ?? v.kind), problems: v.problems };
}

/** One local worker per chip (`tpu:0`…), or one worker when the host has one device or a CPU. */
export function perDeviceEntries(inv: Inventory, threads = 0): LocalWorkerEntry[] {
  if ((inv.kind === "tpu" || inv.kind === "cuda") && inv.count > 1) {
    return Array.from({ length: inv.count }, (_, i) => ({
      name: `w${i}`,
      device: `${inv.kind}:${i}`,
      ...(threads > 0 ? { threads } : {}),
    }));
  }
  const device = inv.kind === "cpu" ? "cpu" : inv.count > 0 ? `${inv.kind}:0` : "auto";
  return [{ name: "w0", device, ...(threads > 0 ? { threads } : {}) }];
}

/**
 * Where device files live: /dev, or `TPU_MCP_DEV_DIR` when the host's device nodes are mounted
 * elsewhere (README: "Environment"). Only this cheap look reads it; workers find chips themselves.
 */
export function devDir(env: NodeJS.ProcessEnv = process.env): string {
  return env.TPU_MCP_DEV_DIR || "/dev";
}

/**
 * A cheap look for accelerator device files, so a CPU host never pays for an inventory run:
 * TPU VMs expose /dev/accel* (or /dev/vfio), GPU hosts /dev/nvidia0….
 */
export function hostMayHaveAccelerators(dev = devDir()): boolean {
  const count = (dir: string, re: RegExp) => {
    try {
      return readdirSync(dir).filter((n) => re.test(n)).length;
    } catch {
      return 0;
    }
  };
  // TPU VMs: /dev/accel0… (v4) or one VFIO group per chip (/dev/vfio/0…, v5e and later).
  return (
    count(dev, /^accel\d+$/) > 1 ||
    count(dev, /^nvidia\d+$/) > 1 ||
    count(join(dev, "vfio"), /^\d+$/) > 1
  );
}
