// A deployment of tpu-mcp replicas for the tests and the bench: a real PostgreSQL
// (test/helpers/postgres.ts), N real servers (`bin/tpu-mcp.js http`, each on its own fixed port
// of 127.0.0.1, all reading ONE config file with `storage.postgres` and the database URL in
// TPU_MCP_DATABASE_URL), and Debian's HAProxy in front with examples/haproxy/tpu-mcp.cfg as it
// is shipped. Every process is stopped by its PID. A replica can be killed with SIGKILL and
// started again on the same port (so with the same derived replica id, server/app/replica.ts).
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { scaled } from "./calibrate.js";
import { freePort, startPostgres, type TestPostgres } from "./postgres.js";
import { ROOT, startHttpServer, writeConfig, type HttpServerProc } from "./server.js";

export const HAPROXY_CONFIG = join(ROOT, "examples/haproxy/tpu-mcp.cfg");
/** The replicas' names, as the HAProxy config's servers are named. */
export const NAMES = ["a", "b", "c"] as const;

export interface Replica {
  name: string;
  port: number;
  /** Its own /mcp, bypassing the load balancer. */
  url: string;
  /** The running server; null while it is down. */
  server: HttpServerProc | null;
  /** Starts it (again) on its port. */
  start(): Promise<void>;
  /** SIGKILL, as a crash: no shutdown hook runs; resolves once the process is gone. */
  kill9(): Promise<void>;
  /** SIGTERM and wait (the clean shutdown). */
  stop(): Promise<void>;
}

export interface Deployment {
  /** Null with storage "sqlite". */
  db: TestPostgres | null;
  /** The one config file every replica reads. */
  config: string;
  /** The config's data_dir: a replica on Postgres never needs it. */
  dataDir: string;
  replicas: Replica[];
  /** The load balancer's /mcp. */
  url: string;
  haproxyPid: number;
  /** Everything, by PID, the load balancer first. */
  stop(): Promise<void>;
}

export interface DeploymentOptions {
  /** The config's `policy` section (tokens, limits, approvals). */
  policy: Record<string, unknown>;
  /** More top-level config (runtime, http, …). */
  config?: Record<string, unknown>;
  /** Variables for the replicas' processes (and so their workers). */
  env?: Record<string, string>;
  /** More of `storage.postgres` (replica_id is never given: one config serves every replica). */
  postgres?: Record<string, unknown>;
  /** How many replicas (at most three: the HAProxy config names a, b, c); default 3. */
  replicas?: number;
  /**
   * "postgres" (the default): one config, one database. "sqlite": each replica its own config
   * and data directory, sharing nothing (what sessions and routing need, without the store).
   */
  storage?: "postgres" | "sqlite";
}

