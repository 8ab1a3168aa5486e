// Which replica a process is (server/app/replica.ts) and the `replica` label on its metrics.
import { describe, expect, it } from "vitest";
import { Metrics } from "../../server/app/metrics.js";
import { replicaIdentity, replicaStatus } from "../../server/app/replica.js";

const pg = (replica_id?: string) => ({
  storage: {
    postgres: {
      url: "postgres://x",
      replica_id,
      job_lease_s: 30,
      fleet_lease_s: 10,
      max_clock_skew_ms: 5000,
      call_lease_s: 15,
    },
  },
});

describe("replica identity", () => {
  it("is the configured id, else host:port, else names the process", () => {
    expect(replicaIdentity(pg("east-1"), { port: 8080 }, "h")).toEqual({
      id: "east-1",
      storage: "postgres",
    });
    expect(replicaIdentity(pg(), { port: 8080 }, "h").id).toBe("h:8080");
    expect(replicaIdentity(pg(), { port: 0 }, "h").id).toBe(`h:pid-${process.pid}`);
    expect(replicaIdentity({ storage: { sqlite: {} } }, null, "h")).toEqual({
      id: `h:pid-${process.pid}`,
      storage: "sqlite",
    });
  });

  it("a replica on a shared store is a shard unless every worker it reaches is a shared remote one, and says why", () => {
    const id = replicaIdentity(pg(), { port: 1 }, "h");
    const local = replicaStatus(id, [{ kind: "local" }], null);
    expect(local.shard).toBe(true);
    expect(local.note).toMatch(/local workers are its own processes/);
    // A remote worker serves every replica from one worker process; a Ray driver places its own actors.
    const remote = replicaStatus(id, [{ kind: "remote" }, { kind: "remote" }], null);
    expect(remote.shard).toBe(false);
    expect(remote.note).toMatch(/one fleet.*remote workers are shared/);
    const mixed = replicaStatus(id, [{ kind: "local" }, { kind: "remote" }], null);
    expect(mixed.shard).toBe(true);
    expect(mixed.note).toMatch(/local workers are its own.*remote workers are shared/);
    const both = replicaStatus(id, [{ kind: "remote" }], "shared");
    expect(both.shard).toBe(false);
    expect(both.note).toMatch(/remote workers are shared.*Ray fleet is shared/);
    const ray = replicaStatus(id, [{ kind: "remote" }], "own");
    expect(ray.shard).toBe(true);
    expect(ray.note).toMatch(/actors of its own/);
    const one = replicaIdentity({ storage: { sqlite: {} } }, { port: 1 }, "h");
    expect(replicaStatus(one, [{ kind: "local" }], null).shard).toBe(false);
  });

  it("a replica whose only workers are the shared Ray fleet's actors is no shard", () => {
    const id = replicaIdentity(pg(), { port: 1 }, "h");
    const shared = replicaStatus(id, [], "shared");
    expect(shared.shard).toBe(false);
    expect(shared.note).toMatch(/Ray fleet is shared/);
    // Its own local workers beside the shared fleet still make it a shard, and the note says both.
    const mixed = replicaStatus(id, [{ kind: "local" }], "shared");
    expect(mixed.shard).toBe(true);
    expect(mixed.note).toMatch(/local workers are its own processes.*Ray fleet is shared/);
  });

  it("every /metrics series carries the replica label", async () => {
    const m = new Metrics({ replica: "h:8080" });
    m.calls.inc({ tool: "infer", outcome: "ok" });
    m.sessions.set(2);
    const lines = (await m.registry.metrics()).split("\n").filter((l) => /^tpu_mcp_\w+\{/.test(l));
    expect(lines.length).toBeGreaterThan(1);
    for (const l of lines) expect(l).toContain('replica="h:8080"');
  });
});
