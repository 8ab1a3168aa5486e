// One Ray fleet behind two replicas on one Postgres (server/control/shared_fleet.ts), end to end:
// a real local Ray cluster (token auth, simulated TPU hosts), a real PostgreSQL on 127.0.0.1 and
// two `tpu-mcp http` replicas reading one config with storage.postgres and runtime.ray, all in the
// Ray suite's loopback-only network namespace. One replica leads (runs the fleet driver), the
// other follows the actors it placed; a model loaded through one is served through the other by
// the same actor; killing the leader hands the driver's lease, and the fleet, to the other.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { scaled, slowdown } from "../helpers/calibrate.js";
import { rayRuntime, startRayCluster } from "../helpers/fleet.js";
import { callModern, connectModernHttp } from "../helpers/modern.js";
import { startDeployment, type Deployment, type Replica } from "../helpers/replicas.js";
import { DEMO_POLICY, DEMO_TOKENS, ROOT } from "../helpers/server.js";
import { waitFor as waitUntil } from "../helpers/wait.js";

const PY = join(ROOT, ".venv/bin/python");
const MODEL = "all-minilm-l6-v2";
const LEASE_S = 4 * slowdown();
const waitFor = <T>(what: string, fn: () => Promise<T | undefined>) =>
  waitUntil(what, fn, scaled(180_000), 300);

interface Status {
  replica: { id: string; shard: boolean; note: string };
  workers?: Array<{ name: string; state: string; address: string | null; models: string[] }>;
  fleet?: {
    leader?: string | null;
    observed: number;
    actors: Array<{ name: string; address: string | null }>;
  };
}

let dir: string;
let cluster: Awaited<ReturnType<typeof startRayCluster>> | undefined;
let d: Deployment | undefined;
const clients = new Map<string, Awaited<ReturnType<typeof connectModernHttp>>>();

async function client(r: Replica) {
  let c = clients.get(r.name);
  if (!c) {
    c = await connectModernHttp(r.url, DEMO_TOKENS.agent);
    clients.set(r.name, c);
  }
  return c.client;
}

async function status(r: Replica): Promise<Status> {
  const res = await callModern(await client(r), "get_runtime_status", {});
  expect(res.isError, JSON.stringify(res.content)).toBeFalsy();
  return res.structuredContent as Status;
}

/** Until `r`'s pool has ray-0 ready; its address. */
const rayReady = (r: Replica) =>
  waitFor(`ray-0 ready on replica ${r.name}`, async () => {
    const w = (await status(r)).workers?.find((x) => x.name === "ray-0");
    return w?.state === "ready" && w.address ? w.address : undefined;
  });

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "tpu-mcp-ray-shared-"));
  cluster = await startRayCluster(join(dir, "cluster"), PY);
  const c = cluster.info;
  d = await startDeployment({
    replicas: 2,
    // No approval rules: the load is the test's own (a human approves loads in a deployment).
    policy: {
      ...DEMO_POLICY,
      approvals: { ...DEMO_POLICY.approvals, rules: [] },
      limits: { rate_limit: { per_principal_per_minute: 60000 } },
    },
    postgres: { fleet_lease_s: LEASE_S },
    config: { runtime: rayRuntime(c, 1, { drain_timeout_s: 30 }) },
  });
});

afterEach((ctx) => {
  // A failure is hard to read without the replicas' own logs (the lease, the driver, the pool).
  if (ctx.task.result?.state === "fail")
    for (const r of d?.replicas ?? [])
      process.stderr.write(
        `--- replica ${r.name} log tail ---\n${r.server?.stderr().slice(-15_000) ?? "(down)"}\n`,
      );
});

afterAll(async () => {
  for (const c of clients.values()) await c.close().catch(() => {});
  await d?.stop();
  if (cluster) {
    const code = await cluster.stop();
    expect(code, cluster.log()).toBe(0);
  }
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe("one Ray fleet shared by two replicas on Postgres", () => {
  let leader: Replica;
  let follower: Replica;

  it("one replica leads; both reach the same actor, and neither is a shard", async () => {
    const [a, b] = d!.replicas as [Replica, Replica];
    const [ra, rb] = [await rayReady(a), await rayReady(b)];
    expect(ra).toBe(rb);
    const [sa, sb] = [await status(a), await status(b)];
    expect(sa.fleet!.leader).toBeTruthy();
    expect(sb.fleet!.leader).toBe(sa.fleet!.leader);
    [leader, follower] = sa.fleet!.leader === sa.replica.id ? [a, b] : [b, a];
    for (const s of [sa, sb]) {
      expect(s.replica.shard).toBe(false);
      expect(s.replica.note).toMatch(/Ray fleet is shared/);
      expect(s.fleet!.actors.map((x) => x.name)).toEqual(["ray-0"]);
    }
  });

  it("a model loaded through one replica is served through the other by the same actor", async () => {
    const loaded = await callModern(await client(leader), "load_model", { model: MODEL });
    expect(loaded.isError, JSON.stringify(loaded.content)).toBeFalsy();
    const r = await callModern(await client(follower), "run_inference", {
      model: MODEL,
      texts: ["through the follower"],
    });
    expect(r.isError, JSON.stringify(r.content)).toBeFalsy();
    const w = (await status(follower)).workers!.find((x) => x.name === "ray-0")!;
    expect(w.models).toContain(MODEL);
  });

  it("the leader killed: the other replica takes the driver over and serves the model again", async () => {
    const before = await rayReady(follower);
    const survivorId = (await status(follower)).replica.id;
    clients
      .get(leader.name)
      ?.close()
      .catch(() => {});
    clients.delete(leader.name);
    await leader.kill9();
    await waitFor("the survivor leading", async () =>
      (await status(follower)).fleet!.leader === survivorId ? true : undefined,
    );
    const after = await rayReady(follower);
    expect(after).not.toBe(before); // a new actor, placed by the new leader's driver
    // The model it held is loaded again on the new actor (pool.replace), and serves.
    await waitFor("the model on the new actor", async () => {
      const w = (await status(follower)).workers!.find((x) => x.name === "ray-0");
      return w?.models.includes(MODEL) ? true : undefined;
    });
    const r = await callModern(await client(follower), "run_inference", {
      model: MODEL,
      texts: ["after the hand-over"],
    });
    expect(r.isError, JSON.stringify(r.content)).toBeFalsy();
  });
});
