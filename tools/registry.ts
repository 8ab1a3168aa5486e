// Every tool, in the order tools/list shows them. A tool the principal may not call is left out
// of its list by the server (see policies/scopes.ts). Each tool's facts (scope, worker op, job,
// lane, defaults, estimate) are its own file's policy record; the config schema reads them here.
import type { ToolPolicy } from "../policies/tool_policy.js";
import { cancelJob } from "./cancel_job.js";
import { checkModel } from "./check_model.js";
import { getJob } from "./get_job.js";
import { getRuntimeStatus } from "./get_runtime_status.js";
import { listModels } from "./list_models.js";
import { loadModel } from "./load_model.js";
import { runBenchmark } from "./run_benchmark.js";
import { runInference } from "./run_inference.js";
import type { ToolDefinition, ToolEnv, ToolFile } from "./types.js";
import { unloadModel } from "./unload_model.js";

const TOOL_FILES: readonly ToolFile[] = [
  getRuntimeStatus,
  listModels,
  checkModel,
  loadModel,
  unloadModel,
  runInference,
  runBenchmark,
  getJob,
  cancelJob,
];

/** The policy records of every tool, for the config schema and the gate (before any catalog). */
export const TOOL_POLICIES: readonly ToolPolicy[] = TOOL_FILES.map((t) => t.policy);

export function buildTools(env: ToolEnv): ToolDefinition<any, any>[] {
  return TOOL_FILES.map((t) => t.build(env));
}
