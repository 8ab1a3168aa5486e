// The policy stores a replica serves on, built by the storage port (server/app/storage.ts
// openPolicyStores, through createPolicyServices as the server does) on a real PostgreSQL: two
// replicas, each with its own shared backend (openSharedBackend: its pool, migrated, the
// deployment's key file), their gates driven against one database. An approval requested
// through A is decided through B and used once across both; the audit trail is one chain that
// starts with one chain_keyed record; a call's calls_in_flight row is there while it runs,
// committed in its `allowed` record's transaction; the budget and the rate limit are one cap
// across both; an alert fires once across both replicas' engines; closing the stores leaves the
// pool open; a CLI command opens its own backend.
// (Admitting on a stale read, which breaks the budget across replicas, is
// test/postgres/budget.test.ts's "admitting on a stale read" test.)
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { hostname, tmpdir } from "node:os";
import { join } from "node:path";
import pino from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Alerts } from "../../policies/alerts/alerts.js";
import { loadOrCreateAuditKey } from "../../policies/audit_key.js";
import type { CostEstimate } from "../../policies/estimate.js";
import type { PolicyError } from "../../policies/errors.js";
import type { GateCall } from "../../policies/gate/gate.js";
import { ConcurrencyLimiter } from "../../policies/limits/concurrency.js";
import type { Principal } from "../../policies/scopes.js";
import { createPolicyServices, type PolicyServices } from "../../server/app/build_policies.js";
import { PgAlerts } from "../../server/app/postgres/alerts.js";
import { PgApprovalQueue } from "../../server/stores/approvals/postgres.js";
import { PgAuditTrail } from "../../server/stores/audit/postgres.js";
import { PgBudget } from "../../server/app/postgres/budget.js";
import { PgCallsInFlight } from "../../server/app/postgres/calls.js";
import { PgPasskeys } from "../../server/stores/passkeys/postgres.js";
import { PgRateLimit } from "../../server/app/postgres/rate.js";
import { PgRequestStates } from "../../server/app/postgres/shared.js";
import { PgSuspensions } from "../../server/app/postgres/suspensions.js";
import { replicaIdentity } from "../../server/app/replica.js";
import { openSharedBackend, type SharedBackend } from "../../server/app/storage.js";
import { parseConfig, type ServerConfig } from "../../server/config/config.js";
import { startPostgres, type TestPostgres } from "../helpers/postgres.js";
import { ROOT } from "../helpers/server.js";

const logger = pino({ level: "silent" });
let db: TestPostgres;
let dir: string;
let configs: ServerConfig[] = [];
let backends: SharedBackend[] = [];
let replicas: PolicyServices[] = [];

function configOf(replica: string): ServerConfig {
  return parseConfig(
    {
      data_dir: join(dir, `data-${replica}`),
      storage: { postgres: { url: db.url, replica_id: replica } },
      policy: {
        approvals: { rules: [{ tool: "load_model" }] },
        audit: { key_file: join(dir, "keys", "audit.key") },
        limits: {
          budget: { device_seconds_per_window: 10, window_s: 3600 },
          rate_limit: { per_principal_per_minute: 6 },
        },
      },
    },
    { root: ROOT },
  );
}

beforeAll(async () => {
  db = await startPostgres();
  dir = mkdtempSync(join(tmpdir(), "tpu-mcp-pg-serve-"));
  // The deployment's key, mounted on every replica (made here as `tpu-mcp audit` would).
  loadOrCreateAuditKey(join(dir, "keys", "audit.key"));
  configs = ["a", "b"].map(configOf);
  // Both replicas start at once: one migration, one chain_keyed record.
  backends = (await Promise.all(
    configs.map((c) => openSharedBackend(c, logger, replicaIdentity(c, null))),
  )) as SharedBackend[];
  replicas = await Promise.all(
    configs.map((c, i) => createPolicyServices(c, logger, { shared: backends[i] })),
  );
});

