// The set-up runs `npm ci` beside its Python steps (a fresh clone used to wait for one, then the
// other). A Python step that fails ends the set-up, and the `npm ci` beside it with it: the real
// set-up script, in a folder of its own, with a stand-in `npm` that only waits and a Python that
// fails once `npm ci` has started.
import { execFile } from "node:child_process";
import {
  chmodSync,
  copyFileSync,
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  symlinkSync,
  utimesSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import { ROOT } from "../helpers/server.js";
import { scaled } from "../helpers/calibrate.js";
import { waitFor } from "../helpers/wait.js";

const run = promisify(execFile);

function script(path: string, body: string): void {
  writeFileSync(path, `#!/bin/sh\n${body}\n`);
  chmodSync(path, 0o755);
}

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

describe.skipIf(process.platform === "win32")("set-up, npm ci beside the Python steps", () => {
  it("a failed Python step ends the set-up and the npm ci running beside it", async () => {
    const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-setup-"));
    const tmp = { file: (name: string) => join(dir, name) };
    try {
      const root = tmp.file("clone");
      mkdirSync(join(root, "scripts"), { recursive: true });
      copyFileSync(join(ROOT, "scripts/setup.mjs"), join(root, "scripts/setup.mjs"));
      // A lock file and no node_modules: the set-up runs `npm ci`.
      writeFileSync(join(root, "package-lock.json"), "{}");
      const bin = tmp.file("bin");
      mkdirSync(bin);
      const npmPid = tmp.file("npm.pid");
      // `npm ci` that never ends by itself; its pid is the one to find gone.
      script(join(bin, "npm"), `echo $$ > "${npmPid}"\nexec sleep 600`);
      // The venv's Python, once npm ci is under way: it fails.
      const python = tmp.file("python");
      script(
        python,
        `i=0; while [ ! -s "${npmPid}" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done\nexit 3`,
      );
      const r = await run(process.execPath, [join(root, "scripts/setup.mjs")], {
        cwd: root,
        env: { ...process.env, PATH: `${bin}:${process.env.PATH}`, PYTHON: python },
        timeout: scaled(60_000),
      }).then(
        () => ({ code: 0, stderr: "" }),
        (e: { code: number; stderr: string }) => ({ code: e.code, stderr: String(e.stderr) }),
      );
      expect(r.code).toBe(1);
      expect(r.stderr).toContain("installing Node packages (npm ci)");
      expect(r.stderr).toMatch(/failed: .*python -m venv .*\(exit 3\)/);
      expect(existsSync(npmPid)).toBe(true);
      const pid = Number(readFileSync(npmPid, "utf8"));
      await waitFor("npm ci to end", () => (alive(pid) ? undefined : true), scaled(10_000));
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("leaves a linked node_modules (a worktree sharing another checkout's packages) as it is", async () => {
    const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-setup-"));
    try {
      const root = join(dir, "worktree");
      mkdirSync(join(root, "scripts"), { recursive: true });
      copyFileSync(join(ROOT, "scripts/setup.mjs"), join(root, "scripts/setup.mjs"));
      // The shared install, older than this worktree's lock file (as a fresh worktree's is).
      const shared = join(dir, "main-node_modules");
      mkdirSync(shared);
      writeFileSync(join(shared, ".package-lock.json"), "{}");
      const old = new Date(Date.now() - 3_600_000);
      utimesSync(join(shared, ".package-lock.json"), old, old);
      writeFileSync(join(root, "package-lock.json"), "{}");
      symlinkSync(shared, join(root, "node_modules"));
      const bin = join(dir, "bin");
      mkdirSync(bin);
      const npmRan = join(dir, "npm.ran");
      script(join(bin, "npm"), `echo "$@" > "${npmRan}"`);
      // The Python steps end the set-up (exit 3) once an npm ci would have started.
      const python = join(dir, "python");
      script(python, `sleep ${Math.ceil(scaled(2_000) / 1000)}\nexit 3`);
      const r = await run(process.execPath, [join(root, "scripts/setup.mjs")], {
        cwd: root,
        env: { ...process.env, PATH: `${bin}:${process.env.PATH}`, PYTHON: python },
        timeout: scaled(60_000),
      }).then(
        () => ({ code: 0, stderr: "" }),
        (e: { code: number; stderr: string }) => ({ code: e.code, stderr: String(e.stderr) }),
      );
      expect(r.code).toBe(1);
      expect(r.stderr).toMatch(/node_modules links to .*main-node_modules, shared: left as it is/);
      expect(r.stderr).not.toContain("installing Node packages");
      expect(existsSync(npmRan)).toBe(false);
      expect(lstatSync(join(root, "node_modules")).isSymbolicLink()).toBe(true);
      expect(existsSync(join(shared, ".package-lock.json"))).toBe(true);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
