// MCP Tasks end to end, in both protocol eras and over both transports, with the official Tasks
// client (@modelcontextprotocol/ext-tasks) on the SDK v2 client: a benchmark started as a task,
// polled and its result fetched (the same row get_job reads), another cancelled, a call that
// needs approval seen in input_required until an operator decides out of band, and a task that
// belongs to its principal (CVE-2026-52870, the Python SDK's task-handler IDOR, as a regression
// test). A 2025-11-25 client asks for a task; a 2026-07-28 one gets one when its call runs past
// the hand-off bound or waits for an operator while it shows forms (docs/tools.md, "MCP Tasks").
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
/** The hand-off bound, in s: a 2026-07-28 call still running then is answered as a task. */
const HANDOFF_S = 2;
const LIMITS = { rate_limit: { per_principal_per_minute: 6000 }, soft_deadline_s: HANDOFF_S };
const POLICY = {
  ...DEMO_POLICY,
  tokens: [...DEMO_POLICY.tokens, { ...agent, id: "agent2", token_sha256: sha(AGENT2) }],
  limits: { ...DEMO_POLICY.limits, ...LIMITS },
  approvals: RULES,
};

const QUICK = { model: "mnist-cnn", batch_sizes: [1], iterations: 5, warmup: 1 };
/** Runs well past the hand-off bound (thousands of steps), then ends. */
const MEDIUM = { model: "mnist-cnn", batch_sizes: [1, 2, 4, 8], iterations: 500, warmup: 1 };
const LONG = { model: "tiny-gpt2", batch_sizes: [1, 2, 4, 8], iterations: 10000, warmup: 1 };
const TASK = { task: { preference: "require" as const } };
/** A 2026-07-28 client with a person at it: it shows forms, so it may be shown a wait. */
const FORMS = { elicitation: { form: {} } };
const SERVER_INFO = "io.modelcontextprotocol/serverInfo";

type Session = ReturnType<typeof legacyTasks>;

/** tasks/get over `raw` until the task leaves `working` (`terminal`: until it ends). */
async function rawSettled(raw: RawDispatch, taskId: string, terminal: boolean): Promise<any> {
  return until(
    async () =>
      (
        (await raw({
          method: "tasks/get",
          params: { taskId, _meta: modernMeta(true, true) },
        })) as any
      ).result,
    (t) => t.status !== "working" && (!terminal || t.status !== "input_required"),
    `task ${taskId}`,
  );
}

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

/**
 * A call that becomes a task: 2025-11-25 asks for one; 2026-07-28 cannot ask (the server decides),
 * so its benchmarks are sized to run past the hand-off bound.
 */
function startTask(era: Era, s: Session, tool: string, args: Record<string, any>) {
  return era === "legacy" ? s.callTool(tool, args, TASK) : s.callTool(tool, args);
}
type Era = "legacy" | "modern";

