// MCP Tasks end to end, in both protocol eras and over both transports, with the official Tasks
// client (@modelcontextprotocol/ext-tasks) on the SDK v2 client: a benchmark started as a task,
// polled and its result fetched (the same row get_job reads), another cancelled, a call that
// needs approval seen in input_required until an operator decides, and a task that belongs to
// its principal (CVE-2026-52870, the Python SDK's task-handler IDOR, as a regression test).
import { createHash } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { scaled } from "../helpers/calibrate.js";
import { connectModernHttp, connectModernStdio } from "../helpers/modern.js";
import { cli, DEMO_POLICY, DEMO_TOKENS, startHttpServer, writeConfig } from "../helpers/server.js";
import type { HttpServerProc } from "../helpers/server.js";
import {
  httpDispatch,
  legacyTasks,
  modernMeta,
  modernTasks,
  stdioDispatch,
  type RawDispatch,
} from "../helpers/tasks.js";
import { Client } from "@modelcontextprotocol/client";

const AGENT2 = "demo-agent2-token";
const sha = (t: string) => createHash("sha256").update(t).digest("hex");
const agent = DEMO_POLICY.tokens.find((t: any) => t.id === "agent");
/** A load_model needs an operator's approval; a second agent tries the first one's tasks. */
const RULES = { rules: [{ tool: "load_model" }] };
const POLICY = {
  ...DEMO_POLICY,
  tokens: [...DEMO_POLICY.tokens, { ...agent, id: "agent2", token_sha256: sha(AGENT2) }],
  limits: { ...DEMO_POLICY.limits, rate_limit: { per_principal_per_minute: 6000 } },
  approvals: RULES,
};

const QUICK = { model: "mnist-cnn", batch_sizes: [1], iterations: 5, warmup: 1 };
const LONG = { model: "tiny-gpt2", batch_sizes: [1, 2, 4, 8], iterations: 10000, warmup: 1 };
const TASK = { task: { preference: "require" as const } };

type Session = ReturnType<typeof legacyTasks>;

async function until<T>(fn: () => Promise<T>, ok: (v: T) => boolean, what: string): Promise<T> {
  const end = Date.now() + scaled(120_000);
  for (;;) {
    const v = await fn();
    if (ok(v)) return v;
    // A task that ended the wrong way will never get there.
    if (["completed", "failed", "cancelled"].includes((v as { status?: string }).status ?? ""))
      throw new Error(`${what}: ended ${JSON.stringify(v).slice(0, 500)}`);
    if (Date.now() > end) throw new Error(`${what}: last ${JSON.stringify(v).slice(0, 300)}`);
    await new Promise((r) => setTimeout(r, 300));
  }
}

/** What every era and transport must show; `approve` decides an approval as an operator. */
function journeys(open: () => { session: () => Session; approve: (id: string) => Promise<void> }) {
  it("a benchmark started as a task is polled and its result fetched; get_job reads the same job", async () => {
    const { session } = open();
    const s = session();
    const ex = await s.callTool("run_benchmark", QUICK, TASK);
    expect(ex.kind).toBe("task");
    const taskId = ex.handle!.taskId;
    expect(taskId).toMatch(/^job_[0-9a-f]{24}$/);
    const first = await s.task(taskId).snapshot();
    expect(["working", "completed"]).toContain(first.status);
    const { outcome } = await ex.settle();
    expect(outcome.status).toBe("completed");
    const result = (outcome as any).result;
    expect(result.isError).toBeFalsy();
    expect(result.structuredContent.model).toBe("mnist-cnn");
    // The job view of the same id: the same status and the same result, never a second copy.
    const job = await s.callTool("get_job", { job_id: taskId });
    expect(job.kind).toBe("immediate");
    const view = ((await job.settle()).outcome as any).result.structuredContent;
    expect(view.status).toBe("succeeded");
    expect(view.result).toEqual(result.structuredContent);
    expect((await s.task(taskId).snapshot()).status).toBe("completed");
  });

  it("a task cancelled while it runs ends cancelled, in tasks/get and in get_job", async () => {
    const { session } = open();
    const s = session();
    const ex = await s.callTool("run_benchmark", LONG, TASK);
    const taskId = ex.handle!.taskId;
    await until(
      () => s.task(taskId).snapshot(),
      (t) => t.status === "working",
      "never working",
    );
    await s.cancelTask(taskId);
    const done = await until(
      () => s.task(taskId).snapshot(),
      (t) => t.status !== "working",
      "not stopped",
    );
    expect(done.status).toBe("cancelled");
    const job = await (await s.callTool("get_job", { job_id: taskId })).settle();
    expect((job.outcome as any).result.structuredContent.status).toBe("cancelled");
  });

  it("a call that needs approval waits in input_required, then completes once an operator approves", async () => {
    const { session, approve } = open();
    const s = session();
    const ex = await s.callTool("load_model", { model: "mnist-cnn" }, TASK);
    const taskId = ex.handle!.taskId;
    const waiting = await until(
      () => s.task(taskId).snapshot(),
      (t) => t.status !== "working",
      "never input_required",
    );
    expect(waiting.status).toBe("input_required");
    const approvalId = /waiting for approval (apr_\S+?):/.exec(waiting.statusMessage ?? "")?.[1];
    expect(approvalId, waiting.statusMessage).toBeDefined();
    // get_job shows the same wait: running, with the same message.
    const job = await (await s.callTool("get_job", { job_id: taskId })).settle();
    const view = (job.outcome as any).result.structuredContent;
    expect(view.status).toBe("running");
    expect(view.message).toBe(waiting.statusMessage);
    await approve(approvalId!);
    const { outcome } = await ex.settle();
    expect(outcome.status).toBe("completed");
    expect((outcome as any).result.structuredContent.model).toBe("mnist-cnn");
    await (await s.callTool("unload_model", { model: "mnist-cnn" })).settle();
  });
}

