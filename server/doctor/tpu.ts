// `tpu-mcp doctor --tpu`: the self-test for a TPU VM. For every chip the inventory finds, and
// for each TorchTPU eager mode, it starts a worker bound to that chip (`--device tpu:N`), checks
// what the worker reports against what was asked (chip, eager mode), reads memory, synchronizes,
// sets and reads back each float32 matmul precision, loads every available catalog model with a
// forward (eager; and under compile in strict mode, where it checks backend "tpu", dynamic=False),
// and prints one report, JSON (`--json`) or text. A worker that dies (a failed chip, a broken
// runtime) fails its step with the worker's last words; the steps after it are "not run".
import { spawn } from "node:child_process";
import { Writable } from "node:stream";
import pino, { type Logger } from "pino";
import { WorkerRuntime, type WorkerRuntimeOptions } from "../../runtime/client.js";
import type { ServerConfig } from "../config/config.js";
import { SERVER_VERSION } from "../version.js";
import { doctorWorkerOptions } from "./worker_options.js";

export const TPU_REPORT_FORMAT = "tpu-mcp/tpu-self-test@1";
export const EAGER_MODES = ["strict", "fused", "blocking"] as const;
const PRECISIONS = ["medium", "high", "highest"];

export interface Check {
  chip: string;
  eager_mode: string;
  check: string;
  /** true passed, false failed, null not run (an earlier step killed the worker). */
  ok: boolean | null;
  detail: string;
}

export interface TpuReport {
  format: typeof TPU_REPORT_FORMAT;
  tpu_mcp: string;
  started_at: string;
  finished_at: string;
  python: string;
  inventory: Record<string, unknown> | null;
  inventory_error: string | null;
  chips: { chip: string; name: string | null; versions: Record<string, unknown> | null }[];
  checks: Check[];
  summary: { passed: number; failed: number; not_run: number };
  ok: boolean;
}

interface Io {
  out: (s: string) => void;
  json: boolean;
}