/** What every era and transport must show; `approve` decides an approval as an operator. */
function journeys(
  era: Era,
  open: () => { session: () => Session; approve: (id: string) => Promise<void> },
) {
  it("a benchmark started as a task is polled and its result fetched; get_job reads the same job", async () => {
    const { session } = open();
    const s = session();
    const ex = await startTask(era, s, "run_benchmark", era === "legacy" ? QUICK : MEDIUM);
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
    const ex = await startTask(era, s, "run_benchmark", LONG);
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
    const ex = await startTask(era, s, "load_model", { model: "mnist-cnn" });
    expect(ex.kind).toBe("task");
    const taskId = ex.handle!.taskId;
    const waiting = await until(
      () => s.task(taskId).snapshot(),
      (t) => t.status !== "working",
      "never input_required",
    );
    expect(waiting.status, JSON.stringify(waiting)).toBe("input_required");
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
    const after = await (await s.callTool("get_job", { job_id: taskId })).settle();
    expect((after.outcome as any).result.structuredContent.status).toBe("succeeded");
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
        : modernTasks(c.client, httpDispatch(srv.url, token) as RawDispatch, FORMS);
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

  journeys(era, () => ({
    session: () => mine,
    approve: async (id) => {
      const r = await cli(config, "approvals", "approve", id, "--token", DEMO_TOKENS.operator);
      expect(r.code, r.stderr).toBe(0);
    },
  }));

  it("CVE-2026-52870 (task-handler IDOR): another principal's tasks/get, tasks/result and tasks/cancel are not found", async () => {
    const ex = await startTask(era, mine, "run_benchmark", LONG);
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
    "tasks/get needs the extension declared, Mcp-Name must name the task, and cancel acks empty",
    async () => {
      const raw = httpDispatch(srv.url, DEMO_TOKENS.agent);
      const created = await raw({
        method: "tools/call",
        params: { name: "run_benchmark", arguments: LONG, _meta: modernMeta(true) },
      });
      expect((created as any).result, JSON.stringify(created).slice(0, 400)).toMatchObject({
        resultType: "task",
        status: "working",
      });
      const taskId = (created as any).result.taskId;
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
      const ack = await raw({
        method: "tasks/cancel",
        params: { taskId, _meta: modernMeta(true) },
      });
      expect((ack as any).result).toEqual({ resultType: "complete", _meta: expect.any(Object) });
      // A tool that is no job never becomes a task, whatever the client declares.
      const listed = await raw({
        method: "tools/call",
        params: { name: "list_models", arguments: {}, _meta: modernMeta(true, true) },
      });
      expect((listed as any).result.resultType).toBe("complete");
    },
  );

  it.runIf(era === "modern")(
    "a client that shows no form keeps approval_required, and wait: false keeps its job_id (the Inspector's flow)",
    async () => {
      const raw = httpDispatch(srv.url, DEMO_TOKENS.agent);
      const gated = await raw({
        method: "tools/call",
        params: { name: "load_model", arguments: { model: "mnist-cnn" }, _meta: modernMeta(true) },
      });
      // Answered at once, or (a cold worker's estimate outlasting the bound) by a task whose
      // result is the same refusal: either way approval_required, never a wait.
      let r = (gated as any).result;
      if (r.resultType === "task") r = (await rawSettled(raw, r.taskId, true)).result;
      expect(r._meta?.["tpu-mcp/error"]?.code, JSON.stringify(gated).slice(0, 400)).toBe(
        "approval_required",
      );
      // The same call from a client that shows forms waits as a task; it asks the client nothing.
      const waiting = (
        (await raw({
          method: "tools/call",
          params: {
            name: "load_model",
            arguments: { model: "mnist-cnn" },
            _meta: modernMeta(true, true),
          },
        })) as any
      ).result;
      expect(waiting.resultType, JSON.stringify(waiting).slice(0, 400)).toBe("task");
      const seen = await rawSettled(raw, waiting.taskId, false);
      expect(seen).toMatchObject({ status: "input_required", inputRequests: {} });
      // The same approval (its id is in the refusal's words; a task's result keeps no details).
      const approvalId = /approval_id "(apr_[^"]+)"/.exec(r._meta["tpu-mcp/error"].message)?.[1];
      expect(approvalId).toBeDefined();
      expect(seen.statusMessage).toContain(approvalId);
      await raw({
        method: "tasks/cancel",
        params: { taskId: waiting.taskId, _meta: modernMeta(true) },
      });
      const asked = await raw({
        method: "tools/call",
        params: {
          name: "run_benchmark",
          arguments: { ...LONG, wait: false },
          _meta: modernMeta(true, true),
        },
      });
      const job = (asked as any).result;
      expect(job.resultType, JSON.stringify(asked).slice(0, 400)).toBe("complete");
      expect(job.structuredContent.job_id).toMatch(/^job_/);
      const stop = await raw({
        method: "tools/call",
        params: {
          name: "cancel_job",
          arguments: { job_id: job.structuredContent.job_id },
          _meta: modernMeta(true),
        },
      });
      expect((stop as any).result.isError, JSON.stringify(stop).slice(0, 400)).toBeFalsy();
    },
  );

  it.runIf(era === "modern")(
    "a task's inlined result has the shape tools/call answers, the server's identity included",
    async () => {
      const ex = await mine.callTool("run_benchmark", MEDIUM);
      expect(ex.kind).toBe("task");
      const taskId = ex.handle!.taskId;
      const done = await until(
        () => mine.task(taskId).snapshot(),
        (t) => t.status === "completed",
        "never completed",
      );
      const raw = httpDispatch(srv.url, DEMO_TOKENS.agent);
      const got = (
        (await raw({ method: "tasks/get", params: { taskId, _meta: modernMeta(true) } })) as any
      ).result;
      expect(got.status, JSON.stringify(done).slice(0, 300)).toBe("completed");
      const direct = (
        (await raw({
          method: "tools/call",
          params: { name: "run_benchmark", arguments: QUICK, _meta: modernMeta(false) },
        })) as any
      ).result;
      expect(direct.structuredContent.model).toBe("mnist-cnn");
      expect(direct._meta[SERVER_INFO]).toMatchObject({ name: "tpu-mcp" });
      expect(got.result._meta[SERVER_INFO]).toEqual(direct._meta[SERVER_INFO]);
      expect(Object.keys(got.result).sort()).toEqual(Object.keys(direct).sort());
    },
  );
});

describe.each(["legacy", "modern"] as const)("MCP Tasks over stdio, %s era", (era) => {
  let config: string;
  let s: Session;
  let close: () => Promise<unknown>;
  beforeAll(async () => {
    config = writeConfig({ policy: { approvals: RULES, limits: LIMITS } });
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
      s = modernTasks(client, proc.dispatch, FORMS);
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

  journeys(era, () => ({
    session: () => s,
    approve: async (id) => {
      const r = await cli(config, "approvals", "approve", id);
      expect(r.code, r.stderr).toBe(0);
    },
  }));
});
