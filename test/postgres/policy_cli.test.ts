// The operator's commands on storage.postgres, through the real CLI beside a replica serving on
// the same database: `approvals list|show|approve`, `operators enrol|list`, `principals
// suspended|resume`. They read and write the shared stores (never the data directory's SQLite
// files), a decision made by the CLI is used by the replica's gate, and the CLI's audit records
// join the replica's one chain under the replicas' key.
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pino from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { PolicyError } from "../../policies/errors.js";
import type { GateCall } from "../../policies/gate/gate.js";
import type { Principal } from "../../policies/scopes.js";
import { createPolicyServices, type PolicyServices } from "../../server/app/build_policies.js";
import { replicaIdentity } from "../../server/app/replica.js";
import { openSharedBackend, type SharedBackend } from "../../server/app/storage.js";
import { loadConfig, type ServerConfig } from "../../server/config/config.js";
import { startPostgres, type TestPostgres } from "../helpers/postgres.js";
import { cli, DEMO_TOKENS, ROOT, writeConfig } from "../helpers/server.js";

const logger = pino({ level: "silent" });
let db: TestPostgres;
let dir: string;
let file: string;
let config: ServerConfig;
let shared: SharedBackend | null = null;
let replica: PolicyServices | undefined;

beforeAll(async () => {
  db = await startPostgres();
  dir = mkdtempSync(join(tmpdir(), "tpu-mcp-pg-cli-"));
  const demo = JSON.parse(readFileSync(join(ROOT, "examples/policy.demo.json"), "utf8")).policy;
  file = writeConfig(
    {
      storage: { postgres: { url: db.url } },
      policy: { ...demo, approvals: { rules: [{ tool: "load_model" }] } },
    },
    dir,
  );
  config = loadConfig(file, ROOT);
});

afterAll(async () => {
  await replica?.close();
  await shared?.close();
  await db?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const agent: Principal = { id: "agent", scopes: ["models:load"], via: "token" };
const load = (approval_id?: string): GateCall => ({
  principal: agent,
  tool: "load_model",
  args: { model: "tiny-gpt2", device: "cpu", ...(approval_id ? { approval_id } : {}) },
  estimate: { device_seconds: 1, memory_bytes: 1, compile_s: 0, weight_bytes: 0, fits: true },
});

describe("the operator's CLI on storage.postgres", () => {
  it("refuses plainly before the database is migrated, and before any replica made the key", async () => {
    const list = await cli(file, "approvals", "list");
    expect(list.code).toBe(1);
    expect(list.stderr).toMatch(/run `tpu-mcp storage migrate`/);
    expect(list.stderr).not.toContain(db.password);
    expect((await cli(file, "storage", "migrate")).code).toBe(0);
    const resume = await cli(file, "principals", "resume", "x", "--token", DEMO_TOKENS.operator);
    expect(resume.code).not.toBe(0);
    expect(resume.stderr).toMatch(/no audit key yet .* start a replica first/);
  });

  it("approvals list and approve act on the replica's queue; the replica's gate uses the decision", async () => {
    // A replica starts on the database (it makes the deployment's key) and asks for an approval.
    shared = await openSharedBackend(config, logger, replicaIdentity(config, { port: 8001 }));
    replica = await createPolicyServices(config, logger, { shared });
    const first = await replica.gate.run(load(), async () => "ran").catch((e: PolicyError) => e);
    const id = (first as PolicyError).details.approval_id as string;
    expect((first as PolicyError).code).toBe("approval_required");

    const list = await cli(file, "approvals", "list");
    expect(list.code).toBe(0);
    expect(list.stdout).toMatch(/^1 pending/);
    expect(list.stdout).toContain(id);
    const approve = await cli(file, "approvals", "approve", id, "--token", DEMO_TOKENS.operator);
    expect(approve.code, approve.stderr).toBe(0);
    expect(approve.stdout).toMatch(/^approved: /);
    await expect(replica.gate.run(load(id), async () => "ran")).resolves.toBe("ran");
    const show = await cli(file, "approvals", "show", id, "--json");
    expect(JSON.parse(show.stdout)).toMatchObject({ id, status: "used", decided_by: "operator" });
  });

  it("operators enrol prints a code the replica's store knows; operators list reads it", async () => {
    const enrol = await cli(file, "operators", "enrol", "olivia", "--json");
    expect(enrol.code, enrol.stderr).toBe(0);
    const { code } = JSON.parse(enrol.stdout) as { code: string };
    expect(await replica!.passkeys.peekEnrolmentCode(code)).toBe("olivia");
    const list = await cli(file, "operators", "list", "--json");
    expect(JSON.parse(list.stdout)).toEqual([]);
  });

  it("principals suspended and resume act on the replica's suspensions", async () => {
    await replica!.gate.suspendPrincipal({
      principal: "mallory",
      reason: "a test",
      rule: "flood",
      since: new Date().toISOString(),
      until: null,
    });
    const listed = await cli(file, "principals", "suspended");
    expect(listed.code).toBe(0);
    expect(listed.stdout).toContain("mallory");
    const resume = await cli(
      file,
      "principals",
      "resume",
      "mallory",
      "--token",
      DEMO_TOKENS.operator,
    );
    expect(resume.code, resume.stderr).toBe(0);
    expect(await replica!.gate.suspended()).toEqual([]);
  });

  it("the CLI's records are in the replica's one chain, which verifies; no SQLite policy store was made", async () => {
    const rows = await shared!.pool.query(
      "SELECT replica, (record::jsonb) ->> 'outcome' AS outcome FROM audit_records ORDER BY seq",
    );
    const byCli = rows.rows.filter((r) => r.replica.startsWith("cli:"));
    expect(byCli.map((r) => r.outcome)).toEqual(
      expect.arrayContaining(["approval_granted", "resumed"]),
    );
    expect(rows.rows.filter((r) => r.outcome === "chain_keyed")).toHaveLength(1);
    expect((await replica!.audit.verify()).ok).toBe(true);
    expect((await cli(file, "audit", "verify")).code).toBe(0);
    expect(existsSync(join(config.paths.data_dir, "policy.db"))).toBe(false);
  });
});
