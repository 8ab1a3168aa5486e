// The pool's own logic without real workers where a real one cannot be had here: the config of
// `runtime.workers`, the per-device expansion from an inventory (a TPU host is faked at the
// inventory and spawn level), and routing decisions over stand-in members. The real thing (real
// workers, a real remote worker over TLS, a real MCP client) is test/e2e/pool.test.ts.
import { spawn as nodeSpawn } from "node:child_process";
import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import type { SpawnFn, WorkerRuntime } from "../../runtime/client.js";
import {
  WorkerPool,
  chipEnv,
  devDir,
  hostMayHaveAccelerators,
  parseInventory,
  perDeviceEntries,
  type RestoreReport,
  type WorkerEntry,
} from "../../runtime/pool/index.js";
import { RuntimeCallError } from "../../runtime/types.js";
import { ConfigError, loadConfig, parseConfig } from "../../server/config/config.js";
import { buildRuntime, workersMode } from "../../server/app/build_runtime.js";
import { repoRoot } from "./helpers.js";

const silent = pino({ level: "silent" });

describe("runtime.workers config", () => {
  it("accepts local and remote workers and resolves certificate paths against the config file", () => {
    const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-workers-"));
    const file = join(dir, "c.json");
    writeFileSync(
      file,
      JSON.stringify({
        runtime: {
          workers: [
            { name: "w0", device: "tpu:0" },
            { name: "w1", device: "cpu", threads: 1, memory_bytes: 1e9 },
            {
              name: "vm2-tpu3",
              connect: "10.0.0.5:7900",
              tls: { ca: "pki/ca.crt", cert: "pki/cp.crt", key: "/abs/cp.key" },
              token_file: "pki/token",
            },
          ],
        },
      }),
    );
    const c = loadConfig(file, repoRoot);
    const remote = (c.runtime.workers as any[])[2];
    expect(remote.tls.ca).toBe(join(dir, "pki/ca.crt"));
    expect(remote.tls.key).toBe("/abs/cp.key");
    expect(remote.token_file).toBe(join(dir, "pki/token"));
  });

  it("rejects duplicate names, names that read as devices, and a connect that is not host:port", () => {
    const bad = [
      [
        { name: "w0", device: "cpu" },
        { name: "w0", device: "cpu" },
      ],
      [{ name: "tpu:1", device: "cpu" }],
      [{ name: "cpu", device: "cpu" }],
      [{ name: "r", connect: "10.0.0.5", tls: { ca: "a", cert: "b", key: "c" }, token_file: "t" }],
      [{ name: "r", connect: "h:1", tls: { ca: "a", cert: "b" }, token_file: "t" }],
    ];
    for (const workers of bad) {
      expect(
        () => parseConfig({ runtime: { workers } }, { root: repoRoot }),
        JSON.stringify(workers),
      ).toThrow(ConfigError);
    }
  });

  it("keeps one worker by default on a CPU host, and goes per device on a host with chips", () => {
    const cpu = parseConfig({}, { root: repoRoot });
    expect(workersMode(cpu, () => false)).toBe("single");
    expect(workersMode(cpu, () => true)).toBe("per-device");
    const pinned = parseConfig({ runtime: { device: "tpu:0" } }, { root: repoRoot });
    expect(workersMode(pinned, () => true)).toBe("single");
    const listed = parseConfig(
      { runtime: { workers: [{ name: "a", device: "cpu" }] } },
      { root: repoRoot },
    );
    expect(workersMode(listed, () => false)).toBe("list");
  });
});