describe.each(["legacy", "modern"] as const)("MCP Tasks over HTTP, %s era", (era) => {
  let srv: HttpServerProc;
  let config: string;
  const sessions: Session[] = [];
  const clients: Client[] = [];
  async function sessionFor(token: string): Promise<Session> {
    const mode = era === "legacy" ? "default" : "pin";
    const c = await connectModernHttp(srv.url, token, { mode });
    clients.push(c.client);
    const s =
      era === "legacy"
        ? legacyTasks(c.client)
        : modernTasks(c.client, httpDispatch(srv.url, token) as RawDispatch);
    sessions.push(s);
    return s;
  }
  let mine: Session;
  let theirs: Session;
  beforeAll(async () => {
    config = writeConfig({ policy: POLICY });
    srv = await startHttpServer(config);
    mine = await sessionFor(DEMO_TOKENS.agent);
    theirs = await sessionFor(AGENT2);
  });
  afterAll(async () => {
    for (const s of sessions) await s.close().catch(() => {});
    for (const c of clients) await c.close().catch(() => {});
    await srv?.stop();
  });

  journeys(() => ({
    session: () => mine,
    approve: async (id) => {
      const r = await cli(config, "approvals", "approve", id, "--token", DEMO_TOKENS.operator);
      expect(r.code, r.stderr).toBe(0);
    },
  }));

  it("CVE-2026-52870 (task-handler IDOR): another principal's tasks/get, tasks/result and tasks/cancel are not found", async () => {
    const ex = await mine.callTool("run_benchmark", LONG, TASK);
    const taskId = ex.handle!.taskId;
    try {
      const other = theirs.task(taskId);
      await expect(other.snapshot()).rejects.toThrow(/no task .* of yours/);
      await expect(other.cancel()).rejects.toThrow(/no task .* of yours/);
      await expect(other.result()).rejects.toThrow(/no task .* of yours/);
      if (era === "legacy")
        expect((await theirs.listTasks()).tasks.map((t) => t.taskId)).not.toContain(taskId);
      // The owner's task went on: nobody else's cancel reached it.
      expect((await mine.task(taskId).snapshot()).status).toBe("working");
      if (era === "legacy")
        expect((await mine.listTasks()).tasks.map((t) => t.taskId)).toContain(taskId);
    } finally {
      await mine.cancelTask(taskId);
    }
  });

  it.runIf(era === "modern")(
    "tasks/get needs the extension declared, and Mcp-Name must name the task",
    async () => {
      const raw = httpDispatch(srv.url, DEMO_TOKENS.agent);
      const created = await raw({
        method: "tools/call",
        params: { name: "run_benchmark", arguments: QUICK, _meta: modernMeta(true) },
      });
      expect(created.kind).toBe("result");
      const taskId = (created as any).result.taskId;
      expect((created as any).result).toMatchObject({ resultType: "task", status: "working" });
      const undeclared = await raw({
        method: "tasks/get",
        params: { taskId, _meta: modernMeta(false) },
      });
      expect(undeclared).toMatchObject({ kind: "error", error: { code: -32021 } });
      const misrouted = await raw(
        { method: "tasks/get", params: { taskId, _meta: modernMeta(true) } },
        { context: { headers: { "mcp-name": "job_000000000000000000000000" } } },
      );
      expect(misrouted.kind).toBe("error");
      // Without the extension the same call is an ordinary one, answered with its result.
      const plain = await raw({
        method: "tools/call",
        params: { name: "run_benchmark", arguments: QUICK, _meta: modernMeta(false) },
      });
      expect((plain as any).result.resultType, JSON.stringify(plain).slice(0, 400)).toBe(
        "complete",
      );
      expect(
        (plain as any).result.structuredContent?.model,
        JSON.stringify(plain).slice(0, 400),
      ).toBe("mnist-cnn");
    },
  );
});

describe.each(["legacy", "modern"] as const)("MCP Tasks over stdio, %s era", (era) => {
  let config: string;
  let s: Session;
  let close: () => Promise<unknown>;
  beforeAll(async () => {
    config = writeConfig({
      policy: { approvals: RULES, limits: { rate_limit: { per_principal_per_minute: 6000 } } },
    });
    if (era === "legacy") {
      const c = await connectModernStdio(config, { mode: "default" });
      s = legacyTasks(c.client);
      close = () => c.close();
    } else {
      const proc = stdioDispatch(config);
      const client = new Client({ name: "tpu-mcp-tasks-test", version: "0.0.0" }, {
        versionNegotiation: { mode: { pin: "2026-07-28" } },
      } as any);
      await client.connect(proc.transport);
      s = modernTasks(client, proc.dispatch);
      close = async () => {
        await client.close().catch(() => {});
        await proc.close();
      };
    }
  });
  afterAll(async () => {
    await s?.close().catch(() => {});
    await close?.();
  });

  journeys(() => ({
    session: () => s,
    approve: async (id) => {
      const r = await cli(config, "approvals", "approve", id);
      expect(r.code, r.stderr).toBe(0);
    },
  }));
});
