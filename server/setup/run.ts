// `tpu-mcp setup` for an installed package: the Python virtual environment (torch CPU build and
// the worker's requirements) and the built-in model files, in the per-user folder. Each step is
// skipped when it is already done for the same inputs, so a second run takes seconds. Progress
// goes to `say` (stderr: stdout may be an MCP channel), to <home>/setup.json (a waiting server
// reads it) and, in full, to <home>/setup.log.
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import {
  appendFileSync,
  closeSync,
  existsSync,
  openSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { join } from "node:path";
import type { InstallLayout } from "../config/install_layout.js";
import { alive, readSetupRecord, writeSetupRecord, type SetupRecord } from "./progress.js";
import { writeUserCatalog } from "./user_catalog.js";
import { openUserHome } from "./user_home.js";
import { PipProgress, type PipState } from "./pip_progress.js";

/** The inputs a finished set-up is valid for: the requirement files, the catalog, the version. */
export function setupDigest(layout: InstallLayout, version: string): string {
  const h = createHash("sha256").update(version);
  for (const f of [...layout.requirements.map((r) => r.file), layout.shippedCatalog])
    h.update(existsSync(f) ? readFileSync(f) : `missing:${f}`);
  return h.digest("hex").slice(0, 16);
}

/** The venv's marker (as scripts/setup.mjs writes it): its packages match the requirement files. */
function requirementsDigest(layout: InstallLayout): string {
  const h = createHash("sha256");
  for (const { file } of layout.requirements)
    h.update(existsSync(file) ? readFileSync(file) : `missing:${file}`);
  return h.digest("hex").slice(0, 16);
}

/** Whether this package install still needs its set-up (always false from a clone). */
export function needsSetup(layout: InstallLayout, version: string): boolean {
  if (layout.kind !== "package" || !layout.setupProgress) return false;
  const r = readSetupRecord(layout.setupProgress);
  return (
    !(r?.state === "done" && r.digest === setupDigest(layout, version)) ||
    !existsSync(layout.python)
  );
}

export interface SetupIo {
  say: (line: string) => void;
  env: NodeJS.ProcessEnv;
  version: string;
}

class SetupFailed extends Error {}

/**
 * Runs the set-up, or follows one already running (the background set-up a server started).
 * Resolves true when everything is in place.
 */
export async function runSetup(layout: InstallLayout, io: SetupIo): Promise<boolean> {
  if (layout.kind !== "package" || !layout.home || !layout.setupProgress || !layout.setupLog)
    throw new Error("runSetup is for an installed package; a clone runs `npm run setup`");
  openUserHome(layout);
  const lock = join(layout.home, "setup.lock");
  if (!takeLock(lock)) return follow(layout, io);
  const progressFile = layout.setupProgress;
  const log = layout.setupLog;
  const digest = setupDigest(layout, io.version);
  writeFileSync(log, `tpu-mcp ${io.version} set-up, ${new Date().toISOString()}\n`);
  const record: SetupRecord = {
    state: "running",
    step: "starting",
    percent: 0,
    message: "",
    log,
    error: null,
    digest,
    pid: process.pid,
    updated_at: new Date().toISOString(),
  };
  const report = (patch: Partial<SetupRecord>) => {
    Object.assign(record, patch, { updated_at: new Date().toISOString() });
    record.percent = Math.max(0, Math.min(100, Math.round(record.percent)));
    writeSetupRecord(progressFile, record);
  };
  const step = (name: string, percent: number) => {
    report({ step: name, percent, message: name });
    io.say(`[setup] ${name}… (${Math.round(percent)}%)`);
  };
  const line = (text: string, percent?: number) => {
    appendFileSync(log, text + "\n");
    report({ message: text.slice(0, 300), ...(percent !== undefined ? { percent } : {}) });
  };

  try {
    writeUserCatalog(layout);
    step(`preparing ${layout.home}`, 1);
    if (!existsSync(layout.python)) {
      step(`creating the Python virtual environment in ${layout.venv}`, 2);
      await run(io.env.PYTHON ?? "python3", ["-m", "venv", layout.venv], io, line);
    }
    const marker = join(layout.venv, ".tpu-mcp-setup");
    const want = requirementsDigest(layout);
    if (!existsSync(marker) || readFileSync(marker, "utf8").trim() !== want) {
      step(
        "installing Python packages (torch CPU build, transformers; a few minutes the first time)",
        5,
      );
      const spans = [
        [5, 55],
        [55, 60],
      ];
      for (const [i, { file, noDeps }] of layout.requirements.entries()) {
        const [from, to] = spans[i] ?? [60, 60];
        const pip = new PipProgress(from!, to!);
        const show = (st: PipState, text: string) => {
          report({ step: `installing Python packages: ${st.step}` });
          line(text, st.percent);
        };
        await run(
          layout.python,
          [
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--progress-bar",
            "off",
            ...(noDeps ? ["--no-deps"] : []),
            "-r",
            file,
          ],
          io,
          (text) => show(pip.line(text), text),
          {
            // pip is silent while it installs: the step line and the percentage still move.
            quiet: (silentS) => {
              const st = pip.state();
              report({
                step: `installing Python packages: ${st.step}`,
                message: st.step,
                percent: st.percent,
              });
              if (silentS % 30 < QUIET_TICK_S)
                io.say(`[setup] ${st.step}… (${Math.round(st.percent)}%)`);
            },
          },
        );
      }
      writeFileSync(marker, want + "\n");
    }
    step(
      "making the built-in model files (converting smollm2-135m-instruct takes under a minute)",
      60,
    );
    await run(
      layout.python,
      ["-m", "tpu_worker.builtin", "--out", layout.models],
      {
        ...io,
        env: {
          ...io.env,
          PYTHONPATH: layout.workerDir,
          HF_HUB_OFFLINE: "1",
          TRANSFORMERS_OFFLINE: "1",
          // The conversion's library warnings are not the user's business: errors only.
          TRANSFORMERS_VERBOSITY: "error",
        },
      },
      (text) => {
        // "[builtin] NAME: building (model I of N)" moves the bar from 60% to 100%.
        const m = /building \(model (\d+) of (\d+)\)/.exec(text);
        if (m)
          report({
            step: `building the built-in model ${text.split(":")[0].replace("[builtin] ", "")}`,
          });
        line(text, m ? 60 + (40 * (Number(m[1]) - 1)) / Number(m[2]) : undefined);
      },
      // Its own lines on the terminal; anything else a library prints goes to the log only.
      { show: (text) => text.startsWith("[builtin]") },
    );
    report({ state: "done", step: "ready", percent: 100, message: "set-up complete" });
    io.say(`[setup] ready: ${layout.home} (log: ${log})`);
    return true;
  } catch (e) {
    const why = e instanceof SetupFailed ? e.message : `set-up failed: ${(e as Error).message}`;
    report({ state: "failed", error: why, message: why });
    appendFileSync(log, why + "\n");
    io.say(`[setup] ${why}; the whole output is in ${log}`);
    return false;
  } finally {
    rmSync(lock, { force: true });
  }
}

/** How often a silent command's `quiet` is called. */
const QUIET_TICK_S = 5;

/**
 * Runs a command, each output line to `onLine` and to `say` (those `show` accepts);
 * `quiet(seconds)` is called every QUIET_TICK_S while it prints nothing.
 */
function run(
  cmd: string,
  args: string[],
  io: SetupIo,
  onLine: (text: string) => void,
  opts: { show?: (text: string) => boolean; quiet?: (silentS: number) => void } = {},
): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { env: io.env, stdio: ["ignore", "pipe", "pipe"] });
    let last = "";
    let lastAt = Date.now();
    const ticker = opts.quiet
      ? setInterval(() => {
          const silent = Math.round((Date.now() - lastAt) / 1000);
          if (silent >= QUIET_TICK_S) opts.quiet!(silent);
        }, QUIET_TICK_S * 1000)
      : undefined;
    child.on("close", () => clearInterval(ticker));
    const split = (buf: { rest: string }) => (chunk: Buffer) => {
      const lines = (buf.rest + chunk.toString("utf8")).split(/\r?\n|\r/);
      buf.rest = lines.pop() ?? "";
      for (const l of lines)
        if (l.trim()) {
          last = l.trim();
          lastAt = Date.now();
          onLine(last);
          if (opts.show?.(last) ?? true) io.say(`  ${last}`);
        }
    };
    child.stdout.on("data", split({ rest: "" }));
    child.stderr.on("data", split({ rest: "" }));
    child.on("error", (e) => {
      clearInterval(ticker);
      reject(
        new SetupFailed(`cannot run ${cmd}: ${(e as NodeJS.ErrnoException).code ?? e.message}`),
      );
    });
    child.on("close", (code, signal) =>
      code === 0
        ? resolve()
        : reject(
            new SetupFailed(
              `${cmd.split("/").pop()} ${args.slice(0, 3).join(" ")} failed (exit ${code ?? signal})${last ? `: ${last}` : ""}`,
            ),
          ),
    );
  });
}

