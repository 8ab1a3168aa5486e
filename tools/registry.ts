// Every tool, in the order tools/list shows them. A tool the principal may not call is left out
// of its list by the server (see policies/scopes.ts).
import { cancelJob } from "./cancel_job.js";
import { checkModel } from "./check_model.js";
import { getJob } from "./get_job.js";
import { getRuntimeStatus } from "./get_runtime_status.js";
import { listModels } from "./list_models.js";
import { loadModel } from "./load_model.js";
import { runBenchmark } from "./run_benchmark.js";
import { runInference } from "./run_inference.js";
import type { ToolDefinition, ToolEnv } from "./types.js";
import { unloadModel } from "./unload_model.js";

export function buildTools(env: ToolEnv): ToolDefinition<any, any>[] {
  return [
    getRuntimeStatus(env),
    listModels(env),
    checkModel(env),
    loadModel(env),
    unloadModel(env),
    runInference(env),
    runBenchmark(env),
    getJob(env),
    cancelJob(env),
  ];
}

/** Tools that accept `wait: false` and then run as jobs. */
export const JOB_TOOLS = new Set(["load_model", "run_benchmark"]);