describe("per-device expansion", () => {
  it("gives one worker per chip, and one worker on a CPU or single-chip host", () => {
    expect(
      perDeviceEntries({ kind: "tpu", count: 8, name: "TPU v6e" }).map((w) => w.device),
    ).toEqual(Array.from({ length: 8 }, (_, i) => `tpu:${i}`));
    expect(perDeviceEntries({ kind: "cuda", count: 2, name: "H200" }, 4)).toEqual([
      { name: "w0", device: "cuda:0", threads: 4 },
      { name: "w1", device: "cuda:1", threads: 4 },
    ]);
    expect(perDeviceEntries({ kind: "cpu", count: 1, name: "cpu" })).toEqual([
      { name: "w0", device: "cpu" },
    ]);
    expect(() => parseInventory("not json")).toThrow(/one JSON line/);
    expect(() => parseInventory('{"kind":"gpu","count":1}')).toThrow(/unexpected/);
  });

  it("starts each chip's worker with --device tpu:i (the TPU host faked at the inventory and spawn)", async () => {
    const spawned: string[][] = [];
    const visible = new Map<string, string | undefined>();
    // Each "worker" exits 4 (no such device here) at once: only the command lines matter.
    const spawn: SpawnFn = (_cmd, args, opts) => {
      spawned.push([...args]);
      visible.set(args[args.indexOf("--device") + 1]!, opts.env?.TPU_VISIBLE_DEVICES);
      return nodeSpawn(process.execPath, ["-e", "process.exit(4)"], opts);
    };
    const config = parseConfig(
      { runtime: { workers: "per-device", start: "lazy", threads: 1 } },
      { root: repoRoot },
    );
    const pool = buildRuntime(config, silent, {
      inventory: async () => ({ kind: "tpu", count: 4, name: "TPU v5e" }),
      spawn,
    }).pool as WorkerPool;
    await expect(pool.start()).rejects.toThrow();
    expect(pool.names()).toEqual(["w0", "w1", "w2", "w3"]);
    const devices = spawned.map((a) => a[a.indexOf("--device") + 1]).sort();
    expect(devices).toEqual(["tpu:0", "tpu:1", "tpu:2", "tpu:3"]);
    // …each with its chip the only visible one, from the process's first instruction.
    for (const d of devices) expect(visible.get(d), d).toBe(d.split(":")[1]);
    for (const a of spawned)
      expect(a.slice(a.indexOf("--threads"), a.indexOf("--threads") + 2)).toEqual([
        "--threads",
        "1",
      ]);
    await pool.close();
  });
});

describe("a chip worker's environment and the host look", () => {
  it("makes the worker's chip the only visible one, unless the operator chose a visible set", () => {
    const base = { PATH: "/bin" };
    expect(chipEnv("tpu:3", base)).toEqual({ PATH: "/bin", TPU_VISIBLE_DEVICES: "3" });
    expect(chipEnv("cuda:1", base)).toEqual({ PATH: "/bin", CUDA_VISIBLE_DEVICES: "1" });
    for (const d of ["cpu", "tpu", "auto", "xla:0"]) expect(chipEnv(d, base), d).toBe(base);
    const chosen = { TPU_VISIBLE_DEVICES: "4,5" };
    expect(chipEnv("tpu:5", chosen)).toBe(chosen);
    expect(chipEnv("tpu:0", { TPU_VISIBLE_DEVICES: " " })).toEqual({ TPU_VISIBLE_DEVICES: "0" });
    expect(base).toEqual({ PATH: "/bin" }); // never mutated
  });

  it("looks for chips under /dev, or under TPU_MCP_DEV_DIR when it is set", () => {
    expect(devDir({})).toBe("/dev");
    const root = mkdtempSync(join(tmpdir(), "tpu-mcp-simdev-"));
    expect(devDir({ TPU_MCP_DEV_DIR: join(root, "dev") })).toBe(join(root, "dev"));
    // The simulator's own variable means nothing to the server.
    expect(devDir({ TPU_SIM_ROOT: root })).toBe("/dev");
    expect(hostMayHaveAccelerators(join(root, "dev"))).toBe(false);
    mkdirSync(join(root, "dev/vfio"), { recursive: true });
    writeFileSync(join(root, "dev/vfio/0"), "");
    expect(hostMayHaveAccelerators(join(root, "dev"))).toBe(false); // one chip: one worker
    writeFileSync(join(root, "dev/vfio/1"), "");
    writeFileSync(join(root, "dev/vfio/vfio"), ""); // the container node is no chip
    expect(hostMayHaveAccelerators(join(root, "dev"))).toBe(true);
  });
});

