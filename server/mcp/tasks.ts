// The MCP Tasks methods, in both eras, over the job store (no server helper exists in the
// TypeScript SDK: these handlers are written here on the published wire types of
// @modelcontextprotocol/ext-tasks). When a tools/call is answered as a task (docs/tools.md,
// "MCP Tasks"):
// - 2025-11-25: a job tool's call that carries `task` (the client asked), answered with
//   CreateTaskResult at once; tasks/get, tasks/result (waits for the end), tasks/list, tasks/cancel.
// - 2026-07-28 (the io.modelcontextprotocol/tasks extension, declared per request; the server
//   decides): a job tool's call still running at the hand-off bound (soft_deadline_s), where an
//   undeclaring client gets a job_id; and a call whose approval an operator decides, for a client
//   that can show a form (a person is at it): the task waits in input_required until the decision.
//   A client that shows no form keeps the approval_required answer, wait: false keeps its job_id.
//   tasks/get inlines the result; tasks/cancel answers an empty ack; tasks/update has nothing to
//   take (an operator decides).
// A task is its principal's: another principal's id is not found.
import { TASKS_EXTENSION_ID_V2 } from "@modelcontextprotocol/ext-tasks/core/v2";
import {
  ProtocolError,
  ProtocolErrorCode,
  SERVER_INFO_META_KEY,
  type ClientCapabilities,
  type Server,
  type ServerContext,
} from "@modelcontextprotocol/server";
import { z } from "zod";
import type { Principal } from "../../policies/scopes.js";
import type { JobRecord } from "../../tools/stores/jobs.js";
import type { ToolDefinition } from "../../tools/types.js";
import type { App } from "../app/app.js";
import { SERVER_INFO } from "../version.js";
import { awaitingMessage, startTask, type PendingApproval } from "./task_runner.js";
import { RELATED_TASK_META_KEY, detailedTaskV2, taskResult, taskV1, taskV2 } from "./task_view.js";

export const TASKS_EXTENSION = TASKS_EXTENSION_ID_V2;

type Era = "legacy" | "modern";

/** The 2025-11-25 capability: tool calls as tasks, listed and cancellable. */
export const LEGACY_TASKS_CAPABILITY = {
  list: {},
  cancel: {},
  requests: { tools: { call: {} } },
};

/** Only job tools (long work: loads, benchmarks) run as tasks; every other call answers at once. */
export function taskEligible(tool: ToolDefinition<any, any>): boolean {
  return tool.policy.job;
}

/** Does this 2026-07-28 request's client take a task for an answer (the extension declared)? */
export function declaresTasks(caps: ClientCapabilities | undefined): boolean {
  const ext = (caps as { extensions?: Record<string, unknown> } | undefined)?.extensions;
  return !!ext && typeof ext === "object" && ext[TASKS_EXTENSION] !== undefined;
}

/** 2025-11-25: the client asks for a task with `task` (2026-07-28 ignores it: the server decides). */
export function askedForTask(era: Era, params: { task?: unknown }): boolean {
  return era === "legacy" && params.task !== undefined && params.task !== null;
}

/**
 * Starts the call as a task (`awaiting`: first waiting for that approval's decision) and answers
 * tools/call with the era's CreateTaskResult.
 */
export async function createTask(
  app: App,
  principal: Principal,
  tool: ToolDefinition<any, any>,
  args: Record<string, unknown> | undefined,
  era: Era,
  awaiting?: PendingApproval,
): Promise<Record<string, unknown>> {
  let job = await startTask(app, principal, tool, args, awaiting);
  // The row may not show the wait yet (a store that writes progress asynchronously).
  if (awaiting && job.status === "running")
    job = { ...job, message: awaitingMessage(awaiting.approvalId, awaiting.how) };
  if (era === "modern") return { resultType: "task", ...taskV2(job) };
  // `content` beside `task`: the SDK v2 client refuses a contentless tools/call result (it reads
  // `task` through), and a client that knows no tasks still reads what happened.
  const text = `${tool.name} started as task ${job.job_id}; follow it with tasks/get (or get_job), collect it with tasks/result`;
  return { task: taskV1(job), content: [{ type: "text", text }] };
}

/** 2026-07-28: the CreateTaskResult of a call its job took over at the hand-off bound. */
export async function handedOffTask(
  app: App,
  principal: Principal,
  jobId: string,
): Promise<Record<string, unknown> | undefined> {
  const job = await app.jobs.get(jobId, principal.id);
  return job ? { resultType: "task", ...taskV2(job) } : undefined;
}

const TaskIdParams = z.object({ taskId: z.string().min(1).max(200) });

