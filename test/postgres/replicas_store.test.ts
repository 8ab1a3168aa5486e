// Three tpu-mcp replicas on ONE Postgres behind HAProxy (test/helpers/replicas.ts), with the SDK's
// real clients of both eras, proving what the shared store promises across replicas (issue 30):
// one principal's device-second budget is one cap however its calls are spread; an approval
// requested through A is listed and decided through B and runs once through C; a replayed
// in-band request state is refused on every replica; a replica killed with SIGKILL fails at
// most the calls in flight on it, its jobs are marked interrupted only once their lease expired,
// and its restart marks nothing of the others'; `tpu-mcp audit verify` passes on the trail all
// three wrote and fails after a one-row edit; an output stored by a call through A is read back,
// byte for byte, through B and C, and by no other principal. One deployment for the file;
// mnist-cnn, the cheapest model, is the only one loaded.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { hashToken } from "../../policies/config.js";
import { NOW_MS, openPool, type PgPool } from "../../server/stores/pg/pool.js";
import { scaled, slowdown } from "../helpers/calibrate.js";
import { callModern, connectModernHttp, type SentRequest } from "../helpers/modern.js";
import { startDeployment, type Deployment, type Replica } from "../helpers/replicas.js";
import { cli, connectHttp, errorOf } from "../helpers/server.js";

const TOKENS = {
  agent: "store-agent-token-0123456789",
  loader: "store-loader-token-012345678",
  asker: "store-asker-token-0123456789",
  replayer: "store-replayer-token-0123456",
  caller: "store-caller-token-012345678",
  operator: "store-operator-token-012345",
  producer: "store-producer-token-0123456",
  snoop: "store-snoop-token-0123456789",
};
const INFER = ["models:read", "inference:run"];
/** The principals' budget per window, device-seconds (every principal's line). */
const LIMIT = 3600;
/** What the budgeted agent has left when its 8 callers start: the rest was spent earlier. */
const LEFT = 1;
/** A job's lease (storage.postgres.job_lease_s): short, but past a loaded replica's renewals. */
const JOB_LEASE_S = Math.max(8, Math.round(5 * slowdown()));

const POLICY = {
  tokens: [
    { id: "agent", token_sha256: hashToken(TOKENS.agent), scopes: INFER },
    {
      id: "loader",
      token_sha256: hashToken(TOKENS.loader),
      scopes: ["models:read", "models:load"],
    },
    { id: "asker", token_sha256: hashToken(TOKENS.asker), scopes: INFER },
    { id: "replayer", token_sha256: hashToken(TOKENS.replayer), scopes: INFER },
    {
      id: "caller",
      token_sha256: hashToken(TOKENS.caller),
      scopes: [...INFER, "benchmark:run", "jobs:read"],
    },
    { id: "operator", token_sha256: hashToken(TOKENS.operator), scopes: ["approvals:grant"] },
    { id: "producer", token_sha256: hashToken(TOKENS.producer), scopes: INFER },
    { id: "snoop", token_sha256: hashToken(TOKENS.snoop), scopes: INFER },
  ],
  limits: {
    rate_limit: { per_principal_per_minute: 60_000 },
    per_tool_concurrency: { run_inference: 16, run_benchmark: 2 },
    queue_bound: { run_inference: 64 },
    // A benchmark job shares the device with the callers' inference (they are not queued
    // behind it); loads still have it to themselves.
    device_exclusive_tools: ["load_model", "unload_model", "check_model"],
    device_shared_tools: ["run_inference", "run_benchmark"],
    budget: { device_seconds_per_window: LIMIT, window_s: 3600 },
  },
  approvals: {
    rules: [
      // Decided out of band by an operator (console, CLI).
      { tool: "run_inference", principals: ["asker"] },
      // Decided in band by the 2026-07-28 client's answer (input_required + requestState).
      { tool: "run_inference", principals: ["replayer"], assurance: "client_form" },
    ],
    elicitation: true,
    elicitation_timeout_s: 120,
  },
};

/** A distinct mnist-cnn input per call (each call its own argument digest). */
const input = (i: number) => ({
  model: "mnist-cnn",
  tensors: [
    { dtype: "float32", shape: [1, 1, 28, 28], data: Array(784).fill(((i % 997) + 1) / 1000) },
  ],
});

