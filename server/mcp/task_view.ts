// What the Tasks methods show of a job, in each era's wire shape (the types are the published
// ones of @modelcontextprotocol/ext-tasks; the mapping is ours). A task is a job: the task id is
// the job id, so get_job / cancel_job and tasks/* read and change the same row.
//
//   job                        2025-11-25 (v1) status      2026-07-28 (v2) DetailedTask
//   running                    working                     working
//   running, awaiting approval input_required              input_required (inputRequests {})
//   succeeded                  completed                   completed, result
//   failed (a tool error)      failed (result isError)     completed, result.isError
//   interrupted (server gone)  failed (result isError)     failed, error -32603
//   cancelled                  cancelled                   cancelled
import type { TaskStatusV1, TaskV1 } from "@modelcontextprotocol/ext-tasks/core/v1";
import type { DetailedTaskV2, TaskV2 } from "@modelcontextprotocol/ext-tasks/core/v2";
import {
  errorResult,
  successResult,
  type CallToolResultLike,
} from "../../tools/dispatch/result.js";
import { ToolError, isErrorCode } from "../../tools/errors.js";
import type { JobRecord } from "../../tools/stores/jobs.js";
import type { ToolDefinition } from "../../tools/types.js";
import { awaitingApproval } from "./task_runner.js";

/** How often a client should poll tasks/get, in ms. */
export const POLL_INTERVAL_MS = 1000;

export const RELATED_TASK_META_KEY = "io.modelcontextprotocol/related-task";

function v1Status(job: JobRecord): TaskStatusV1 {
  switch (job.status) {
    case "running":
      return awaitingApproval(job) ? "input_required" : "working";
    case "succeeded":
      return "completed";
    case "cancelled":
      return "cancelled";
    default:
      return "failed";
  }
}

function statusMessage(job: JobRecord): string | undefined {
  if (job.error) return `${job.error.code}: ${job.error.message}`;
  return job.message ?? undefined;
}

/** Jobs keep their rows: a task is never expired by the server (ttl null, as both eras allow). */
function base(job: JobRecord) {
  const message = statusMessage(job);
  return {
    taskId: job.job_id,
    ...(message ? { statusMessage: message } : {}),
    createdAt: job.created_at,
    lastUpdatedAt: job.updated_at,
  };
}

export function taskV1(job: JobRecord): TaskV1 {
  return { ...base(job), status: v1Status(job), ttl: null, pollInterval: POLL_INTERVAL_MS };
}

export function taskV2(job: JobRecord): TaskV2 {
  const s = v1Status(job);
  // A tool's own error is a completed task whose result says isError (v2 keeps failed for
  // protocol-level failures: the server went away under the job).
  const status = s === "failed" && job.status === "failed" ? "completed" : s;
  return { ...base(job), status, ttlMs: null, pollIntervalMs: POLL_INTERVAL_MS };
}

/**
 * The tools/call result a finished job stands for: the tool's success result, or the error
 * result its code and message make (details do not survive the job row). undefined: running.
 */
export function taskResult(
  job: JobRecord,
  tool: ToolDefinition<any, any> | undefined,
): CallToolResultLike | undefined {
  if (job.status === "running") return undefined;
  if (job.result && tool) return successResult(tool, job.result);
  const err = job.error ?? { code: "internal", message: "the job ended without a result" };
  const code = isErrorCode(err.code) ? err.code : "internal";
  return errorResult(new ToolError(code, err.message));
}

export function detailedTaskV2(
  job: JobRecord,
  tool: ToolDefinition<any, any> | undefined,
): DetailedTaskV2 {
  const task = taskV2(job);
  switch (task.status) {
    case "input_required":
      // Decided by an operator out of band (statusMessage says how): nothing for the client.
      return { ...task, status: "input_required", inputRequests: {} };
    case "completed":
      // The inlined result is a 2026-07-28 tool result: it says its own resultType.
      return {
        ...task,
        status: "completed",
        result: { resultType: "complete", ...taskResult(job, tool) } as any,
      };
    case "failed":
      return {
        ...task,
        status: "failed",
        error: { code: -32603, message: statusMessage(job) ?? "the task failed" },
      };
    default:
      return task as DetailedTaskV2;
  }
}