/** A stand-in member: ready, holding some models, with a settable number of calls in flight. */
function fakeRuntime(models: string[]) {
  const state = { inFlight: 0, calls: 0, ops: [] as string[] };
  const rt = {
    state: "ready",
    hello: { device: { kind: "cpu", index: 0, memory_free_bytes: null } },
    restarts: () => 0,
    lastError: () => null,
    inFlight: () => state.inFlight,
    // The pool's bookkeeping learns what a worker holds from its ended loads: replay them.
    on: (event: string, fn: (e: unknown) => void) => {
      if (event === "ended")
        for (const model of models) fn({ op: "load", args: { model }, result: { model } });
    },
    close: async () => {},
    start: async () => rt.hello,
    ready: async () => rt.hello,
    call: async (op: string) => {
      state.calls++;
      state.ops.push(op);
      return { result: {}, tensors: [] };
    },
  };
  return { rt: rt as unknown as WorkerRuntime, state };
}

function fakePool(n: number, cap: number, pick?: (n: number) => number) {
  const fakes = Array.from({ length: n }, () => fakeRuntime(["m"]));
  const entries: WorkerEntry[] = fakes.map((_, i) => ({ name: `w${i}`, device: "cpu" }));
  let i = 0;
  const pool = new WorkerPool({
    entries,
    maxInFlightPerReplica: cap,
    retryAfterMs: 250,
    makeRuntime: () => fakes[i++]!.rt,
    ...(pick ? { pick } : {}),
  });
  return { pool, fakes };
}

/** A seeded random index in [0, n) (an LCG): the same draws on every run. */
function seeded(seed: number): (n: number) => number {
  let x = seed >>> 0;
  return (n) => {
    x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
    return Math.floor((x / 2 ** 32) * n);
  };
}