let d: Deployment;
let pool: PgPool;
const byName = (n: string): Replica => d.replicas.find((r) => r.name === n)!;
const sql = async <T = Record<string, any>>(text: string, args: unknown[] = []) =>
  (await pool.query(text, args)).rows as T[];
/** The replica id a replica's rows carry (HOST:PORT, server/app/replica.ts). */
async function replicaId(r: Replica): Promise<string> {
  const c = await connectModernHttp(r.url, TOKENS.agent);
  try {
    const s = await callModern(c.client, "get_runtime_status", {});
    return s.structuredContent.replica.id as string;
  } finally {
    await c.close();
  }
}

beforeAll(async () => {
  d = await startDeployment({
    policy: POLICY,
    // One mnist-cnn input's 10 logits stay inline (every other test's calls); a batch of two is
    // stored and linked as tpu://outputs/… (the stored outputs' test).
    config: { inference: { inline_max_elements: 10 } },
    postgres: { job_lease_s: JOB_LEASE_S },
    // Every synchronize() of a CPU worker waits this long: a benchmark job sleeps through its
    // iterations instead of taking the cores the callers need (inference never synchronizes).
    env: { TPU_WORKER_CPU_DEVICE_WAIT_S: "0.05" },
  });
  pool = openPool(d.db!.url, { max: 2, application: "replicas-store-test" });
  // The CLI reads the database URL where the replicas do: the config names no password.
  process.env.TPU_MCP_DATABASE_URL = d.db!.url;
  // Each replica's worker is its own (a shard): mnist-cnn loaded on each, by a principal of its own.
  await Promise.all(
    d.replicas.map(async (r) => {
      const c = await connectModernHttp(r.url, TOKENS.loader);
      try {
        const loaded = await callModern(c.client, "load_model", { model: "mnist-cnn" });
        expect(loaded.isError, JSON.stringify(loaded.content)).toBeFalsy();
      } finally {
        await c.close();
      }
    }),
  );
});

afterAll(async () => {
  delete process.env.TPU_MCP_DATABASE_URL;
  await pool?.end();
  await d?.stop();
});

describe("one budget across replicas", () => {
  it(
    "8 agents of both eras spread over the replicas are charged at most the limit + 1 s, then refused budget_exceeded",
    async () => {
      // The agent spent all but LEFT earlier in the window (on the database's clock, as charged).
      await sql(
        `INSERT INTO budget_charges (principal, time_ms, seconds, tool, replica)
         VALUES ('agent', ${NOW_MS}, $1, NULL, 'earlier')`,
        [LIMIT - LEFT],
      );
      const modern = await Promise.all(
        [0, 1, 2, 3].map(() => connectModernHttp(d.url, TOKENS.agent)),
      );
      const legacy = await Promise.all([0, 1, 2, 3].map(() => connectHttp(d.url, TOKENS.agent)));
      const call = (i: number, n: number) =>
        i < 4
          ? callModern(modern[i]!.client, "run_inference", input(i * 1000 + n))
          : legacy[i - 4]!.client.callTool({
              name: "run_inference",
              arguments: input(i * 1000 + n),
            });
      try {
        // Each agent calls until it is refused (bounded: a cap that never refuses fails below).
        const agents = await Promise.all(
          Array.from({ length: 8 }, async (_, i) => {
            let ran = 0;
            for (let n = 0; n < 1000; n++) {
              const r: any = await call(i, n);
              if (r.isError) return { ran, refused: errorOf(r) };
              ran++;
            }
            return { ran, refused: undefined };
          }),
        );
        for (const a of agents)
          expect(a.refused?.code, JSON.stringify(a.refused)).toBe("budget_exceeded");
        expect(agents.reduce((s, a) => s + a.ran, 0)).toBeGreaterThan(0);
        // Every hold settled (the answers came first): nothing of the agent's is in flight.
        const left = async () => [
          ...(await sql(
            "SELECT 'hold' AS what, * FROM budget_reservations WHERE principal = 'agent'",
          )),
          ...(await sql(
            "SELECT 'call' AS what, id, replica, started_ms, alive_ms FROM calls_in_flight WHERE principal = 'agent'",
          )),
        ];
        const deadline = Date.now() + scaled(20_000);
        while ((await left()).length > 0 && Date.now() < deadline)
          await new Promise((r) => setTimeout(r, 100));
        expect(await left()).toEqual([]);
        const rows = await sql<{ replica: string; s: number; n: string }>(
          `SELECT replica, sum(seconds) AS s, count(*) AS n FROM budget_charges
           WHERE principal = 'agent' GROUP BY replica`,
        );
        const total = rows.reduce((s, r) => s + r.s, 0);
        expect(total).toBeLessThanOrEqual(LIMIT + 1);
        // Each replica charged its own calls: at least every call it ran to its answer, at most
        // every call it admitted. Not that every replica charged some: a running call's overrun
        // is read live by the others' admissions, so LEFT (~8 calls) can be spent by two replicas'
        // calls before a third admits any of its own; it then refuses them all, rightly.
        const audited = await sql<{ replica: string; outcome: string; n: string }>(
          `SELECT replica, record::json->>'outcome' AS outcome, count(*) AS n FROM audit_records
           WHERE record::json->>'principal' = 'agent' AND record::json->>'tool' = 'run_inference'
           GROUP BY 1, 2`,
        );
        const count = (replica: string, outcome: string) =>
          Number(audited.find((a) => a.replica === replica && a.outcome === outcome)?.n ?? 0);
        for (const r of d.replicas) {
          const id = await replicaId(r);
          const charged = Number(rows.find((x) => x.replica === id)?.n ?? 0);
          expect(charged, id).toBeGreaterThanOrEqual(count(id, "executed"));
          expect(charged, id).toBeLessThanOrEqual(count(id, "allowed"));
        }
        // Spent, in both eras, on every replica, the ones that charged nothing included.
        for (const r of d.replicas) {
          const m = await connectModernHttp(r.url, TOKENS.agent);
          const l = await connectHttp(r.url, TOKENS.agent);
          try {
            const modernCall = await callModern(m.client, "run_inference", input(999));
            expect(errorOf(modernCall)?.code, r.name).toBe("budget_exceeded");
            const legacyCall = await l.client.callTool({
              name: "run_inference",
              arguments: input(998),
            });
            expect(errorOf(legacyCall)?.code, r.name).toBe("budget_exceeded");
          } finally {
            await Promise.all([m.close(), l.close()]);
          }
        }
      } finally {
        await Promise.all([...modern, ...legacy].map((c) => c.close()));
      }
    },
    scaled(180_000),
  );
});

