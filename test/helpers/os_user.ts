// OS users for tests of the deployment in which the server runs as its own user (issue 21):
// make a system user when missing, and run a command or the CLI as it. Needs root (tests and CI
// run as root); `osUsersUnavailable` says why not otherwise, for describe.skipIf.
import { execFile, execFileSync } from "node:child_process";
import {
  chmodSync,
  chownSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { scaled } from "./calibrate.js";
import { CLI, ROOT } from "./server.js";

export interface OsUser {
  name: string;
  uid: number;
  gid: number;
}

/** Why these tests cannot run here, or null when they can. */
export function osUsersUnavailable(root = ROOT): string | null {
  if (process.platform !== "linux") return "needs Linux (useradd, uid switching)";
  if (process.getuid?.() !== 0) return "needs root to create users and switch to them";
  if (!existsSync("/usr/sbin/useradd")) return "useradd is not installed";
  return closedToOthers(root);
}

/**
 * The other users run the clone's own CLI: in a clone they cannot reach (a private home, a
 * `mktemp -d` parent: mode 0700) they cannot, and the suite says so instead of failing on it.
 */
function closedToOthers(root: string): string | null {
  for (let dir = root; ; dir = dirname(dir)) {
    if (!(statSync(dir).mode & 0o001))
      return `the clone is inside ${dir}, which other users cannot enter (mode ${(statSync(dir).mode & 0o777).toString(8)}); clone where they can to run it`;
    if (dirname(dir) === dir) break;
  }
  const cli = join(root, "bin", "tpu-mcp.js");
  if (!(statSync(cli).mode & 0o004)) return `other users cannot read ${cli}`;
  return null;
}

function lookup(name: string): OsUser | null {
  try {
    const line = execFileSync("getent", ["passwd", name], { encoding: "utf8" }).trim();
    const [, , uid, gid] = line.split(":");
    return { name, uid: Number(uid), gid: Number(gid) };
  } catch {
    return null;
  }
}

/** The system user `name`, made (no home, no login shell) when it does not exist yet. */
export function ensureUser(name: string): OsUser {
  const found = lookup(name);
  if (found) return found;
  try {
    execFileSync("useradd", ["--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name]);
  } catch (e) {
    // Another test process may have made it meanwhile.
    const again = lookup(name);
    if (again) return again;
    throw e;
  }
  return lookup(name)!;
}

/**
 * A deployment laid out as examples/deploy/tpu-mcp.service lays it out: a config everyone may
 * read (`data_dir` set to the state dir), and a state dir (0700) only the server's user may
 * enter. `dir` holds both; the caller removes it.
 */
export function deployFor(
  server: OsUser,
  prefix: string,
  settings: Record<string, unknown>,
): { dir: string; state: string; config: string } {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  chmodSync(dir, 0o755);
  const state = join(dir, "state");
  mkdirSync(state, { mode: 0o700 });
  chownSync(state, server.uid, server.gid);
  const config = join(dir, "config.json");
  writeFileSync(config, JSON.stringify({ data_dir: state, ...settings }), { mode: 0o644 });
  return { dir, state, config };
}

/** A minimal environment for a process of `user` (no variable of the test's own user leaks). */
export function envFor(home: string): NodeJS.ProcessEnv {
  return { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: home, LANG: "C.UTF-8" };
}

export interface RunResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs `cmd args` as `user` to its end (exit code and output; never a throw). */
export function runAs(
  user: OsUser,
  cmd: string,
  args: string[],
  opts: { home?: string; cwd?: string; timeoutMs?: number } = {},
): Promise<RunResult> {
  return new Promise((resolve) => {
    execFile(
      cmd,
      args,
      {
        uid: user.uid,
        gid: user.gid,
        cwd: opts.cwd ?? ROOT,
        env: envFor(opts.home ?? "/nonexistent"),
        timeout: opts.timeoutMs ?? scaled(60_000),
      },
      (err, stdout, stderr) => {
        const code = err ? (typeof err.code === "number" ? err.code : 1) : 0;
        resolve({ code, stdout: String(stdout), stderr: String(stderr) });
      },
    );
  });
}

/** `tpu-mcp <args> --config <config>` as `user`, from the repository root. */
export function cliAs(
  user: OsUser,
  config: string,
  args: string[],
  opts: { home?: string } = {},
): Promise<RunResult> {
  return runAs(user, process.execPath, [CLI, ...args, "--config", config], opts);
}

/** CommonJS code run as `user` from the repository root (require finds its node_modules). */
export function nodeAs(user: OsUser, code: string, opts: { home?: string } = {}) {
  return runAs(user, process.execPath, ["-e", code], opts);
}

/** Spawn options that make the child `user` (for startHttpServer's third argument). */
export function spawnAs(user: OsUser, home: string) {
  return { uid: user.uid, gid: user.gid, env: envFor(home) };
}