describe("routing", () => {
  it("refuses busy with retry_after_ms when every replica is at its cap, never queues", async () => {
    const { pool, fakes } = fakePool(2, 2);
    for (const f of fakes) f.state.inFlight = 2;
    const e = await pool.call("infer", { model: "m" }).catch((x) => x);
    expect(e).toBeInstanceOf(RuntimeCallError);
    expect(e.code).toBe("busy");
    expect(e.details.retry_after_ms).toBe(250);
    expect(fakes.every((f) => f.state.calls === 0)).toBe(true);
  });

  it("sends to the replica below its cap, and with two choices to the shorter queue", async () => {
    const { pool, fakes } = fakePool(2, 4);
    fakes[0]!.state.inFlight = 4;
    for (let k = 0; k < 10; k++) await pool.call("infer", { model: "m" });
    expect(fakes[1]!.state.calls).toBe(10);
    fakes[0]!.state.inFlight = 1;
    fakes[1]!.state.inFlight = 3;
    for (let k = 0; k < 10; k++) await pool.call("infer", { model: "m" });
    expect(fakes[0]!.state.calls).toBe(10);
  });

  it("power of two choices: two replicas drawn at random, the less loaded taken", async () => {
    // Equal load: the draw decides, so both replicas get a fair share. "Always the first open
    // replica" and "least loaded, first on a tie" both send all 200 calls to w0 and fail here.
    const even = fakePool(2, 100, seeded(7));
    for (let k = 0; k < 200; k++) await even.pool.call("infer", { model: "m" });
    const [a, b] = even.fakes.map((f) => f.state.calls);
    expect(a! + b!).toBe(200);
    expect(Math.min(a!, b!)).toBeGreaterThan(70);
    await even.pool.close();

    // Unequal load over three replicas: the busiest is never taken (it loses every pair it is
    // drawn in), and the idlest is not always taken (the pair without it happens): only two
    // random choices, not a scan of all replicas.
    const three = fakePool(3, 100, seeded(11));
    three.fakes[0]!.state.inFlight = 9;
    three.fakes[1]!.state.inFlight = 5;
    three.fakes[2]!.state.inFlight = 1;
    for (let k = 0; k < 300; k++) await three.pool.call("infer", { model: "m" });
    const calls = three.fakes.map((f) => f.state.calls);
    expect(calls[0]).toBe(0);
    expect(calls[1]).toBeGreaterThan(50); // ~1/3: the pair {w0, w1}
    expect(calls[2]).toBeGreaterThan(150); // ~2/3: every pair with w2
    await three.pool.close();
  });

  it("places once: the call runs on the worker its ticket chose, and fails over only when that one is gone", async () => {
    const { pool, fakes } = fakePool(2, 4);
    const bench = {
      model: "m",
      batch_sizes: [1],
      dtypes: ["float32"],
      modes: ["eager"],
      scenario: "single-stream",
      warmup: 1,
      extend_factor: 1,
      limits: {
        max_configs: 8,
        max_iterations: 10,
        max_duration_s: 5,
        max_warmup: 3,
        min_seq_len: 2,
      },
    };
    // w0 is the pick now (configuration order on a tie)...
    const ticket = pool.place("benchmark", { model: "m" });
    expect(ticket.lane).toBe("w0");
    expect(ticket.worker).toBe("w0");
    // ...and while the call waits at the gate, w1 becomes the better pick: the call still runs
    // on w0, the worker whose lane it waited on, and the ticket records it.
    fakes[0]!.state.inFlight = 3;
    const r = await pool.call("benchmark", bench, { placement: ticket });
    expect(r.worker).toBe("w0");
    expect(fakes.map((f) => f.state.ops)).toEqual([["benchmark"], []]);
    expect(ticket.ran()).toEqual(["w0"]);
    // Without a ticket the call would have been placed anew (on w1).
    expect((await pool.call("benchmark", bench)).worker).toBe("w1");
    // The chosen worker drained meanwhile: explicit failover to the best usable one.
    const t2 = pool.place("check", { model: "m" });
    expect(t2.worker).toBe("w1");
    pool.drain("w1");
    expect((await pool.call("check", { model: "m" }, { placement: t2 })).worker).toBe("w0");
    expect(t2.ran()).toEqual(["w0"]);
    // Infer is routed when sent: no lane, and the receipt names the replica that answered.
    const t3 = pool.place("infer", { model: "m" });
    expect(t3.lane).toBeUndefined();
    const r3 = await pool.call("infer", { model: "m" }, { placement: t3 });
    expect(t3.ran()).toEqual([r3.worker]);
    await pool.close();
  });

  it("a pool of one local worker places nothing and passes through (the default shape)", async () => {
    const one = fakeRuntime(["m"]);
    (one.rt as any).options = { device: "auto" };
    const pool = WorkerPool.single(one.rt);
    expect(pool.single).toBe(true);
    // The lane is the worker's own chip, as the one worker's lane always was.
    expect(pool.place("load", { model: "m" }).lane).toBe("cpu:0");
    expect(pool.place("benchmark", { model: "m", device: "tpu:1" }).lane).toBe("tpu:1");
    const t = pool.place("infer", { model: "m" });
    await pool.call("infer", { model: "m" }, { placement: t });
    // Nothing recorded: a single worker's audit records never named a worker.
    expect(t.ran()).toEqual([]);
    // Status is the worker's own answer, with no pool fields added.
    expect((await pool.call("status", {})).result).toEqual({});
    expect(one.state.ops).toEqual(["infer", "status"]);
    expect(() => pool.add({ name: "w1", device: "cpu" })).toThrow(/single-worker/);
    await pool.close();
  });

  it("answers a status of many workers with what a call on any of them meets: the libraries all have imported, the fewest models built", async () => {
    const { pool, fakes } = fakePool(2, 4);
    const answers = [
      { libraries: ["transformers"], models_built: 3 },
      { libraries: [], models_built: 0 },
    ];
    fakes.forEach((f, i) => {
      (f.rt as any).call = async () => ({ result: answers[i], tensors: [] });
    });
    const { result } = await pool.call("status", {});
    // A load may land on the fresh one: it is cold there (policies/estimate.ts prices it so).
    expect(result.libraries).toEqual([]);
    expect(result.models_built).toBe(0);
    await pool.close();
  });

  it("skips a drained replica, and says so when only drained replicas hold the model", async () => {
    const { pool, fakes } = fakePool(2, 4);
    pool.drain("w0");
    for (let k = 0; k < 6; k++) await pool.call("infer", { model: "m" });
    expect(fakes[0]!.state.calls).toBe(0);
    pool.drain("w1");
    const e = await pool.call("infer", { model: "m" }).catch((x) => x);
    expect(e.code).toBe("model_not_loaded");
    expect(e.recoverable).toBe(true);
    expect(e.message).toMatch(/w0 \(drained\), w1 \(drained\)/);
    pool.undrain("w0");
    await pool.call("infer", { model: "m" });
    expect(fakes[0]!.state.calls).toBe(1);
    expect(() => pool.drain("nope")).toThrow(/no worker named nope; workers: w0, w1/);
  });

  it("a load asking for more replicas than are ready waits for workers still starting", async () => {
    const fakes = [fakeRuntime([]), fakeRuntime([])];
    const late = fakes[1]!.rt as any;
    late.state = "starting";
    late.ready = () =>
      new Promise((r) =>
        setTimeout(() => {
          late.state = "ready";
          r(late.hello);
        }, 50),
      );
    let i = 0;
    const pool = new WorkerPool({
      entries: [
        { name: "w0", device: "cpu" },
        { name: "w1", device: "cpu" },
      ],
      makeRuntime: () => fakes[i++]!.rt,
    });
    await pool.call("load", { model: "m", replicas: 2 });
    // Both workers, the late one included: a status for free memory, then the load itself.
    expect(fakes.map((f) => f.state.ops)).toEqual([
      ["status", "load"],
      ["status", "load"],
    ]);
    expect(late.state).toBe("ready");
    await pool.close();
  });

  it("adds and removes workers at run time", async () => {
    const extra = fakeRuntime(["m"]);
    const p2 = new WorkerPool({ entries: [], makeRuntime: () => extra.rt });
    p2.add({
      name: "r9",
      connect: "10.0.0.9:7900",
      tls: { ca: "a", cert: "b", key: "c" },
      token_file: "t",
    });
    expect(p2.names()).toEqual(["r9"]);
    expect(() => p2.add({ name: "r9", device: "cpu" })).toThrow(/already/);
    expect((await p2.call("infer", { model: "m" })).worker).toBe("r9");
    expect(extra.state.ops).toEqual(["infer"]);
    await p2.remove("r9");
    expect(p2.names()).toEqual([]);
    await p2.close();
  });
});