function notFound(taskId: string): ProtocolError {
  return new ProtocolError(
    ProtocolErrorCode.InvalidParams,
    `no task ${taskId.slice(0, 80)} of yours exists (tasks/list shows yours)`,
  );
}

/** Until the job leaves `running` (any replica may run it: the row is read again). */
async function settled(
  app: App,
  jobId: string,
  principal: string,
  signal: AbortSignal,
): Promise<JobRecord> {
  for (;;) {
    const job = await app.jobs.get(jobId, principal);
    if (!job) throw notFound(jobId);
    if (job.status !== "running") return job;
    signal.throwIfAborted();
    await Promise.race([
      app.jobs.settled(jobId),
      new Promise((r) => setTimeout(r, 500)),
      new Promise((r) => signal.addEventListener("abort", r, { once: true })),
    ]);
  }
}

export function registerTasks(
  server: Server,
  app: App,
  principal: Principal,
  era: Era,
  caps: (ctx: ServerContext) => ClientCapabilities | undefined,
): void {
  const toolOf = (job: JobRecord) => app.tools.find((t) => t.name === job.tool);
  const own = async (taskId: string) => {
    const job = await app.jobs.get(taskId, principal.id);
    if (!job) throw notFound(taskId);
    return job;
  };
  const cancel = async (taskId: string) => {
    const job = await app.jobs.cancel(taskId, principal.id);
    if (!job) throw notFound(taskId);
    if (job.status === "running")
      await Promise.race([app.jobs.settled(taskId), new Promise((r) => setTimeout(r, 5000))]);
    return (await app.jobs.get(taskId, principal.id)) ?? job;
  };

  if (era === "legacy") {
    server.setRequestHandler("tasks/get", { params: TaskIdParams }, async (p) =>
      taskV1(await own(p.taskId)),
    );
    server.setRequestHandler("tasks/result", { params: TaskIdParams }, async (p, ctx) => {
      const job = await settled(app, p.taskId, principal.id, ctx.mcpReq.signal);
      const result = taskResult(job, toolOf(job))!;
      return {
        ...result,
        _meta: { ...result._meta, [RELATED_TASK_META_KEY]: { taskId: p.taskId } },
      };
    });
    server.setRequestHandler(
      "tasks/list",
      { params: z.object({ cursor: z.string().optional() }).optional() },
      async () => ({ tasks: (await app.jobs.listOf(principal.id, 100)).map(taskV1) }),
    );
    server.setRequestHandler("tasks/cancel", { params: TaskIdParams }, async (p) => {
      const before = await own(p.taskId);
      if (before.status !== "running")
        throw new ProtocolError(
          ProtocolErrorCode.InvalidParams,
          `task ${p.taskId} is already ${taskV1(before).status}: nothing to cancel`,
        );
      return taskV1(await cancel(p.taskId));
    });
    return;
  }

  // 2026-07-28: the methods exist only for a request that declares the extension.
  const gated = (ctx: ServerContext) => {
    if (!declaresTasks(caps(ctx)))
      throw new ProtocolError(
        ProtocolErrorCode.MissingRequiredClientCapability,
        `declare the ${TASKS_EXTENSION} extension in the request's client capabilities to use tasks`,
        { requiredCapabilities: { extensions: { [TASKS_EXTENSION]: {} } } },
      );
  };
  server.setRequestHandler("tasks/get", { params: TaskIdParams }, async (p, ctx) => {
    gated(ctx);
    const job = await own(p.taskId);
    const task = detailedTaskV2(job, toolOf(job));
    // The inlined result is what tools/call would have answered: the server's identity included.
    if (task.status === "completed") {
      const result = task.result as { _meta?: Record<string, unknown> };
      task.result = { ...result, _meta: { ...result._meta, [SERVER_INFO_META_KEY]: SERVER_INFO } };
    }
    return { resultType: "complete", ...task };
  });
  server.setRequestHandler("tasks/cancel", { params: TaskIdParams }, async (p, ctx) => {
    gated(ctx);
    const job = await own(p.taskId);
    if (job.status === "running") await cancel(p.taskId);
    return { resultType: "complete" };
  });
  server.setRequestHandler(
    "tasks/update",
    // Loose: the extension is checked before anything of the request is.
    { params: z.looseObject({ taskId: z.unknown() }) },
    async (p, ctx) => {
      gated(ctx);
      const id = TaskIdParams.safeParse(p);
      if (!id.success)
        throw new ProtocolError(ProtocolErrorCode.InvalidParams, "taskId: a task id string");
      await own(id.data.taskId);
      throw new ProtocolError(
        ProtocolErrorCode.InvalidParams,
        `task ${p.taskId} takes no input: an approval it waits for is decided by an operator (its statusMessage says how)`,
      );
    },
  );
}