describe("an approval across replicas", () => {
  /** A console session of the operator on one replica: the API's GET and POST. */
  async function consoleOf(r: Replica) {
    const base = r.url.replace(/\/mcp$/, "");
    const signIn = await fetch(`${base}/console/api/session`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ token: TOKENS.operator }),
    });
    expect(signIn.status).toBe(200);
    const cookie = (signIn.headers.get("set-cookie") ?? "").split(";")[0]!;
    const { csrf } = (await signIn.json()) as { csrf: string };
    return {
      get: async (path: string) =>
        (await fetch(`${base}/console/api/${path}`, { headers: { cookie } })).json() as any,
      post: (path: string) =>
        fetch(`${base}/console/api/${path}`, {
          method: "POST",
          headers: {
            cookie,
            "x-csrf-token": csrf,
            origin: `http://${new URL(base).host}`,
            "sec-fetch-site": "same-origin",
            "content-type": "application/json",
          },
          body: "{}",
        }),
    };
  }

  it("requested through A, listed and approved through B's console, runs once through C; a second use is refused, and a first use raced over the replicas runs once", async () => {
    const [a, b, c] = [byName("a"), byName("b"), byName("c")];
    const args = input(424242);
    const clients = await Promise.all([a, b, c].map((r) => connectModernHttp(r.url, TOKENS.asker)));
    const [onA, onB, onC] = clients;
    try {
      const asked = await callModern(onA!.client, "run_inference", args);
      expect(errorOf(asked)?.code, JSON.stringify(asked.content)).toBe("approval_required");
      const id = errorOf(asked)!.details.approval_id as string;
      const op = await consoleOf(b);
      const listed = await op.get("approvals");
      expect(listed.pending.map((p: { id: string }) => p.id)).toContain(id);
      const ok = await op.post(`approvals/${id}/approve`);
      expect(ok.status, await ok.clone().text()).toBe(200);
      const ran = await callModern(onC!.client, "run_inference", { ...args, approval_id: id });
      expect(ran.isError, JSON.stringify(ran.content)).toBeFalsy();
      // Used once: A and B, raced, both refuse it.
      const again = await Promise.all(
        [onA!, onB!].map((x) =>
          callModern(x.client, "run_inference", { ...args, approval_id: id }),
        ),
      );
      for (const r of again) expect(errorOf(r)?.code).toBe("approval_used");
      const history = await op.get("approvals");
      expect(history.history.find((h: { id: string }) => h.id === id)?.status).toBe("used");

      // A second approval, its first use raced through the three replicas at once: each reads it
      // approved, and the store's decide-once lets one of them run it.
      const args2 = input(434343);
      const asked2 = await callModern(onB!.client, "run_inference", args2);
      const id2 = errorOf(asked2)!.details.approval_id as string;
      expect((await op.post(`approvals/${id2}/approve`)).status).toBe(200);
      const raced = await Promise.all(
        clients.map((x) => callModern(x.client, "run_inference", { ...args2, approval_id: id2 })),
      );
      expect(raced.filter((r) => !r.isError)).toHaveLength(1);
      for (const r of raced.filter((x) => x.isError))
        expect(errorOf(r)?.code, JSON.stringify(r.content)).toBe("approval_used");
      // Two runs in all, one per approval: two `executed` records of the asker's inference.
      const executed = await sql(
        `SELECT record FROM audit_records WHERE record LIKE '%"principal":"asker"%'
           AND record LIKE '%"outcome":"executed"%'`,
      );
      expect(executed).toHaveLength(2);
    } finally {
      await Promise.all(clients.map((x) => x.close()));
    }
  });

  it("a replayed request state (the in-band answer's retry) is refused on every replica", async () => {
    const a = byName("a");
    const sent: SentRequest[] = [];
    const c = await connectModernHttp(a.url, TOKENS.replayer, {
      client: { capabilities: { elicitation: { form: {} } } } as any,
      sent,
    });
    const prompts: unknown[] = [];
    c.client.setRequestHandler("elicitation/create", async (req: any) => {
      prompts.push(req.params);
      return { action: "accept", content: { approve: true } } as any;
    });
    try {
      const r = await callModern(c.client, "run_inference", input(7));
      expect(r.isError, JSON.stringify(r.content)).toBeFalsy();
      expect(prompts).toHaveLength(1);
      const retry = sent.find((s) => s.body?.params?.requestState !== undefined);
      expect(retry, "the client retried with the requestState").toBeDefined();
      for (const [i, replica] of d.replicas.entries()) {
        const body = { ...structuredClone(retry!.body), id: 9000 + i };
        const res = await fetch(replica.url, {
          method: "POST",
          headers: { ...retry!.headers, authorization: `Bearer ${TOKENS.replayer}` },
          body: JSON.stringify(body),
        });
        const text = await res.text();
        const msg = JSON.parse(text.startsWith("{") ? text : /data: (.*)/.exec(text)![1]!);
        expect(errorOf(msg.result)?.code, `${replica.name}: ${text.slice(0, 300)}`).toBe(
          "invalid_request_state",
        );
        expect(errorOf(msg.result)?.details?.why).toBe("replayed");
      }
    } finally {
      await c.close();
    }
  });
});