/** A stand-in worker whose loads and unloads end as a real one's do, and that can die. */
function liveFake(name: string, failLoad?: RuntimeCallError) {
  const listeners: Record<string, Array<(e: unknown) => void>> = {};
  const emit = (event: string, e: unknown) => {
    for (const fn of listeners[event] ?? []) fn(e);
  };
  const ops: Array<{ op: string; args: Record<string, unknown> }> = [];
  const rt = {
    name,
    ops,
    state: "ready",
    hello: { device: { kind: "cpu", index: 0, memory_free_bytes: null } },
    restarts: () => 0,
    lastError: () => null,
    inFlight: () => 0,
    on: (event: string, fn: (e: unknown) => void) => (listeners[event] ??= []).push(fn),
    /** The process (actor) dies: its models are gone. */
    die: () => {
      rt.state = "restarting";
      emit("exit", { code: null, signal: "SIGKILL", inFlight: 0 });
    },
    close: async () => {
      rt.state = "stopped";
      emit("exit", { code: null, signal: "SIGTERM", inFlight: 0 });
    },
    start: async () => rt.hello,
    ready: async () => rt.hello,
    call: async (op: string, args: Record<string, unknown>) => {
      ops.push({ op, args });
      if (op === "load") {
        if (failLoad) {
          emit("ended", { op, args, code: failLoad.code });
          throw failLoad;
        }
        const result = {
          model: args.model,
          device: "cpu",
          dtype: args.dtype ?? "float32",
          mode: args.mode ?? "eager",
          bytes_on_device: 1000,
        };
        emit("ended", { op, args, result });
        return { result, tensors: [] };
      }
      return { result: {}, tensors: [] };
    },
  };
  return rt;
}

