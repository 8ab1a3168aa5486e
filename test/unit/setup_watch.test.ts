// A package's server before set-up (server/setup/background.ts): it starts the set-up as a
// detached process, answers runtime_setting_up with the progress the set-up writes, and lets the
// worker start once the set-up says done for these inputs. The set-up here is a stand-in script
// that writes setup.json as `tpu-mcp setup` does (the real one runs in test/package).
import {
  chmodSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import pino from "pino";
import { afterAll, describe, expect, it } from "vitest";
import { installLayout } from "../../server/config/install_layout.js";
import { SetupWatch } from "../../server/setup/background.js";
import { alive, readSetupRecord } from "../../server/setup/progress.js";
import { needsSetup, setupDigest } from "../../server/setup/run.js";

const REPO = resolve(import.meta.dirname, "..", "..");
const scratch = mkdtempSync(join(tmpdir(), "tpu-mcp-setupwatch-"));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

function packageLayout() {
  const root = join(scratch, "pkg");
  mkdirSync(join(root, "runtime", "worker"), { recursive: true });
  writeFileSync(
    join(root, "runtime", "catalog.builtin.json"),
    readFileSync(join(REPO, "runtime", "catalog.builtin.json")),
  );
  const home = join(scratch, "home");
  // The venv's interpreter: any file there counts as present.
  mkdirSync(join(home, "venv", "bin"), { recursive: true });
  writeFileSync(join(home, "venv", "bin", "python"), "");
  return installLayout(root, { env: { TPU_MCP_HOME: home } });
}

/** A set-up that reports 40% running, then done, as run.ts writes its record. */
function fakeSetup(file: string, digest: string): string[] {
  const record = (state: string, percent: number) =>
    JSON.stringify({
      state,
      step: `step at ${percent}`,
      percent,
      message: "",
      log: "l",
      error: null,
      digest,
      pid: "PID",
      updated_at: "NOW",
    });
  const js = `
    const fs = require("fs");
    const put = (t) => fs.writeFileSync(${JSON.stringify(file)}, t.replace('"PID"', process.pid).replace("NOW", new Date().toISOString()));
    put(${JSON.stringify(record("running", 40))});
    setTimeout(() => put(${JSON.stringify(record("done", 100))}), 1500);`;
  return [process.execPath, "-e", js];
}

describe("SetupWatch", () => {
  it("answers runtime_setting_up with the progress, then lets the worker start", async () => {
    const layout = packageLayout();
    expect(needsSetup(layout, "9.9.9")).toBe(true);
    const watch = new SetupWatch(layout, {
      version: "9.9.9",
      command: fakeSetup(layout.setupProgress!, setupDigest(layout, "9.9.9")),
      env: process.env,
      logger: pino({ level: "silent" }),
    });
    let started = false;
    watch.onReady(() => (started = true));
    watch.start();
    try {
      let e = watch.blocked();
      for (let i = 0; i < 100 && !e?.message.includes("40%"); i++) {
        await new Promise((r) => setTimeout(r, 50));
        e = watch.blocked();
      }
      expect(e?.code).toBe("runtime_setting_up");
      expect(e?.recoverable).toBe(true);
      expect(e?.message).toMatch(/step at 40, 40% done/);
      expect(e?.message).not.toContain(layout.home!); // tool errors carry no paths
      expect(e?.details).toMatchObject({ percent: 40, log: layout.setupLog });
      expect(watch.progress()).toMatchObject({ state: "running", percent: 40 });
      expect(started).toBe(false);
      for (let i = 0; i < 200 && !started; i++) await new Promise((r) => setTimeout(r, 50));
      expect(started).toBe(true);
      expect(watch.blocked()).toBeNull();
      expect(watch.progress()).toBeNull();
      expect(needsSetup(layout, "9.9.9")).toBe(false);
      // Another version of the package: the same record no longer counts as done.
      expect(needsSetup(layout, "9.9.10")).toBe(true);
    } finally {
      watch.stop();
    }
  });

  it("records the set-up it spawned, with its pid, before the set-up writes anything", () => {
    // Whoever comes next (a second server, a test's clean-up) must see a set-up running from the
    // first moment: this one writes nothing for its whole life.
    const layout = packageLayout();
    rmSync(layout.setupProgress!, { force: true });
    const watch = new SetupWatch(layout, {
      version: "9.9.8",
      command: [process.execPath, "-e", "setTimeout(() => {}, 60_000)"],
      env: process.env,
      logger: pino({ level: "silent" }),
    });
    watch.start();
    const r = readSetupRecord(layout.setupProgress!);
    try {
      expect(r).toMatchObject({ state: "running", step: "starting the set-up" });
      expect(r!.pid).not.toBe(process.pid);
      expect(alive(r!.pid)).toBe(true);
    } finally {
      watch.stop();
      if (r?.pid) process.kill(r.pid, "SIGKILL");
    }
  });

  it("never starts a set-up in a folder others can write, and says so without its path", () => {
    const layout = packageLayout();
    rmSync(layout.setupProgress!, { force: true });
    chmodSync(layout.home!, 0o777);
    const marker = join(scratch, "set-up-ran");
    const watch = new SetupWatch(layout, {
      version: "9.9.7",
      command: [
        process.execPath,
        "-e",
        `require("fs").writeFileSync(${JSON.stringify(marker)}, "")`,
      ],
      env: process.env,
      logger: pino({ level: "silent" }),
    });
    try {
      watch.start();
      const e = watch.blocked();
      expect(e?.code).toBe("worker_unavailable");
      expect(e?.message).toMatch(/can be written by someone else.*tpu-mcp doctor/);
      expect(e?.message).not.toContain(layout.home!);
      expect(readSetupRecord(layout.setupProgress!)).toBeNull();
      expect(existsSync(marker)).toBe(false);
    } finally {
      watch.stop();
      chmodSync(layout.home!, 0o755);
    }
  });

  it("a clone never needs it", () => {
    expect(needsSetup(installLayout(REPO), "0.3.0")).toBe(false);
  });
});