describe("a stored output across replicas", () => {
  /** The tensor a resources/read answer carries. */
  const tensorOf = (read: { contents: unknown[] }) => {
    const t = JSON.parse((read.contents[0] as { text: string }).text);
    return { dtype: t.dtype, shape: t.shape, data: Buffer.from(t.data_b64, "base64") };
  };

  it("a summarised output of a call through A is read through B (2026-07-28) and C (2025-11-25) byte for byte, and by no other principal", async () => {
    const [a, b, c] = [byName("a"), byName("b"), byName("c")];
    const onA = await connectModernHttp(a.url, TOKENS.producer);
    const onB = await connectModernHttp(b.url, TOKENS.producer);
    const onC = await connectHttp(c.url, TOKENS.producer);
    const snoop = await connectModernHttp(b.url, TOKENS.snoop);
    try {
      const x = input(31);
      const two = {
        ...x,
        tensors: [
          {
            ...x.tensors[0],
            shape: [2, 1, 28, 28],
            data: [...x.tensors[0]!.data, ...input(32).tensors[0]!.data],
          },
        ],
      };
      const r = await callModern(onA.client, "run_inference", two);
      expect(r.isError, JSON.stringify(r.content)).toBeFalsy();
      const out = r.structuredContent.outputs[0];
      expect(out.data).toBeUndefined();
      const uri = out.resource_uri as string;
      expect(uri).toMatch(/^tpu:\/\/outputs\/out_[0-9a-f]{24}\/0$/);
      const own = tensorOf(await onA.client.readResource({ uri }));
      const viaB = tensorOf(await onB.client.readResource({ uri }));
      const viaC = tensorOf(await onC.client.readResource({ uri }));
      expect(own).toMatchObject({ dtype: "float32", shape: [2, 10] });
      expect(own.data.byteLength).toBe(80);
      for (const t of [viaB, viaC]) {
        expect({ dtype: t.dtype, shape: t.shape }).toEqual({ dtype: own.dtype, shape: own.shape });
        expect(t.data.equals(own.data)).toBe(true);
      }
      // A's row in the shared store, written by A.
      const [row] = await sql("SELECT replica, bytes FROM stored_outputs WHERE id = $1", [
        uri.split("/")[3],
      ]);
      expect(row).toMatchObject({ replica: await replicaId(a), bytes: "80" });
      // The bytes are the logits the call summarised: its first values, min and max.
      const values = [...new Float32Array(Uint8Array.from(own.data).buffer)];
      expect(values.slice(0, out.summary.first.length)).toEqual(out.summary.first);
      expect(Math.min(...values)).toBe(out.summary.min);
      expect(Math.max(...values)).toBe(out.summary.max);
      // Listed through another replica too.
      expect((await onB.client.listResources()).resources.map((res) => res.uri)).toContain(uri);

      // Another principal gets what a made-up id gets, through any replica: nothing to tell them apart.
      const made = uri.replace(/out_[0-9a-f]{24}/, `out_${"0".repeat(24)}`);
      const refusal = async (u: string) => {
        const e: any = await snoop.client.readResource({ uri: u }).then(
          () => undefined,
          (err) => err,
        );
        expect(e, u).toBeDefined();
        return { code: e.code, message: String(e.message).replace(u, "URI") };
      };
      expect(await refusal(uri)).toEqual(await refusal(made));
      expect((await refusal(uri)).message).toMatch(/not found/i);
      expect(JSON.stringify(await snoop.client.listResources())).not.toContain(uri);
    } finally {
      await Promise.all([onA, onB, onC, snoop].map((x) => x.close()));
    }
  });
});

