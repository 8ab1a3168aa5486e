// The per-user folder of an installed package (issue 43, row 3): the server executes
// <home>/venv/bin/python and trusts setup.json and the catalog there, so a folder someone else can
// write is refused — by `doctor` (a failed check with the mend), the stdio server and `setup` —
// and a python planted in it never runs. Driven through the real CLI in the package layout
// (TPU_MCP_LAYOUT=package, --home); the other user is uid 65534 (the tests run as root).
import { spawn } from "node:child_process";
import {
  chmodSync,
  chownSync,
  existsSync,
  mkdirSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { scaled } from "../helpers/calibrate.js";
import { CLI, ROOT, cleanupTemp, tempDir } from "./helpers.js";

const OTHER = 65534; // nobody
const asRoot = process.getuid?.() === 0;

/** The CLI as an installed package with `--home home`, none of this shell's tpu-mcp settings. */
function runCli(args: string[], home: string): Promise<{ code: number | null; out: string }> {
  const env: NodeJS.ProcessEnv = { ...process.env, TPU_MCP_LAYOUT: "package" };
  for (const k of ["TPU_MCP_HOME", "TPU_MCP_VENV", "TPU_MCP_CONFIG", "XDG_DATA_HOME"])
    delete env[k];
  const child = spawn(process.execPath, [CLI, ...args, "--home", home], {
    cwd: ROOT,
    env,
    stdio: ["pipe", "pipe", "pipe"], // stdin open: a stdio server that starts keeps running
  });
  let out = "";
  child.stdout.on("data", (d) => (out += d));
  child.stderr.on("data", (d) => (out += d));
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      out += "\n[test] still running: killed";
    }, scaled(60_000));
    child.on("close", (code) => {
      clearTimeout(timer);
      resolve({ code, out });
    });
  });
}

/** A venv/bin/python under `home` that leaves `marker` when anything runs it. */
function plantPython(home: string, marker: string): void {
  mkdirSync(join(home, "venv", "bin"), { recursive: true, mode: 0o755 });
  writeFileSync(join(home, "venv", "bin", "python"), `#!/bin/sh\necho "$@" >> ${marker}\n`);
  chmodSync(join(home, "venv", "bin", "python"), 0o755);
}

interface Case {
  name: string;
  /** Makes the folder (with the planted python) under `dir`; returns the --home to pass. */
  make: (dir: string, marker: string) => string;
  why: RegExp;
  mend: RegExp;
}

const CASES: Case[] = [
  {
    name: "world-writable (0777)",
    make: (dir, marker) => {
      const home = join(dir, "home");
      plantPython(home, marker);
      chmodSync(home, 0o777);
      return home;
    },
    why: /writable by its group and other users \(mode 777\)/,
    mend: /chmod 700 \S+home/,
  },
  {
    name: "group-writable (0770)",
    make: (dir, marker) => {
      const home = join(dir, "home");
      plantPython(home, marker);
      chmodSync(home, 0o770);
      return home;
    },
    why: /writable by its group \(mode 770\)/,
    mend: /chmod 700 \S+home/,
  },
  {
    name: "owned by another user",
    make: (dir, marker) => {
      const home = join(dir, "home");
      plantPython(home, marker);
      chmodSync(home, 0o700);
      chownSync(home, OTHER, OTHER);
      return home;
    },
    why: new RegExp(`owned by uid ${OTHER}, not by this user`),
    mend: /chown -R 0 \S+home/,
  },
  {
    name: "a link to another user's folder",
    make: (dir, marker) => {
      const theirs = join(dir, "theirs");
      plantPython(theirs, marker);
      chmodSync(theirs, 0o700);
      chownSync(theirs, OTHER, OTHER);
      symlinkSync(theirs, join(dir, "home"));
      return join(dir, "home");
    },
    why: new RegExp(`\\(a link to \\S+theirs\\) is owned by uid ${OTHER}`),
    mend: /rm \S+home \(the link\)/,
  },
  {
    name: "its python writable by others (folder 0755)",
    make: (dir, marker) => {
      const home = join(dir, "home");
      plantPython(home, marker);
      chmodSync(home, 0o755);
      chmodSync(join(home, "venv", "bin"), 0o777);
      return home;
    },
    why: /venv\/bin is writable by its group and other users \(mode 777\)/,
    mend: /chmod go-w \S+venv\/bin/,
  },
  {
    name: "its setup.json owned by another user (folder 0755)",
    make: (dir, marker) => {
      const home = join(dir, "home");
      plantPython(home, marker);
      chmodSync(home, 0o755);
      writeFileSync(join(home, "setup.json"), "{}");
      chownSync(join(home, "setup.json"), OTHER, OTHER);
      return home;
    },
    why: new RegExp(`setup\\.json is owned by uid ${OTHER}`),
    mend: /rm -r \S+setup\.json/,
  },
];

describe.skipIf(!asRoot)("the per-user folder is the server user's alone", () => {
  afterAll(cleanupTemp);

  it("is made 0700 when missing, and a folder of one's own runs its python", async () => {
    const dir = tempDir();
    const home = join(dir, "new", "home");
    const r = await runCli(["doctor"], home);
    expect(statSync(home).mode & 0o777, r.out).toBe(0o700);
    expect(r.out).not.toMatch(/per-user folder/);
    // The control for the cases below: the same planted python in a sound folder does run.
    const marker = join(dir, "ran");
    plantPython(home, marker);
    await runCli(["doctor"], home);
    expect(existsSync(marker), "a sound folder's python was not run: the cases prove nothing").toBe(
      true,
    );
  });

  it.each(CASES)("$name: refused by doctor, stdio and setup; nothing in it runs", async (c) => {
    const dir = tempDir();
    const marker = join(dir, "ran");
    const home = c.make(dir, marker);

    const doctor = await runCli(["doctor"], home);
    expect(doctor.code, doctor.out).toBe(1);
    expect(doctor.out).toMatch(/per-user folder\n {2}FAIL /);
    expect(doctor.out).toMatch(c.why);
    expect(doctor.out).toMatch(c.mend);

    for (const command of ["stdio", "setup"]) {
      const r = await runCli([command], home);
      expect(r.code, `${command}: ${r.out}`).toBe(1);
      expect(r.out).toMatch(/refusing the per-user folder/);
      expect(r.out).toMatch(c.why);
      expect(r.out).toMatch(c.mend);
    }
    expect(existsSync(marker), "the planted python ran").toBe(false);
  });
});
