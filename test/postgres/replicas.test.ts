// Three tpu-mcp replicas behind HAProxy (examples/haproxy/tpu-mcp.cfg as shipped), with the
// SDK's real clients of both eras: 2026-07-28 requests spread over every replica, 2025-11-25
// sessions stay on the replica that made them, and a session whose replica is gone gets the
// 404 that makes a client initialize again; every replica says which one answered, in
// get_runtime_status and in its /metrics series.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { callModern, connectModernHttp } from "../helpers/modern.js";
import { startDeployment, type Deployment, type Replica } from "../helpers/replicas.js";
import { connectHttp, DEMO_POLICY, DEMO_TOKENS } from "../helpers/server.js";
import { scaled } from "../helpers/calibrate.js";

const POLICY = {
  ...DEMO_POLICY,
  limits: { ...DEMO_POLICY.limits, rate_limit: { per_principal_per_minute: 6000 } },
  approvals: { rules: [] },
};

interface Answered {
  replica: { id: string; storage: string; shard: boolean; note: string };
}

/** The replica that answered a get_runtime_status call. */
async function answeredBy(call: () => Promise<any>): Promise<Answered["replica"]> {
  const r = await call();
  expect(r.isError, JSON.stringify(r.content)).toBeFalsy();
  return (r.structuredContent as Answered).replica;
}

const modernStatus = (client: any) => () => callModern(client, "get_runtime_status", {});
const legacyStatus = (client: any) => () =>
  client.callTool({ name: "get_runtime_status", arguments: {} });

/** The replica whose id names its port (host:port, server/app/replica.ts). */
function replicaOf(d: Deployment, id: string): Replica {
  const r = d.replicas.find((x) => id.endsWith(`:${x.port}`));
  if (!r) throw new Error(`no replica has the id ${id}`);
  return r;
}

/** Until the load balancer serves modern requests from every replica again (health checks). */
async function allServing(d: Deployment): Promise<void> {
  const c = await connectModernHttp(d.url, DEMO_TOKENS.agent);
  try {
    const until = Date.now() + scaled(60_000);
    const seen = new Set<string>();
    while (seen.size < d.replicas.length) {
      if (Date.now() > until) throw new Error(`only ${[...seen].join(", ")} serve`);
      seen.add((await answeredBy(modernStatus(c.client))).id);
    }
  } finally {
    await c.close();
  }
}

/** One Postgres, one config file for the three replicas. */
const STORAGE = "postgres";
let d: Deployment;

beforeAll(async () => {
  d = await startDeployment({ policy: POLICY, storage: STORAGE });
});

afterAll(async () => {
  await d?.stop();
});

describe("sessions behind HAProxy", () => {
  it("2026-07-28 requests are served by every replica", async () => {
    const c = await connectModernHttp(d.url, DEMO_TOKENS.agent);
    try {
      expect(c.client.getProtocolEra()).toBe("modern");
      const seen = new Set<string>();
      for (let i = 0; i < 3 * d.replicas.length; i++)
        seen.add((await answeredBy(modernStatus(c.client))).id);
      expect(new Set([...seen].map((id) => replicaOf(d, id).name)).size).toBe(d.replicas.length);
    } finally {
      await c.close();
    }
  });

  it("2025-11-25 sessions stay on the replica that created them", async () => {
    const clients = await Promise.all([0, 1, 2].map(() => connectHttp(d.url, DEMO_TOKENS.agent)));
    try {
      const perSession: Set<string>[] = [];
      for (const c of clients) {
        const seen = new Set<string>();
        for (let i = 0; i < 4; i++) seen.add((await answeredBy(legacyStatus(c.client))).id);
        perSession.push(seen);
      }
      for (const seen of perSession) expect(seen.size).toBe(1);
      // New sessions are balanced: three of them do not all land on one replica.
      expect(new Set(perSession.map((s) => [...s][0])).size).toBeGreaterThan(1);
    } finally {
      await Promise.all(clients.map((c) => c.close()));
    }
  });

  it("a replica answers 404 for a session it does not hold", async () => {
    const r = await fetch(d.replicas[0]!.url, {
      method: "POST",
      headers: {
        authorization: `Bearer ${DEMO_TOKENS.agent}`,
        "content-type": "application/json",
        accept: "application/json, text/event-stream",
        "mcp-session-id": "a-session-no-replica-made",
        "mcp-protocol-version": "2025-11-25",
      },
      body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "tools/list" }),
    });
    expect(r.status).toBe(404);
  });

  it("when a session's replica is killed, the next request gets 404 and a new session is served by another", async () => {
    const c = await connectHttp(d.url, DEMO_TOKENS.agent);
    const first = await answeredBy(legacyStatus(c.client));
    const gone = replicaOf(d, first.id);
    await gone.kill9();
    try {
      // HAProxy finds the server refusing (or marked down), redispatches, and the live replica
      // does not know the session: 404, the status the SDK surfaces and the spec answers with
      // a new initialize.
      const err = await c.client.callTool({ name: "get_runtime_status", arguments: {} }).then(
        () => undefined,
        (e: unknown) => e as { code?: number; message?: string },
      );
      expect(err?.code, String(err?.message)).toBe(404);
      await c.close().catch(() => {});
      const again = await connectHttp(d.url, DEMO_TOKENS.agent);
      try {
        const next = await answeredBy(legacyStatus(again.client));
        expect(next.id).not.toBe(first.id);
      } finally {
        await again.close();
      }
    } finally {
      await gone.start();
      await allServing(d);
    }
  });
});

describe("which replica answered", () => {
  it("get_runtime_status names the replica, a shard of the fleet; every /metrics series carries its `replica` label", async () => {
    for (const r of d.replicas) {
      const c = await connectModernHttp(r.url, DEMO_TOKENS.agent);
      try {
        const replica = await answeredBy(modernStatus(c.client));
        expect(replica.id.endsWith(`:${r.port}`)).toBe(true);
        expect(replica.storage).toBe(STORAGE);
        // On a shared store the workers a replica reaches are its alone: a shard.
        expect(replica.shard).toBe(true);
        expect(replica.note).toMatch(/local workers are its own processes/);
      } finally {
        await c.close();
      }
      const metrics = await (await fetch(r.url.replace(/\/mcp$/, "/metrics"))).text();
      const series = metrics.split("\n").filter((l) => l.startsWith("tpu_mcp_"));
      expect(series.length).toBeGreaterThan(0);
      const label = new RegExp(`replica="[^"]*:${r.port}"`);
      for (const line of series) expect(line).toMatch(label);
    }
  });
});
