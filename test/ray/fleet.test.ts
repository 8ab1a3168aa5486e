// The Ray fleet end to end: a real local Ray cluster (token auth, two simulated v6e hosts with two
// chips each, loopback only), a real `tpu-mcp stdio` server whose runtime.ray places worker
// actors, the SDK's real Client. The workers inside run on the CPU (no TPU here).
// Run by `npm run test:ray`, inside a network namespace that has only loopback.
import { spawn, spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import Database from "better-sqlite3";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { CLI, ROOT, connectStdio, errorOf, writeConfig } from "../helpers/server.js";
import { call } from "../e2e/scenario.js";
import { rayRuntime, startRayCluster } from "../helpers/fleet.js";
import { scaled } from "../helpers/calibrate.js";
import { waitFor as poll } from "../helpers/wait.js";

const PY = join(ROOT, ".venv/bin/python");
const MODEL = "all-minilm-l6-v2";
const ADMIN_TOKEN = "ray-fleet-test-admin-token-0123456789";

/** The suites' one poll (test/helpers/wait.ts), with this file's deadline and interval. */
const waitFor = <T>(what: string, fn: () => Promise<T | undefined>, ms = 180_000): Promise<T> =>
  poll(what, fn, ms, 300);

/** A child process that leaves the event loop running, so the test's traffic goes on meanwhile. */
function run(
  cmd: string,
  args: string[],
  opts: { env?: NodeJS.ProcessEnv; timeout: number },
): Promise<{ status: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const p = spawn(cmd, args, {
      cwd: ROOT,
      env: opts.env ?? process.env,
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    p.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
    p.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
    const timer = setTimeout(() => p.kill("SIGKILL"), opts.timeout);
    p.on("error", reject);
    p.on("close", (status) => {
      clearTimeout(timer);
      resolve({ status, stdout, stderr });
    });
  });
}

/** One call of the traffic: when it started and ended (ms, performance.now()) and how. */
interface Traced {
  start: number;
  end: number;
  ok: boolean;
  code?: string;
}

describe("Ray fleet (real local cluster, token auth, simulated TPU hosts)", () => {
  let dir: string;
  let cluster: Awaited<ReturnType<typeof startRayCluster>>;
  let conn: Awaited<ReturnType<typeof connectStdio>>;
  let configFile: string;
  let dataDir: string;
  let serverLog = "";
  // What the server logged since a test last cleared it (serverLog keeps only a tail).
  let logTap = "";

  // Before the fleet reports its first endpoint the pool has no worker, and status says so.
  const workers = async () =>
    ((await call(conn.client, "get_runtime_status", {})).structuredContent?.workers ??
      []) as Array<{
      name: string;
      state: string;
      draining: boolean;
      calls: number;
      failures: number;
      models: string[];
      lost_models: string[];
      address: string | null;
      kind: string;
    }>;
  const fleetObserved = () => {
    const db = new Database(join(dataDir, "workers.db"), { readonly: true });
    try {
      const row = db.prepare("SELECT status FROM fleet_observed WHERE id = 1").get() as
        { status: string } | undefined;
      return row
        ? (JSON.parse(row.status) as { actors: Array<{ name: string; ray_name: string }> })
        : undefined;
    } finally {
      db.close();
    }
  };
  const cli = (...args: string[]) =>
    spawnSync(process.execPath, [CLI, ...args, "--config", configFile, "--token", ADMIN_TOKEN], {
      cwd: ROOT,
      encoding: "utf8",
      timeout: scaled(240_000),
    });
  // The same, without freezing the event loop: for commands that must overlap the traffic.
  const cliAsync = (...args: string[]) =>
    run(process.execPath, [CLI, ...args, "--config", configFile, "--token", ADMIN_TOKEN], {
      timeout: scaled(240_000),
    });
  const infer = async (text: string) => {
    const r = await call(conn.client, "run_inference", { model: MODEL, texts: [text] });
    return r.isError
      ? { ok: false as const, code: errorOf(r)?.code ?? "?" }
      : { ok: true as const };
  };
  /** `n` callers calling in a loop until `stop()`; every call traced. */
  const traffic = (n: number, label: string) => {
    let stopped = false;
    let inFlight = 0;
    const callers = Array.from({ length: n }, async (_, k) => {
      const out: Traced[] = [];
      while (!stopped) {
        const start = performance.now();
        inFlight++;
        const r = await infer(`${label} ${k}`);
        inFlight--;
        out.push({ start, end: performance.now(), ...r });
      }
      return out;
    });
    return {
      inFlight: () => inFlight,
      stop: async () => {
        stopped = true;
        return (await Promise.all(callers)).flat();
      },
    };
  };

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), "tpu-mcp-ray-"));
    cluster = await startRayCluster(join(dir, "cluster"), PY);
    const c = cluster.info;
    dataDir = join(dir, "data");
    configFile = writeConfig(
      {
        log_level: "info",
        runtime: rayRuntime(c, 2, { drain_timeout_s: 60 }),
        policy: {
          limits: { rate_limit: { per_principal_per_minute: 60000 } },
          tokens: [
            {
              id: "ops",
              token_sha256: createHash("sha256").update(ADMIN_TOKEN).digest("hex"),
              scopes: ["admin"],
            },
          ],
        },
      },
      dir,
    );
    conn = await connectStdio(configFile);
    conn.transport.stderr?.on("data", (d: Buffer) => {
      serverLog = (serverLog + d.toString()).slice(-200_000);
      logTap = (logTap + d.toString()).slice(-1_000_000);
    });
  });

  afterEach((ctx) => {
    // A failure here is hard to read without the server's own log (Ray, the driver, the pool).
    if (ctx.task.result?.state === "fail")
      process.stderr.write(`--- server log tail ---\n${serverLog.slice(-30_000)}\n`);
  });

  afterAll(async () => {
    await conn?.close();
    if (cluster) {
      const code = await cluster.stop();
      expect(code, cluster.log()).toBe(0); // cluster.py checks that no raylet/gcs_server is left
    }
    const ps = spawnSync("ps", ["-eo", "comm"], { encoding: "utf8" }).stdout;
    expect(ps).not.toMatch(/raylet|gcs_server/);
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it("places one actor per chip and joins each to the pool as a remote worker", async () => {
    // Each actor's serve starts its worker (torch) when the pool connects: wait for both hellos.
    const ws = await waitFor("two ready Ray workers in the pool", async () => {
      const w = (await workers()).filter((x) => x.name.startsWith("ray-"));
      return w.length === 2 && w.every((x) => x.state === "ready") ? w : undefined;
    });
    expect(ws.map((w) => w.name).sort()).toEqual(["ray-0", "ray-1"]);
    for (const w of ws) {
      expect(w.kind).toBe("remote");
      expect(w.address).toMatch(/^127\.0\.0\.1:\d+$/);
    }
  });

  it("serves run_inference through two replicas on Ray-placed workers, spreading load", async () => {
    const loaded = await call(conn.client, "load_model", { model: MODEL, replicas: 2 });
    expect(loaded.isError, JSON.stringify(loaded.content)).toBeFalsy();
    const results = await Promise.all(
      Array.from({ length: 4 }, async (_, k) => {
        const out = [];
        for (let i = 0; i < 6; i++) out.push(await infer(`caller ${k} call ${i}`));
        return out;
      }),
    );
    expect(results.flat().every((r) => r.ok)).toBe(true);
    const ws = (await workers()).filter((w) => w.name.startsWith("ray-"));
    for (const w of ws) {
      expect(w.models).toContain(MODEL);
      expect(w.calls).toBeGreaterThan(0);
    }
  });

  it("ray.kill of one actor mid-traffic fails only calls in flight on it; Ray restarts it and it rejoins", async () => {
    const observed = await waitFor("the fleet status", async () => fleetObserved());
    const victim = observed.actors.find((a) => a.name === "ray-1")!;
    expect(victim).toBeDefined();
    const load = traffic(4, "traffic");
    await new Promise((r) => setTimeout(r, 1500));
    // The kill runs beside the traffic (an async child process): calls are in flight when the
    // actor dies, on ray-1 among them.
    const inFlightAtKill = load.inFlight();
    const killStart = performance.now();
    const kill = await run(
      PY,
      [
        "-c",
        "import ray,sys; ray.init(address=sys.argv[1], namespace='tpu-mcp', logging_level='error'); " +
          "ray.kill(ray.get_actor(sys.argv[2]), no_restart=False)",
        cluster.info.address,
        victim.ray_name,
      ],
      {
        timeout: scaled(60_000),
        env: {
          ...process.env,
          RAY_AUTH_MODE: "token",
          RAY_AUTH_TOKEN_PATH: cluster.info.ray_token_file,
        },
      },
    );
    const killEnd = performance.now();
    expect(kill.status, kill.stderr).toBe(0);
    await new Promise((r) => setTimeout(r, 3000));
    const results = await load.stop();
    expect(inFlightAtKill).toBeGreaterThan(0);
    const failed = results.filter((r) => !r.ok);
    // The killed worker had calls in flight: they fail, as worker_died, and no others do. At most
    // one per caller, and each was in flight while the kill ran (started before it ended, ended
    // after it began).
    expect(failed.length).toBeGreaterThanOrEqual(1);
    expect(failed.length).toBeLessThanOrEqual(4);
    expect(failed.map((f) => f.code)).toEqual(failed.map(() => "worker_died"));
    for (const f of failed) {
      expect(f.start).toBeLessThanOrEqual(killEnd);
      expect(f.end).toBeGreaterThanOrEqual(killStart);
    }
    // Traffic recovers on the surviving replica: every call started after the failures succeeds.
    const lastFailure = Math.max(...failed.map((f) => f.end));
    const after = results.filter((r) => r.start > lastFailure);
    expect(after.length).toBeGreaterThan(0);
    expect(after.every((r) => r.ok)).toBe(true);
    // Ray restarts the actor; the fleet reports its new endpoint, the pool takes it back and
    // loads the model it held again (same args): the model has two replicas again, no loss.
    logTap = "";
    const back = await waitFor("ray-1 back in the pool with the model loaded again", async () => {
      const w = (await workers()).find((x) => x.name === "ray-1");
      return w && w.state === "ready" && !w.draining && w.models.includes(MODEL) ? w : undefined;
    });
    expect(back.lost_models).toEqual([]);
    expect((await workers()).filter((w) => w.models.includes(MODEL))).toHaveLength(2);
    // The reload is the control plane's own action, in the audit trail as such (the record is
    // written just after the load ends, so it may trail the status by a moment).
    await waitFor(
      "the reload in the audit trail",
      async () => {
        const t = await run(
          process.execPath,
          [CLI, "audit", "tail", "-n", "500", "--config", configFile],
          { timeout: scaled(60_000) },
        );
        return / control-plane load_model executed/.test(t.stdout) ? true : undefined;
      },
      60_000,
    );
    expect(logTap).toMatch(/loaded a lost model again on the replacement worker/);
    expect((await infer("after the restart")).ok).toBe(true);
  });

  it("workers scale N (admin) adds actors, and removes them after draining", async () => {
    const up = cli("workers", "scale", "3");
    expect(up.status, up.stderr).toBe(0);
    expect(up.stdout).toMatch(/Ray fleet at 3 worker/);
    await waitFor("ray-2 ready in the pool", async () =>
      (await workers()).find((w) => w.name === "ray-2" && w.state === "ready") ? true : undefined,
    );
    // Scale down to 1 while traffic runs (the CLI in an async child, so the traffic goes on):
    // ray-2 and ray-1 drain first, calls in flight on them complete, so no call fails.
    const load = traffic(3, "during scale-down");
    await new Promise((r) => setTimeout(r, 1000));
    const inFlightAtScale = load.inFlight();
    const downStart = performance.now();
    const down = await cliAsync("workers", "scale", "1");
    const downEnd = performance.now();
    const results = await load.stop();
    expect(down.status, down.stderr).toBe(0);
    expect(inFlightAtScale).toBeGreaterThan(0);
    // Calls overlapped the scale-down (in flight when it began, and started while it ran) ...
    const overlapping = results.filter((r) => r.start <= downEnd && r.end >= downStart);
    expect(overlapping.filter((r) => r.start < downStart).length).toBeGreaterThan(0);
    expect(overlapping.filter((r) => r.start > downStart).length).toBeGreaterThan(0);
    // ... and every one of them completed.
    expect(results.filter((r) => !r.ok)).toEqual([]);
    const left = (await workers()).filter((w) => w.name.startsWith("ray-")).map((w) => w.name);
    expect(left).toEqual(["ray-0"]);
    const over = cli("workers", "scale", "9");
    expect(over.status).toBe(1);
    expect(over.stderr).toMatch(/out_of_range/);
  });

  it("a config reload applies a new actor count (workers reload, SIGHUP), drains on the way down, refuses an invalid file", async () => {
    const original = readFileSync(configFile, "utf8");
    const withRay = (
      edit: (ray: Record<string, any>) => void,
      top: Record<string, unknown> = {},
    ) => {
      const raw = JSON.parse(original) as Record<string, any>;
      edit(raw.runtime.ray);
      writeFileSync(configFile, JSON.stringify({ ...raw, ...top }, null, 2));
    };
    const rayWorkers = async () => (await workers()).filter((w) => w.name.startsWith("ray-"));
    const pid = conn.transport.pid!;
    expect(pid).toBeGreaterThan(0);
    const before = (await rayWorkers()).map((w) => w.name);
    expect(before).toEqual(["ray-0"]);

    // An invalid file: the server logs why and nothing changes.
    withRay((r) => (r.placement.count = "three"));
    logTap = "";
    process.kill(pid, "SIGHUP");
    await waitFor(
      "the refusal in the server log",
      async () =>
        /config reload refused, nothing changed[\s\S]*placement\.count/.test(logTap)
          ? true
          : undefined,
      60_000,
    );
    expect((await rayWorkers()).map((w) => w.name)).toEqual(["ray-0"]);

    // count 2 -> 3 through `tpu-mcp workers reload` (admin): the CLI waits for three actors.
    withRay((r) => (r.placement.count = 3));
    const up = cli("workers", "reload");
    expect(up.status, up.stderr).toBe(0);
    expect(up.stdout).toMatch(/applied: runtime\.ray\.placement\.count: 2 -> 3/);
    expect(up.stdout).toMatch(/Ray fleet at 3 worker/);
    const three = await waitFor("three ready Ray workers", async () => {
      const w = await rayWorkers();
      return w.length === 3 && w.every((x) => x.state === "ready") ? w : undefined;
    });
    expect(three.map((w) => w.kind)).toEqual(["remote", "remote", "remote"]);
    // get_runtime_status shows the fleet: driver, cluster, placement, target vs observed.
    const st = (await call(conn.client, "get_runtime_status", {})).structuredContent as {
      fleet: {
        state: string;
        address: string;
        mode: string;
        target: number;
        observed: number;
        capacity: number;
        actor_restarts: number;
        actors: Array<{ name: string; state: string }>;
      };
    };
    expect(st.fleet).toMatchObject({
      state: "ready",
      address: cluster.info.address,
      mode: "per-chip",
      target: 3,
      observed: 3,
      capacity: 4,
    });
    expect(st.fleet.actors.map((a) => a.state)).toEqual(["up", "up", "up"]);

    // count 3 -> 1 by SIGHUP while traffic runs: removals drain first, so no call fails; a
    // changed setting that needs a restart is named in the log and left as it is.
    let stop = false;
    const callers = Array.from({ length: 3 }, async (_, k) => {
      const out: boolean[] = [];
      while (!stop) out.push((await infer(`during reload ${k}`)).ok);
      return out;
    });
    withRay((r) => (r.placement.count = 1), { log_level: "debug" });
    logTap = "";
    process.kill(pid, "SIGHUP");
    const one = await waitFor("one Ray worker left", async () => {
      const w = await rayWorkers();
      return w.length === 1 ? w : undefined;
    });
    stop = true;
    const results = (await Promise.all(callers)).flat();
    expect(results.length).toBeGreaterThan(0);
    expect(results.every(Boolean)).toBe(true);
    expect(one[0].state).toBe("ready");
    expect(logTap).toMatch(/need a restart: log_level/);
    const st2 = (await call(conn.client, "get_runtime_status", {})).structuredContent as {
      fleet: { target: number; observed: number };
    };
    expect(st2.fleet.target).toBe(1);
    writeFileSync(configFile, original);
  });
  it("a refused fleet (wrong Ray token) is visible over MCP: get_runtime_status answers with fleet.state refused and the error", async () => {
    const c = cluster.info;
    const wrong = join(dir, "wrong-ray-token");
    writeFileSync(wrong, "0".repeat(64) + "\n", { mode: 0o600 });
    const other = writeConfig(
      {
        log_level: "info",
        // A wrong Ray token: the fleet is refused.
        runtime: rayRuntime(c, 1, { token_file: wrong }),
      },
      mkdtempSync(join(dir, "refused-")),
    );
    const refused = await connectStdio(other);
    try {
      const st = await waitFor("the fleet refused", async () => {
        const r = await call(refused.client, "get_runtime_status", {});
        // No worker at all: status answers anyway, with the device part marked unavailable.
        expect(r.isError, JSON.stringify(r.content)).toBeFalsy();
        const s = r.structuredContent as any;
        return s.fleet?.state === "refused" ? s : undefined;
      });
      expect(st.fleet.error.code).toBe("ray_auth_refused");
      expect(st.fleet.error.message.length).toBeGreaterThan(0);
      expect(st.device_unavailable.code).toBe("worker_unavailable");
      expect(st.workers).toEqual([]);
    } finally {
      await refused.close();
    }
  });
});