/** Runs `python -m tpu_worker inventory` (claims no chip): its JSON line, or why not. */
export function runInventory(
  config: ServerConfig,
  env: NodeJS.ProcessEnv = process.env,
): Promise<{ inventory: Record<string, unknown> | null; error: string | null }> {
  const workerPath = config.paths.install.workerDir;
  return new Promise((resolve) => {
    const child = spawn(config.paths.python, ["-m", "tpu_worker", "inventory"], {
      cwd: config.paths.root,
      env: { ...env, PYTHONPATH: env.PYTHONPATH ? `${workerPath}:${env.PYTHONPATH}` : workerPath },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    const timer = setTimeout(() => child.kill("SIGKILL"), 180_000);
    child.stdout.on("data", (c: Buffer) => (stdout += c.toString("utf8")));
    child.stderr.on("data", (c: Buffer) => (stderr = (stderr + c.toString("utf8")).slice(-20_000)));
    child.on("error", (e) => {
      clearTimeout(timer);
      resolve({ inventory: null, error: `could not run ${config.paths.python}: ${e.message}` });
    });
    child.on("close", (code, signal) => {
      clearTimeout(timer);
      const last = stderr.trim().split("\n").pop() ?? "";
      if (code === 0) {
        try {
          resolve({ inventory: JSON.parse(stdout.trim()), error: null });
        } catch {
          resolve({
            inventory: null,
            error: `inventory printed no JSON line: ${stdout.slice(0, 200)}`,
          });
        }
      } else
        resolve({
          inventory: null,
          error: `${last || "no explanation"} (exit ${signal ? `signal ${signal}` : `code ${code}`})`,
        });
    });
  });
}

/** A pino logger that keeps the worker's last words (stderr tail logged with its exit). */
function captureLogger() {
  const deaths: string[] = [];
  const opErrors: string[] = [];
  const stream = new Writable({
    write(chunk: Buffer, _enc, cb) {
      for (const line of chunk.toString("utf8").split("\n")) {
        if (line.includes('"op failed"')) {
          try {
            const rec = JSON.parse(line);
            if (rec.error) opErrors.push(String(rec.error).split("\n")[0]!.slice(0, 400));
          } catch {
            /* not JSON: ignore */
          }
          continue;
        }
        if (!line.includes("worker exited unexpectedly")) continue;
        try {
          const rec = JSON.parse(line);
          const tail: string[] = rec.stderr_tail ?? [];
          const words = tail
            .map((l) => {
              try {
                const j = JSON.parse(l);
                return String(j.msg ?? j.message ?? l);
              } catch {
                return l;
              }
            })
            .filter((l) => l.trim() && !l.startsWith("***") && !l.startsWith("    @"));
          const cause = rec.signal ? `signal ${rec.signal}` : `exit code ${rec.code}`;
          deaths.push(`the worker died (${cause}): ${words.slice(-2).join(" | ").slice(0, 400)}`);
        } catch {
          /* not JSON: ignore */
        }
      }
      cb();
    },
  });
  return { logger: pino({ level: "info" }, stream), deaths, opErrors };
}

/** The server's worker options, bound to one chip in one TorchTPU eager mode. */
export function tpuWorkerOptions(
  config: ServerConfig,
  chip: string,
  eager: (typeof EAGER_MODES)[number],
  env: NodeJS.ProcessEnv,
  logger: Logger,
): WorkerRuntimeOptions {
  const base = doctorWorkerOptions(config, logger);
  return {
    ...base,
    device: chip,
    extraArgs: [...(base.extraArgs ?? []), "--tpu-eager", eager],
    env,
  };
}

async function selfTestRun(
  config: ServerConfig,
  chip: number,
  eager: (typeof EAGER_MODES)[number],
  models: string[],
  env: NodeJS.ProcessEnv,
): Promise<{ checks: Check[]; name: string | null; versions: Record<string, unknown> | null }> {
  const label = `tpu:${chip}`;
  const checks: Check[] = [];
  const add = (check: string, ok: boolean | null, detail: string) =>
    checks.push({ chip: label, eager_mode: eager, check, ok, detail });
  const { logger, deaths, opErrors } = captureLogger();
  const runtime = new WorkerRuntime(tpuWorkerOptions(config, label, eager, env, logger));
  let name: string | null = null;
  let versions: Record<string, unknown> | null = null;
  let dead: string | null = null;
  const why = (e: unknown) => {
    const msg = (e as Error).message;
    if (deaths.length) return deaths[deaths.length - 1]!;
    // An internal error's message points at the worker log: say what the log says.
    if (/see the worker log/.test(msg) && opErrors.length)
      return `${msg}: ${opErrors[opErrors.length - 1]}`;
    return msg;
  };
  // Each step either passes/fails or, once the worker is gone, is recorded as not run.
  const step = async (check: string, fn: () => Promise<[boolean, string]>) => {
    if (dead) return add(check, null, `not run: ${dead}`);
    try {
      const [ok, detail] = await fn();
      add(check, ok, detail);
    } catch (e) {
      const detail = why(e);
      add(check, false, detail);
      if (
        /worker_died|worker_unavailable|died|no longer restarted/.test(
          `${detail} ${(e as Error).message}`,
        )
      )
        dead = "the worker died at an earlier step";
    }
  };
  try {
    await step("worker starts on the chip", async () => {
      const h: any = await runtime.ready();
      name = h.device?.name ?? null;
      versions = {
        worker: h.worker_version,
        torch: h.torch_version,
        python: h.python_version,
        backend: h.device?.backend_version ?? null,
      };
      const ok = h.device?.kind === "tpu" && h.device?.index === chip;
      return [
        ok,
        `hello: ${h.device?.kind}:${h.device?.index} (${h.device?.name}), ${h.device?.backend_version}`,
      ];
    });
    await step("eager mode in force", async () => {
      const h: any = runtime.hello;
      const e = h?.eager_mode;
      return [
        e?.matches === true,
        e
          ? `requested ${e.requested}: expected ${e.expected}, in force ${e.in_force}`
          : "not reported",
      ];
    });
    let selftest: any = null;
    await step("self-test op", async () => {
      selftest = (await runtime.call<any>("selftest", {}, { timeoutMs: 120_000 })).result;
      return [true, `${selftest.steps.length} steps, compile backend ${selftest.compile_backend}`];
    });
    for (const s of selftest?.steps ?? []) {
      if (s.step === "eager_mode") continue; // checked from hello above
      add(s.step, s.ok, typeof s.detail === "string" ? s.detail : JSON.stringify(s.detail));
    }
    if (!selftest)
      for (const p of ["memory", "synchronize", ...PRECISIONS.map((p) => `matmul_precision ${p}`)])
        add(p, null, "not run: no self-test result");
    const modes = eager === "strict" ? ["eager", "compile"] : ["eager"];
    for (const model of models) {
      for (const mode of modes) {
        await step(`load ${model} (${mode}) with a forward`, async () => {
          const r: any = (
            await runtime.call<any>(
              "load",
              { model, mode, warmup_shapes: [{ batch: 1 }] },
              { timeoutMs: 900_000 },
            )
          ).result;
          await runtime.call("unload", { model }, { timeoutMs: 120_000 });
          const compileOk =
            mode !== "compile" || (r.compile_backend === "tpu" && r.compile_dynamic === false);
          return [
            r.device === label && compileOk,
            `on ${r.device}, ${r.dtype}, load ${r.load_s}s, compile ${r.compile_s}s, warmup ${r.warmup_s}s` +
              (mode === "compile"
                ? `, backend ${r.compile_backend}, dynamic=${r.compile_dynamic}`
                : "") +
              `, ${r.execution_mode}, matmul ${r.matmul_precision}`,
          ];
        });
      }
    }
  } finally {
    await runtime.close();
  }
  return { checks, name, versions };
}

export async function runTpuSelfTest(
  config: ServerConfig,
  io: Io,
  opts: { env?: NodeJS.ProcessEnv; modes?: readonly (typeof EAGER_MODES)[number][] } = {},
): Promise<number> {
  const env = opts.env ?? process.env;
  const started = new Date().toISOString();
  const inv = await runInventory(config, env);
  const report: TpuReport = {
    format: TPU_REPORT_FORMAT,
    tpu_mcp: SERVER_VERSION,
    started_at: started,
    finished_at: started,
    python: config.paths.python,
    inventory: inv.inventory,
    inventory_error: inv.error,
    chips: [],
    checks: [],
    summary: { passed: 0, failed: 0, not_run: 0 },
    ok: false,
  };
  const finish = () => {
    report.finished_at = new Date().toISOString();
    for (const c of report.checks)
      if (c.ok === true) report.summary.passed++;
      else if (c.ok === false) report.summary.failed++;
      else report.summary.not_run++;
    report.ok =
      report.summary.failed === 0 && report.summary.not_run === 0 && report.checks.length > 0;
    if (io.json) io.out(JSON.stringify(report, null, 2));
    else printText(report, io.out);
    return report.ok ? 0 : 1;
  };
  const fail = (check: string, detail: string) =>
    report.checks.push({ chip: "host", eager_mode: "-", check, ok: false, detail });
  if (!inv.inventory) {
    fail("TorchTPU install", inv.error ?? "inventory failed");
    return finish();
  }
  const kind = inv.inventory.kind;
  const count = Number(inv.inventory.count ?? 0);
  const problems = (inv.inventory.problems as string[] | undefined) ?? [];
  if (kind !== "tpu" || count < 1) {
    fail(
      "TPU chips found",
      `inventory found ${kind} ×${count}, no TPU${problems.length ? `: ${problems.join("; ")}` : ""}`,
    );
    return finish();
  }
  report.checks.push({
    chip: "host",
    eager_mode: "-",
    check: "TPU chips found",
    ok: true,
    detail: `${count} × ${inv.inventory.name} (${inv.inventory.devices_per_chip} device(s) per chip)`,
  });
  // The models this catalog can load (the built-in ones by default).
  const { logger } = captureLogger();
  const cpu = new WorkerRuntime(doctorWorkerOptions(config, logger, { device: "cpu", env }));
  let models: string[] = [];
  try {
    const { result } = await cpu.call<{ models: any[] }>("describe", {});
    models = result.models.filter((m) => m.available).map((m) => m.id);
  } catch (e) {
    fail("catalog", `could not list the models: ${(e as Error).message}`);
  } finally {
    await cpu.close();
  }
  // One process per chip, as in serving: the chips are tested side by side.
  const modes = opts.modes ?? EAGER_MODES;
  const perChip = await Promise.all(
    Array.from({ length: count }, async (_, chip) => {
      const runs = [];
      for (const eager of modes) runs.push(await selfTestRun(config, chip, eager, models, env));
      return runs;
    }),
  );
  perChip.forEach((runs, chip) => {
    report.chips.push({
      chip: `tpu:${chip}`,
      name: runs.find((r) => r.name)?.name ?? null,
      versions: runs.find((r) => r.versions)?.versions ?? null,
    });
    for (const r of runs) report.checks.push(...r.checks);
  });
  return finish();
}

function printText(r: TpuReport, out: (s: string) => void) {
  out(`tpu-mcp ${r.tpu_mcp} TPU self-test (${r.format}), python ${r.python}`);
  out(
    r.inventory
      ? `inventory: ${JSON.stringify(r.inventory)}`
      : `inventory: FAILED: ${r.inventory_error}`,
  );
  for (const c of r.chips)
    out(`chip ${c.chip}: ${c.name ?? "?"}${c.versions ? ` ${JSON.stringify(c.versions)}` : ""}`);
  out("");
  for (const c of r.checks) {
    const mark = c.ok === true ? "ok  " : c.ok === false ? "FAIL" : "--  ";
    out(`  ${mark} ${c.chip.padEnd(6)} ${c.eager_mode.padEnd(8)} ${c.check}: ${c.detail}`);
  }
  out(
    `\n${r.summary.passed} passed, ${r.summary.failed} failed, ${r.summary.not_run} not run — ${r.ok ? "all good" : "attach this report (--json) to a bug report"}`,
  );
}