describe("a worker replaced under the same name (a Ray actor restart)", () => {
  const remote = (name: string): WorkerEntry => ({
    name,
    connect: "127.0.0.1:7900",
    tls: { ca: "a", cert: "b", key: "c" },
    token_file: "t",
  });
  const setup = (next: Array<ReturnType<typeof liveFake>>) => {
    const made: Array<ReturnType<typeof liveFake>> = [];
    const reports: RestoreReport[] = [];
    const pool = new WorkerPool({
      entries: [],
      makeRuntime: () => {
        const f = next.shift()!;
        made.push(f);
        return f as unknown as WorkerRuntime;
      },
      onRestore: (r) => reports.push(r),
    });
    pool.add(remote("ray-0"));
    pool.add(remote("ray-1"));
    return { pool, made, reports };
  };
  const settle = async (reports: RestoreReport[], n: number) => {
    for (let i = 0; i < 200 && reports.length < n; i++) await new Promise((r) => setTimeout(r, 5));
  };

  it("loads the models the old one held again on the new one, with the same dtype and mode: the replica count is back", async () => {
    const { pool, made, reports } = setup([
      liveFake("ray-0"),
      liveFake("ray-1"),
      liveFake("ray-1 after restart"),
      liveFake("ray-1 after a second restart"),
      liveFake("ray-1 after a third restart"),
    ]);
    const loaded = await pool.call("load", {
      model: "m",
      replicas: 2,
      dtype: "float16",
      mode: "compiled",
    } as never);
    expect((loaded.result as any).placement.map((p: any) => p.worker).sort()).toEqual([
      "ray-0",
      "ray-1",
    ]);
    // The actor dies; Ray restarts it and the fleet reports the new endpoint under the same name.
    made[1]!.die();
    expect(pool.workers().find((w) => w.name === "ray-1")!.lost_models).toEqual(["m"]);
    await pool.replace(remote("ray-1"));
    await settle(reports, 1);
    expect(reports).toEqual([
      {
        worker: "ray-1",
        model: "m",
        args: { model: "m", dtype: "float16", mode: "compiled" },
        outcome: "restored",
      },
    ]);
    // The new worker got the same load (its own device: no device named), through the pool.
    const fresh = made[2]!;
    expect(fresh.ops.find((o) => o.op === "load")!.args).toEqual({
      model: "m",
      dtype: "float16",
      mode: "compiled",
    });
    const r1 = pool.workers().find((w) => w.name === "ray-1")!;
    expect(r1.models).toEqual(["m"]);
    expect(r1.lost_models).toEqual([]);
    expect(pool.lostModels()).toEqual([]);
    expect(pool.workers().filter((w) => w.models.includes("m"))).toHaveLength(2);

    // Lost again right after that reload: the model may be what kills the worker, so it is not
    // loaded a second time; it is reported lost where agents and operators look.
    fresh.die();
    await pool.replace(remote("ray-1"));
    await settle(reports, 2);
    expect(reports[1]).toMatchObject({ worker: "ray-1", model: "m", outcome: "skipped" });
    expect(made[3]!.ops.some((o) => o.op === "load")).toBe(false);
    expect(pool.workers().find((w) => w.name === "ray-1")!.lost_models).toEqual(["m"]);
    expect(pool.lostModels()).toEqual(["m"]);
    // A model the pool gave up on is the caller's from then on: a later replacement still
    // reports it lost and does not try again; a caller's load takes it back.
    made[3]!.die();
    await pool.replace(remote("ray-1"));
    await new Promise((r) => setTimeout(r, 50));
    expect(reports).toHaveLength(2);
    expect(made[4]!.ops.some((o) => o.op === "load")).toBe(false);
    expect(pool.workers().find((w) => w.name === "ray-1")!.lost_models).toEqual(["m"]);
    await pool.call("load", { model: "m", device: "ray-1" } as never);
    expect(pool.lostModels()).toEqual([]);
    await pool.close();
  });

  it("reports the loss (lost_models, onRestore failed with the code) when the new worker cannot take the model", async () => {
    const full = new RuntimeCallError("insufficient_memory", "no room", false);
    const { pool, made, reports } = setup([
      liveFake("ray-0"),
      liveFake("ray-1"),
      liveFake("ray-1 after restart", full),
    ]);
    await pool.call("load", { model: "m", replicas: 2 } as never);
    made[1]!.die();
    await pool.replace(remote("ray-1"));
    await settle(reports, 1);
    expect(reports).toHaveLength(1);
    expect(reports[0]).toMatchObject({
      worker: "ray-1",
      model: "m",
      outcome: "failed",
      code: "insufficient_memory",
    });
    expect(pool.workers().find((w) => w.name === "ray-1")!.lost_models).toEqual(["m"]);
    expect(pool.lostModels()).toEqual(["m"]);
    await pool.close();
  });
});
