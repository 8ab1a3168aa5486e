// Issue 23, item 1: approvals cannot be hidden. An agent that makes 205 approval requests within
// its rate limit used to push another principal's pending request out of `approvals list` (the
// 100 most recent) and the console (the 200 most recent), where it expired unseen. Every pending
// approval now comes first, all of them, page by page. Real server, real MCP client, real CLI.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  cli,
  connectHttp,
  DEMO_POLICY,
  DEMO_TOKENS,
  errorOf,
  startHttpServer,
  writeConfig,
  type HttpServerProc,
} from "../helpers/server.js";
import { scaled } from "../helpers/calibrate.js";

const FLOOD = 205;

describe("a flood of approval requests hides no one's pending request", () => {
  let server: HttpServerProc;
  let config: string;
  let base: string;
  let readerApproval: string;

  beforeAll(async () => {
    config = writeConfig({
      runtime: { device: "cpu", start: "lazy" },
      policy: {
        ...DEMO_POLICY,
        limits: { ...DEMO_POLICY.limits, rate_limit: { per_principal_per_minute: 6000 } },
        approvals: {
          // Cheap tools that need no worker, so the flood costs nothing but requests.
          rules: [{ tool: "list_models", principals: ["reader"] }, { tool: "get_job" }],
          elicitation: false,
          // High enough for the flood to happen at all; the cap has its own test.
          max_pending_per_principal: 1000,
        },
      },
    });
    server = await startHttpServer(config);
    base = server.url.replace(/\/mcp$/, "");

    // The victim asks first...
    const reader = await connectHttp(server.url, DEMO_TOKENS.reader);
    const r = await reader.client.callTool({ name: "list_models", arguments: {} });
    expect(errorOf(r)?.code).toBe("approval_required");
    readerApproval = errorOf(r)!.details.approval_id;
    await reader.close();

    // ...then the agent makes 205 requests of its own, newer than the victim's.
    const agent = await connectHttp(server.url, DEMO_TOKENS.agent);
    for (let i = 0; i < FLOOD; i += 25) {
      const batch = [];
      for (let j = i; j < Math.min(i + 25, FLOOD); j++) {
        const job_id = `job_${j.toString(16).padStart(24, "0")}`;
        batch.push(agent.client.callTool({ name: "get_job", arguments: { job_id } }));
      }
      for (const res of await Promise.all(batch))
        expect(errorOf(res)?.code).toBe("approval_required");
    }
    await agent.close();
  }, scaled(180_000));

  afterAll(async () => {
    await server?.stop();
  });

  it(
    "`tpu-mcp approvals list` shows the victim's pending request, and every pending one first",
    async () => {
      const list = await cli(config, "approvals", "list");
      expect(list.code, list.stderr).toBe(0);
      expect(list.stdout).toContain(readerApproval);
      expect(list.stdout).toMatch(/206 pending/);
      // Paging reaches every one of them.
      const json = await cli(
        config,
        "approvals",
        "list",
        "--json",
        "--limit",
        "150",
        "--offset",
        "0",
      );
      const next = await cli(
        config,
        "approvals",
        "list",
        "--json",
        "--limit",
        "150",
        "--offset",
        "150",
      );
      const ids = [...JSON.parse(json.stdout), ...JSON.parse(next.stdout)].map((a: any) => a.id);
      expect(new Set(ids).size).toBe(FLOOD + 1);
      expect(ids).toContain(readerApproval);
    },
    scaled(120_000),
  );

  it(
    "the console's approvals API lists it as pending, and pages through all of them",
    async () => {
      const signIn = await fetch(`${base}/console/api/session`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ token: DEMO_TOKENS.operator }),
      });
      expect(signIn.status).toBe(200);
      const cookie = (signIn.headers.get("set-cookie") ?? "").split(";")[0];
      const get = async (q = "") => {
        const r = await fetch(`${base}/console/api/approvals${q}`, { headers: { cookie } });
        expect(r.status).toBe(200);
        return r.json();
      };
      const first = await get();
      const pendingIds = first.pending.map((a: any) => a.id);
      expect(pendingIds).toContain(readerApproval);
      const mine = first.pending.find((a: any) => a.id === readerApproval);
      expect(mine.can_decide).toBe(true);
      expect(first.pending_total).toBe(FLOOD + 1);

      const seen = new Set<string>();
      for (let offset = 0; offset < first.pending_total; offset += 50) {
        const page = await get(`?offset=${offset}&limit=50`);
        for (const a of page.pending) seen.add(a.id);
      }
      expect(seen.size).toBe(FLOOD + 1);
    },
    scaled(60_000),
  );
});

describe("a principal's pending approvals are capped", () => {
  let server: HttpServerProc;
  let config: string;

  beforeAll(async () => {
    config = writeConfig({
      runtime: { device: "cpu", start: "lazy" },
      policy: {
        ...DEMO_POLICY,
        limits: { ...DEMO_POLICY.limits, rate_limit: { per_principal_per_minute: 6000 } },
        approvals: {
          rules: [{ tool: "list_models" }, { tool: "get_job" }],
          elicitation: false,
          max_pending_per_principal: 3,
        },
      },
    });
    server = await startHttpServer(config);
  }, scaled(120_000));

  afterAll(async () => {
    await server?.stop();
  });

  it(
    "refuses one more with approval_limit, keeps the waiting ones, and leaves others alone",
    async () => {
      const agent = await connectHttp(server.url, DEMO_TOKENS.agent);
      const ids: string[] = [];
      for (let j = 0; j < 3; j++) {
        const job_id = `job_${j.toString(16).padStart(24, "0")}`;
        const r = await agent.client.callTool({ name: "get_job", arguments: { job_id } });
        expect(errorOf(r)?.code).toBe("approval_required");
        ids.push(errorOf(r)!.details.approval_id);
      }
      const over = await agent.client.callTool({
        name: "get_job",
        arguments: { job_id: `job_${"f".repeat(24)}` },
      });
      const e = errorOf(over) as any;
      expect(e?.code).toBe("approval_limit");
      expect(e.recoverable).toBe(true);
      expect(e.message).toMatch(/refused/);
      expect(e.details).toMatchObject({ pending: 3, limit: 3 });
      expect(e.details.retry_after_ms).toBeGreaterThan(0);
      // The same call again reuses its open request: no new request, so no refusal.
      const again = await agent.client.callTool({
        name: "get_job",
        arguments: { job_id: `job_${"0".repeat(24)}` },
      });
      expect(errorOf(again)?.details.approval_id).toBe(ids[0]);
      await agent.close();

      const reader = await connectHttp(server.url, DEMO_TOKENS.reader);
      const r = await reader.client.callTool({ name: "list_models", arguments: {} });
      expect(errorOf(r)?.code).toBe("approval_required");
      await reader.close();

      const list = await cli(config, "approvals", "list", "--status", "pending", "--json");
      const pending = JSON.parse(list.stdout).map((a: any) => a.id);
      expect(pending).toHaveLength(4);
      for (const id of ids) expect(pending).toContain(id);
    },
    scaled(120_000),
  );
});