afterAll(async () => {
  await Promise.all(replicas.map((r) => r.close()));
  await Promise.all(backends.map((b) => b?.close()));
  await db?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const agent: Principal = {
  id: "agent",
  scopes: ["models:read", "models:load", "inference:run"],
  via: "token",
};
const operator: Principal = { id: "operator", scopes: ["approvals:grant"], via: "token" };

const est = (device_seconds: number): CostEstimate => ({
  device_seconds,
  memory_bytes: 1,
  compile_s: 0,
  weight_bytes: 0,
  fits: true,
});

async function refusal(p: Promise<unknown>): Promise<PolicyError> {
  try {
    await p;
  } catch (e) {
    return e as PolicyError;
  }
  throw new Error("expected a refusal");
}

/** A call that runs until `release()`. */
function held() {
  let release!: () => void;
  const done = new Promise<void>((r) => (release = r));
  return { release, fn: async () => (await done, "ran") };
}

describe("the policy stores of a replica on storage.postgres", () => {
  it("are the Postgres stores, on the backend's pool; the device slots stay this process's", () => {
    for (const r of replicas) {
      expect(r.backend).toBe("postgres");
      expect(r.approvals).toBeInstanceOf(PgApprovalQueue);
      expect(r.audit).toBeInstanceOf(PgAuditTrail);
      expect(r.budget).toBeInstanceOf(PgBudget);
      expect(r.calls).toBeInstanceOf(PgCallsInFlight);
      expect(r.passkeys).toBeInstanceOf(PgPasskeys);
      expect(r.suspensions).toBeInstanceOf(PgSuspensions);
      expect(r.alertStore).toBeInstanceOf(PgAlerts);
      expect(r.rateLimiter).toBeInstanceOf(PgRateLimit);
      expect(r.consumedStates).toBeInstanceOf(PgRequestStates);
      expect(r.limiter).toBeInstanceOf(ConcurrencyLimiter);
    }
    // Nothing of the policy went to a data directory's SQLite file.
    for (const c of configs) expect(existsSync(join(c.paths.data_dir, "policy.db"))).toBe(false);
  });

  it("an approval requested through A is decided through B and used once across both", async () => {
    const [a, b] = replicas;
    const call = (over: Partial<GateCall> = {}): GateCall => ({
      principal: agent,
      tool: "load_model",
      args: { model: "tiny-gpt2", device: "cpu" },
      estimate: est(1),
      ...over,
    });
    const first = await refusal(a!.gate.run(call(), async () => "ran"));
    expect(first.code).toBe("approval_required");
    const id = first.details.approval_id as string;
    // Asked again through B: the same pending request, not a second one.
    expect((await refusal(b!.gate.run(call(), async () => "ran"))).details.approval_id).toBe(id);
    await b!.gate.decideApproval(id, operator, "approve");
    const withId = call({ args: { model: "tiny-gpt2", device: "cpu", approval_id: id } });
    await expect(a!.gate.run(withId, async () => "ran")).resolves.toBe("ran");
    expect((await refusal(b!.gate.run(withId, async () => "ran"))).code).toBe("approval_used");
    expect((await b!.approvals.get(id))!.status).toBe("used");
  });

  it("writes one audit chain, keyed once for the deployment's key file, that verifies", async () => {
    const [a, b] = replicas;
    const pool = backends[0]!.pool;
    const keyed = await pool.query(
      "SELECT replica FROM audit_records WHERE (record::jsonb) ->> 'outcome' = 'chain_keyed'",
    );
    expect(keyed.rows).toHaveLength(1);
    const by = await pool.query("SELECT DISTINCT replica FROM audit_records ORDER BY replica");
    expect(by.rows.map((r) => r.replica)).toEqual(["a", "b"]);
    const outcomes = (await a!.audit.tail(50)).map((r) => r.outcome);
    expect(outcomes).toEqual(
      expect.arrayContaining(["chain_keyed", "approval_requested", "approval_granted", "allowed"]),
    );
    const verified = await b!.audit.verify();
    expect(verified.ok).toBe(true);
  });

  it("holds a running call's calls_in_flight row, A's, visible to B, until it ends", async () => {
    const [a] = replicas;
    const pool = backends[1]!.pool;
    const h = held();
    const running = a!.gate.run(
      { principal: agent, tool: "run_inference", args: { model: "tiny-gpt2", n: 1 } },
      h.fn,
    );
    // Rows of this call only: an earlier call's row is deleted after its charge, in the
    // background of its answer.
    const mine = "SELECT replica, tool FROM calls_in_flight WHERE tool = 'run_inference'";
    const until = async (done: (n: number) => boolean) => {
      let rows: { replica: string; tool: string }[] = [];
      for (let i = 0; i < 400; i++) {
        rows = (await pool.query(mine)).rows;
        if (done(rows.length)) break;
        await new Promise((r) => setTimeout(r, 25));
      }
      return rows;
    };
    expect(await until((n) => n > 0)).toEqual([{ replica: "a", tool: "run_inference" }]);
    // Written in the transaction of the call's `allowed` record (the same inserting xid), so
    // neither is ever committed without the other.
    const xid = await pool.query(
      `SELECT (SELECT xmin::text FROM calls_in_flight WHERE tool = 'run_inference') AS call,
        (SELECT xmin::text FROM audit_records WHERE replica = 'a'
          AND (record::jsonb) ->> 'outcome' = 'allowed'
          AND (record::jsonb) ->> 'tool' = 'run_inference' ORDER BY seq DESC LIMIT 1) AS allowed`,
    );
    expect(xid.rows[0].call).toBe(xid.rows[0].allowed);
    h.release();
    await expect(running).resolves.toBe("ran");
    expect(await until((n) => n === 0)).toEqual([]);
  });

  it("the budget is one cap: a call held on A refuses B's that would pass it", async () => {
    const [a, b] = replicas;
    const bea: Principal = { ...agent, id: "bea" };
    const run = (p: Principal, s: number) => ({
      principal: p,
      tool: "run_inference",
      args: { model: "tiny-gpt2", s },
      estimate: est(s),
    });
    const h = held();
    const onA = a!.gate.run(run(bea, 6), h.fn);
    // A's hold is in the database before B asks.
    for (let i = 0; i < 400; i++) {
      const r = await backends[1]!.pool.query(
        "SELECT 1 FROM budget_reservations WHERE replica = 'a' AND principal = 'bea'",
      );
      if (r.rows.length > 0) break;
      await new Promise((r) => setTimeout(r, 25));
    }
    const refused = await refusal(b!.gate.run(run(bea, 6), async () => "ran"));
    expect(refused.code).toBe("budget_exceeded");
    // What is left of the window still runs on B.
    await expect(b!.gate.run(run(bea, 3), async () => "ran")).resolves.toBe("ran");
    h.release();
    await expect(onA).resolves.toBe("ran");
  });

  it("the rate limit is one allowance: 6 calls a minute whichever replica takes them", async () => {
    const rita: Principal = { ...agent, id: "rita" };
    const codes: string[] = [];
    for (let i = 0; i < 8; i++) {
      const p = replicas[i % 2]!.gate.run(
        { principal: rita, tool: "run_inference", args: { model: "tiny-gpt2", i } },
        async () => "ran",
      );
      codes.push(
        await p.then(
          () => "ok",
          (e: PolicyError) => e.code,
        ),
      );
    }
    expect(codes).toEqual(["ok", "ok", "ok", "ok", "ok", "ok", "rate_limited", "rate_limited"]);
  });

  it("an alert rule fires once per window though both replicas' engines reach it", async () => {
    const fired: string[][] = [[], []];
    const engines = replicas.map(
      (r, i) =>
        new Alerts({
          rules: [{ name: "crash-loop", kind: "worker_restarts", threshold: 2, window_s: 600 }],
          store: r.alertStore,
          logger: pino({ level: "silent" }),
          suspend: async () => {},
          audit: () => {},
          budgetUse: async () => ({ used_s: 0, limit_s: 1, window_s: 1 }),
          pendingApprovals: async () => [],
          webhooks: [],
          onFired: (a) => fired[i]!.push(a.id),
        }),
    );
    for (const e of engines) {
      e.workerRestarted("w0");
      e.workerRestarted("w0");
    }
    await Promise.all(engines.map((e) => e.drain()));
    engines.forEach((e) => e.close());
    expect(fired.flat()).toHaveLength(1);
    expect((await replicas[1]!.alertStore.recent(10)).map((a) => a.subject)).toEqual(["w0"]);
  });

  it("close() stops the stores and leaves the backend's pool open (its owner ends it)", async () => {
    const extra = await createPolicyServices(configs[0]!, logger, { shared: backends[0] });
    await extra.close();
    expect((await backends[0]!.pool.query("SELECT 1 AS one")).rows).toEqual([{ one: 1 }]);
  });

  it("without a backend (a CLI command) opens one of its own, named apart from the replicas", async () => {
    const command = await createPolicyServices(configs[0]!, logger);
    try {
      expect(command.backend).toBe("postgres");
      const rec = await command.audit.append({
        time: new Date().toISOString(),
        principal: "cli:operator",
        tool: "passkeys",
        args_digest: null,
        outcome: "allowed",
      });
      const row = await backends[0]!.pool.query(
        "SELECT replica FROM audit_records WHERE seq = $1",
        [rec.seq],
      );
      expect(row.rows[0].replica).toBe(`cli:${hostname()}:pid-${process.pid}`);
    } finally {
      await command.close();
    }
    expect(existsSync(join(configs[0]!.paths.data_dir, "policy.db"))).toBe(false);
  });
});