/** The lock file holds the pid of the set-up that owns it; a dead owner's lock is taken over. */
function takeLock(lock: string): boolean {
  for (let attempt = 0; attempt < 2; attempt++) {
    try {
      const fd = openSync(lock, "wx", 0o600);
      writeFileSync(fd, String(process.pid));
      closeSync(fd);
      return true;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== "EEXIST") throw e;
      const owner = Number(readFileSync(lock, "utf8").trim());
      if (Number.isInteger(owner) && owner > 0 && alive(owner)) return false;
      rmSync(lock, { force: true });
    }
  }
  return false;
}

/** Another set-up holds the lock: show its progress until it ends. */
async function follow(layout: InstallLayout, io: SetupIo): Promise<boolean> {
  const file = layout.setupProgress!;
  io.say(`[setup] a set-up is already running; following it (log: ${layout.setupLog})`);
  let shown = "";
  for (;;) {
    const r = readSetupRecord(file);
    const now = r ? `${r.percent}% ${r.step}` : "starting";
    if (now !== shown) io.say(`[setup] ${(shown = now)}`);
    if (r?.state === "done") return true;
    if (r?.state === "failed") {
      io.say(`[setup] it failed: ${r.error}`);
      return false;
    }
    if (r && r.state === "running" && !alive(r.pid)) {
      io.say("[setup] it stopped without finishing; run `tpu-mcp setup` again");
      return false;
    }
    await new Promise((res) => setTimeout(res, 1000));
  }
}
