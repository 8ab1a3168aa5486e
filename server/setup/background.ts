// A server started before its package was set up: it serves at once (tools/list needs no
// Python), starts `tpu-mcp setup` in the background (a detached process that outlives a short
// stdio session and writes its progress to <home>/setup.json), and holds the worker back until
// the set-up is done. Meanwhile device tools answer runtime_setting_up with the progress.
import { spawn } from "node:child_process";
import { closeSync, openSync } from "node:fs";
import type { Logger } from "pino";
import { RuntimeCallError } from "../../runtime/types.js";
import type { InstallLayout } from "../config/install_layout.js";
import { alive, readSetupRecord, writeSetupRecord, type SetupProgress } from "./progress.js";
import { needsSetup, setupDigest } from "./run.js";
import { checkUserHome, openUserHome } from "./user_home.js";

const POLL_MS = 1000;

export interface SetupWatchOptions {
  version: string;
  /** argv of `tpu-mcp setup` (the CLI knows its own entry point). */
  command: string[];
  env: NodeJS.ProcessEnv;
  logger: Logger;
}

export class SetupWatch {
  private done = false;
  private failure: string | null = null;
  private last: SetupProgress | null = null;
  private timer: NodeJS.Timeout | null = null;
  /** When this server started a set-up: an older record is a previous run's. */
  private spawnedAt = 0;
  private readonly readyFns: Array<() => void> = [];

  constructor(
    private readonly layout: InstallLayout,
    private readonly opts: SetupWatchOptions,
  ) {
    this.done = !needsSetup(layout, opts.version);
  }

  /** Whether the worker can start now. */
  get ready(): boolean {
    return this.done;
  }

  /** Called once the set-up has finished (the server then starts its worker). */
  onReady(fn: () => void): void {
    if (this.done) fn();
    else this.readyFns.push(fn);
  }

  /** Starts the background set-up unless one is running, and follows it. */
  start(): void {
    if (this.done || this.timer) return;
    // A folder others can write is never set up (it would run their python): the failure says why.
    const refused = checkUserHome(this.layout);
    if (refused) {
      // Tool errors carry no paths: the log has the whole refusal, the doctor says it too.
      this.opts.logger.error({ path: refused.path }, refused.message);
      this.failure =
        "the per-user folder can be written by someone else, so nothing in it is run; `tpu-mcp doctor` says why and how to mend it";
      return;
    }
    const r = readSetupRecord(this.layout.setupProgress!);
    const running = r?.state === "running" && alive(r.pid);
    if (!running) this.spawnSetup();
    this.timer = setInterval(() => this.poll(), POLL_MS);
    this.timer.unref();
    this.poll();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }

  /** What get_runtime_status shows; null once done. */
  progress(): SetupProgress | null {
    if (this.done) return null;
    return this.last ?? this.starting();
  }

  /** The progress of a set-up that has not written its own record yet. */
  private starting(): SetupProgress {
    return {
      state: "running",
      step: "starting the set-up",
      percent: 0,
      message: "",
      log: this.layout.setupLog!,
      error: null,
    };
  }

  /** The runtime's prerequisite: why the worker cannot start yet, or null. */
  blocked(): RuntimeCallError | null {
    if (this.done) return null;
    const log = this.layout.setupLog!;
    if (this.failure)
      return new RuntimeCallError(
        "worker_unavailable",
        `The set-up of the Python environment failed (${this.failure}). Run \`tpu-mcp setup\` in a terminal to see why and retry; get_runtime_status gives its log file.`,
        false,
        { log },
      );
    const p = this.progress()!;
    return new RuntimeCallError(
      "runtime_setting_up",
      // Tool errors never carry paths (tools/errors.ts): the log's path is in details and status.
      `tpu-mcp is setting up its Python environment and model files (first start only, a few minutes): ${p.step}, ${p.percent}% done. Call again in a minute; get_runtime_status shows the progress and the log file, \`tpu-mcp setup\` in a terminal shows it live.`,
      true,
      { percent: p.percent, step: p.step, log },
    );
  }

  private spawnSetup(): void {
    const [cmd, ...args] = this.opts.command;
    this.spawnedAt = Date.now();
    // Its output is in setup.log (run.ts writes it); nothing of it may reach the MCP channel.
    const devNull = openSync("/dev/null", "r+");
    try {
      const child = spawn(cmd, args, {
        detached: true,
        stdio: [devNull, devNull, devNull],
        env: this.opts.env,
      });
      child.on("error", (e) => {
        this.failure = `cannot start \`tpu-mcp setup\`: ${e.message}`;
      });
      child.unref();
      // Recorded at once, with the child's pid: until the set-up writes its own record, a second
      // server (or whoever stops it) would otherwise see no set-up running and start another.
      if (child.pid) {
        openUserHome(this.layout);
        writeSetupRecord(this.layout.setupProgress!, {
          ...this.starting(),
          digest: setupDigest(this.layout, this.opts.version),
          pid: child.pid,
          updated_at: new Date().toISOString(),
        });
      }
      this.opts.logger.info(
        { pid: child.pid, log: this.layout.setupLog },
        "setting up in the background",
      );
    } finally {
      closeSync(devNull);
    }
  }

  private poll(): void {
    const read = readSetupRecord(this.layout.setupProgress!);
    const r = read && Date.parse(read.updated_at) >= this.spawnedAt - 1000 ? read : null;
    if (r) {
      const { state, step, percent, message, log, error } = r;
      this.last = { state, step, percent, message, log, error };
    }
    if (r?.state === "done" && r.digest === setupDigest(this.layout, this.opts.version)) {
      this.done = !needsSetup(this.layout, this.opts.version);
      if (this.done) {
        this.stop();
        this.opts.logger.info("set-up complete: starting the worker");
        for (const fn of this.readyFns.splice(0)) fn();
        return;
      }
    }
    if (r?.state === "failed") this.failure = r.error ?? "unknown reason";
    else if (r?.state === "running" && !alive(r.pid))
      this.failure = "the set-up process stopped before finishing";
    else this.failure = null;
  }
}