describe("a replica killed under load", () => {
  interface Outcome {
    start: number;
    end: number;
    ok: boolean;
    err?: string;
  }
  const job = async (jobId: string) =>
    (
      await sql<{ status: string; owner: string; lease: string; updated: string; now: string }>(
        `SELECT status, owner, lease_until_ms AS lease, updated_ms AS updated, ${NOW_MS} AS now
         FROM jobs WHERE job_id = $1`,
        [jobId],
      )
    )[0]!;
  /** A benchmark job on one replica (its owner): it runs until cancelled or its owner dies. */
  async function startJob(r: Replica): Promise<string> {
    const c = await connectModernHttp(r.url, TOKENS.caller);
    try {
      const started = await callModern(c.client, "run_benchmark", {
        model: "mnist-cnn",
        batch_sizes: [1],
        iterations: 5000,
        warmup: 0,
        wait: false,
      });
      expect(started.isError, JSON.stringify(started.content)).toBeFalsy();
      return started.structuredContent.job_id as string;
    } finally {
      await c.close();
    }
  }

  it(
    "fails at most the modern calls in flight on it; its job is interrupted only after its lease; its restart marks nothing of the others'",
    async () => {
      const [a, b, victim] = [byName("a"), byName("b"), byName("c")];
      const [victimId, bId] = [await replicaId(victim), await replicaId(b)];
      const mine = await startJob(victim);
      const theirs = await startJob(b);
      expect((await job(mine)).owner).toBe(victimId);
      expect((await job(theirs)).owner).toBe(bId);

      const callers = await Promise.all(
        Array.from({ length: 8 }, () => connectModernHttp(d.url, TOKENS.caller)),
      );
      const outcomes: Outcome[][] = callers.map(() => []);
      let stop = false;
      const loops = callers.map(async (c, i) => {
        for (let n = 0; !stop; n++) {
          const start = Date.now();
          try {
            const r = await callModern(c.client, "run_inference", input(i * 10_000 + n));
            outcomes[i]!.push({
              start,
              end: Date.now(),
              ok: !r.isError,
              err: r.isError ? JSON.stringify(r.content).slice(0, 200) : undefined,
            });
          } catch (e) {
            outcomes[i]!.push({ start, end: Date.now(), ok: false, err: String(e) });
          }
        }
      });
      const okSince = (t: number) =>
        Math.min(...outcomes.map((o) => o.filter((x) => x.ok && x.start >= t).length));
      const until = async (cond: () => boolean, what: string) => {
        const deadline = Date.now() + scaled(60_000);
        while (!cond()) {
          if (Date.now() > deadline) throw new Error(`timed out: ${what}`);
          await new Promise((r) => setTimeout(r, 50));
        }
      };
      let killAt = 0;
      let killedAt = 0;
      try {
        await until(() => okSince(0) >= 3, "every caller answered before the kill");
        killAt = Date.now();
        await victim.kill9();
        killedAt = Date.now();
        await until(() => okSince(killedAt) >= 3, "every caller answered after the kill");
      } finally {
        stop = true;
        await Promise.all(loops);
        await Promise.all(callers.map((c) => c.close()));
      }
      const failed = outcomes.flat().filter((o) => !o.ok);
      // Only calls that were running on it when it died: started before it was gone, ended after
      // the kill; at most one per caller (each has one call in flight at a time).
      for (const f of failed) {
        expect(f.start, f.err).toBeLessThanOrEqual(killedAt);
        expect(f.end, f.err).toBeGreaterThanOrEqual(killAt);
      }
      for (const o of outcomes) expect(o.filter((x) => !x.ok).length).toBeLessThanOrEqual(1);

      // Its job: running while its lease holds (no replica marks it), interrupted once it expired.
      for (;;) {
        const j = await job(mine);
        if (Number(j.now) < Number(j.lease)) expect(j.status).toBe("running");
        if (j.status !== "running") {
          expect(j.status).toBe("interrupted");
          expect(Number(j.updated)).toBeGreaterThanOrEqual(Number(j.lease));
          break;
        }
        expect(Number(j.now) - Number(j.lease)).toBeLessThan(scaled(30_000));
        await new Promise((r) => setTimeout(r, 200));
      }
      // The other replica's job ran on meanwhile, and the restarted replica leaves it so.
      expect((await job(theirs)).status).toBe("running");
      await victim.start();
      // A restart marks only its own previous run's jobs, at once; two renewals later, still so.
      await new Promise((r) => setTimeout(r, (2 * JOB_LEASE_S * 1000) / 3));
      expect((await job(theirs)).status).toBe("running");
      // Cancelled from a replica that does not run it: the owner reads the flag and stops it.
      const op = await connectModernHttp(a.url, TOKENS.caller);
      try {
        const r = await callModern(op.client, "cancel_job", { job_id: theirs });
        expect(r.isError, JSON.stringify(r.content)).toBeFalsy();
      } finally {
        await op.close();
      }
      await expect
        .poll(async () => (await job(theirs)).status, { timeout: scaled(30_000) })
        .toBe("cancelled");
    },
    scaled(240_000),
  );
});

describe("the shared audit trail", () => {
  it("`tpu-mcp audit verify` passes on what the three replicas wrote and fails after a one-row edit", async () => {
    const writers = await sql<{ replica: string }>("SELECT DISTINCT replica FROM audit_records");
    expect(writers.length).toBeGreaterThanOrEqual(d.replicas.length);
    const ok = await cli(d.config, "audit", "verify");
    expect(ok.code, ok.stdout + ok.stderr).toBe(0);
    expect(ok.stdout).toMatch(/ok: \d+ record\(s\), chain intact/);
    const [row] = await sql<{ seq: string }>(
      `SELECT min(seq) AS seq FROM audit_records WHERE record LIKE '%"principal":"agent"%'`,
    );
    await sql(
      `UPDATE audit_records SET record = replace(record, '"principal":"agent"', '"principal":"eve"')
       WHERE seq = $1`,
      [row!.seq],
    );
    const bad = await cli(d.config, "audit", "verify");
    expect(bad.code).toBe(1);
    expect(bad.stdout).toMatch(new RegExp(`TAMPERED at record #${row!.seq}\\b`));
    for (const r of [ok, bad]) expect(r.stdout + r.stderr).not.toContain(d.db!.password);
  });
});
