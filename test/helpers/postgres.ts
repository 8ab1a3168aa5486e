// A real PostgreSQL for the tests: Debian's server binaries (apt-get install postgresql), a
// fresh cluster in a temporary folder, listening on 127.0.0.1 only (its Unix socket in the same
// folder), password authentication, stopped by its PID. Run as root, the cluster belongs to the
// `postgres` user the package creates (initdb refuses root).
import { execFileSync, spawnSync } from "node:child_process";
import {
  chmodSync,
  chownSync,
  existsSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

export interface TestPostgres {
  /** postgres://tpu:PASSWORD@127.0.0.1:PORT/tpu */
  url: string;
  password: string;
  port: number;
  /** The postmaster's PID (what stop() signals). */
  pid: number;
  stop(): Promise<void>;
}

/** The newest installed server's bin folder, or null: the suite says how to install one. */
export function postgresBin(): string | null {
  const base = "/usr/lib/postgresql";
  if (!existsSync(base)) return null;
  const versions = execFileSync("ls", [base], { encoding: "utf8" })
    .split("\n")
    .filter((v) => /^\d+$/.test(v))
    .sort((a, b) => Number(b) - Number(a));
  for (const v of versions)
    if (existsSync(join(base, v, "bin", "initdb"))) return join(base, v, "bin");
  return null;
}

/** A port free on 127.0.0.1 now (the kernel's pick; released before it is returned). */
export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

export async function startPostgres(): Promise<TestPostgres> {
  const bin = postgresBin();
  if (!bin) throw new Error("no PostgreSQL server installed: apt-get install -y postgresql");
  const root = process.getuid?.() === 0;
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-pg-"));
  const data = join(dir, "data");
  const password = `pw-${Math.random().toString(36).slice(2)}-${Date.now()}`;
  const pwfile = join(dir, "pw");
  writeFileSync(pwfile, password + "\n", { mode: 0o600 });
  if (root) {
    const pg = execFileSync("id", ["-u", "postgres"], { encoding: "utf8" }).trim();
    const gid = execFileSync("id", ["-g", "postgres"], { encoding: "utf8" }).trim();
    chownSync(dir, Number(pg), Number(gid));
    chownSync(pwfile, Number(pg), Number(gid));
    chmodSync(dir, 0o700);
  }
  const as = (cmd: string, args: string[]) =>
    root
      ? spawnSync("runuser", ["-u", "postgres", "--", cmd, ...args], { encoding: "utf8" })
      : spawnSync(cmd, args, { encoding: "utf8" });
  const check = (r: ReturnType<typeof spawnSync>, what: string) => {
    if (r.status !== 0) throw new Error(`${what} failed (${r.status}): ${r.stderr}${r.stdout}`);
  };
  check(
    as(join(bin, "initdb"), [
      "-D",
      data,
      "-U",
      "tpu",
      "--pwfile",
      pwfile,
      "-A",
      "scram-sha-256",
      "--no-sync",
      "-E",
      "UTF8",
      "--locale",
      "C",
    ]),
    "initdb",
  );
  const port = await freePort();
  // fsync off: a test cluster is thrown away; the store's transactions are what is tested.
  check(
    as(join(bin, "pg_ctl"), [
      "-D",
      data,
      "-l",
      join(dir, "log"),
      "-w",
      "-t",
      "60",
      "-o",
      `-k ${dir} -h 127.0.0.1 -p ${port} -c fsync=off -c max_connections=200`,
      "start",
    ]),
    "pg_ctl start",
  );
  const pid = Number(readFileSync(join(data, "postmaster.pid"), "utf8").split("\n")[0]);
  const env = { ...process.env, PGPASSWORD: password };
  const createdb = spawnSync(
    join(bin, "createdb"),
    ["-h", "127.0.0.1", "-p", String(port), "-U", "tpu", "tpu"],
    { encoding: "utf8", env },
  );
  check(createdb, "createdb");
  return {
    url: `postgres://tpu:${encodeURIComponent(password)}@127.0.0.1:${port}/tpu`,
    password,
    port,
    pid,
    async stop() {
      try {
        process.kill(pid, "SIGINT"); // fast shutdown: rolls back open transactions
      } catch {
        // already gone
      }
      const until = Date.now() + 60_000;
      while (Date.now() < until) {
        try {
          process.kill(pid, 0);
        } catch {
          break;
        }
        await new Promise((r) => setTimeout(r, 100));
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