/** Waits until something accepts connections on 127.0.0.1:port. */
async function listening(port: number, what: string): Promise<void> {
  const until = Date.now() + scaled(30_000);
  for (;;) {
    const ok = await new Promise<boolean>((resolve) => {
      const s = connect(port, "127.0.0.1");
      s.once("connect", () => {
        s.destroy();
        resolve(true);
      });
      s.once("error", () => resolve(false));
    });
    if (ok) return;
    if (Date.now() > until) throw new Error(`${what} is not listening on ${port}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Every process descended from `pid` (its worker and what that started), from /proc. */
function descendants(pid: number): number[] {
  const parent = new Map<number, number>();
  for (const e of readdirSync("/proc")) {
    if (!/^\d+$/.test(e)) continue;
    try {
      // The fields after the command's closing parenthesis: state, then the parent's pid.
      const stat = readFileSync(`/proc/${e}/stat`, "utf8");
      parent.set(Number(e), Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]));
    } catch {
      // gone meanwhile
    }
  }
  const out: number[] = [];
  const walk = (p: number) => {
    for (const [child, pp] of parent) {
      if (pp !== p) continue;
      out.push(child);
      walk(child);
    }
  };
  walk(pid);
  return out;
}

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

/**
 * After its server was killed, what it had started (its worker) is given a while to see the
 * closed pipe and exit, then is killed by PID: nothing outlives the test.
 */
async function reap(pids: number[]): Promise<void> {
  const until = Date.now() + scaled(10_000);
  while (pids.some(alive) && Date.now() < until) await new Promise((r) => setTimeout(r, 100));
  for (const p of pids.filter(alive)) process.kill(p, "SIGKILL");
}

function killAndWait(proc: ChildProcess, signal: NodeJS.Signals): Promise<void> {
  return new Promise((resolve) => {
    if (proc.exitCode !== null || proc.signalCode !== null) return resolve();
    proc.once("exit", () => resolve());
    process.kill(proc.pid!, signal);
  });
}

/** Debian's HAProxy, or a clear error saying how to get it (test/postgres/setup.ts installs it as root). */
export function haproxyBin(): string | null {
  const r = spawnSync("sh", ["-c", "command -v haproxy"], { encoding: "utf8" });
  return r.status === 0 ? r.stdout.trim() : null;
}

/** HAProxy with the shipped config, its addresses in the environment it expands. */
export async function startHaproxy(
  ports: number[],
): Promise<{ url: string; pid: number; stop(): Promise<void> }> {
  const bin = haproxyBin();
  if (!bin) throw new Error("no HAProxy installed: apt-get install -y haproxy");
  const port = await freePort();
  const env: Record<string, string> = {
    ...(process.env as Record<string, string>),
    TPU_MCP_LB_BIND: `127.0.0.1:${port}`,
  };
  // The config names three servers; with fewer replicas the rest point at a closed port (down).
  const closed = await freePort();
  NAMES.forEach((n, i) => {
    env[`TPU_MCP_REPLICA_${n.toUpperCase()}`] = `127.0.0.1:${ports[i] ?? closed}`;
  });
  // -db: in the foreground, not a daemon, so this process's PID is HAProxy's.
  const proc = spawn(bin, ["-db", "-f", HAPROXY_CONFIG], {
    env,
    stdio: ["ignore", "ignore", "pipe"],
  });
  let err = "";
  proc.stderr!.on("data", (d) => (err += d.toString()));
  const exited = new Promise<never>((_, reject) =>
    proc.once("exit", (code) => reject(new Error(`haproxy exited ${code}: ${err}`))),
  );
  await Promise.race([listening(port, "haproxy"), exited]);
  return {
    url: `http://127.0.0.1:${port}/mcp`,
    pid: proc.pid!,
    stop: () => killAndWait(proc, "SIGTERM"),
  };
}

/** Postgres, the replicas on it, HAProxy in front; torn down by PID if any step fails. */
export async function startDeployment(opts: DeploymentOptions): Promise<Deployment> {
  const n = opts.replicas ?? 3;
  if (n < 1 || n > NAMES.length) throw new Error(`1 to ${NAMES.length} replicas, not ${n}`);
  const shared = (opts.storage ?? "postgres") === "postgres";
  const db = shared ? await startPostgres() : null;
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-replicas-"));
  const dataDir = join(dir, "data");
  // The database URL (its password) is not in the file: every replica reads it from its environment.
  const configIn = (d: string, storage: Record<string, unknown>) =>
    writeConfig({ ...opts.config, data_dir: join(d, "data"), storage, policy: opts.policy }, d);
  const config = configIn(dir, shared ? { postgres: { ...opts.postgres } } : { sqlite: {} });
  const env = {
    ...(process.env as Record<string, string>),
    ...opts.env,
    ...(db ? { TPU_MCP_DATABASE_URL: db.url } : {}),
  };
  const replicas: Replica[] = [];
  let lb: Awaited<ReturnType<typeof startHaproxy>> | undefined;
  const stopAll = async () => {
    await lb?.stop();
    await Promise.all(replicas.map((r) => r.stop()));
    await db?.stop();
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    for (const name of NAMES.slice(0, n)) {
      const port = await freePort();
      const own = shared ? config : configIn(mkdtempSync(join(dir, `${name}-`)), { sqlite: {} });
      const r: Replica = {
        name,
        port,
        url: `http://127.0.0.1:${port}/mcp`,
        server: null,
        async start() {
          if (r.server) throw new Error(`replica ${name} is already running`);
          r.server = await startHttpServer(own, ["--port", String(port)], { env });
        },
        async kill9() {
          const s = r.server;
          r.server = null;
          if (!s) return;
          const children = descendants(s.proc.pid!);
          await killAndWait(s.proc, "SIGKILL");
          await reap(children);
        },
        async stop() {
          const s = r.server;
          r.server = null;
          if (s) await s.stop();
        },
      };
      replicas.push(r);
    }
    // Started together, as a deployment rolls out: they race for the migration's lock.
    await Promise.all(replicas.map((r) => r.start()));
    lb = await startHaproxy(replicas.map((r) => r.port));
  } catch (e) {
    await stopAll().catch(() => {});
    throw e;
  }
  return {
    db,
    config,
    dataDir,
    replicas,
    url: lb.url,
    haproxyPid: lb.pid,
    stop: stopAll,
  };
}
