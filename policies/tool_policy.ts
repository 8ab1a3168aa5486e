// What the policies know of a tool: a plain record each tool declares in its own file
// (tools/<name>.ts) and the server hands down. Policies read these facts as data and never name a
// tool themselves, so a new tool is one file; a tool nobody described needs `admin`.
import type { Scope } from "./scopes.js";

/** A device lane held alone (a writer: loads, benchmarks) or with other shared calls (readers). */
export type DeviceMode = "exclusive" | "shared";

/** The shape of work the cost estimator models a call as (policies/estimate.ts). */
export type EstimateKind = "load" | "check" | "benchmark" | "inference";

/**
 * Every field is present (null where it does not apply), so each tool decides each one; a test
 * checks that every registered tool's record is complete and consistent.
 */
export interface ToolPolicy {
  readonly name: string;
  /** The scope a caller needs; the gate, the HTTP pre-check and tools/list all read it here. */
  readonly scope: Scope;
  /** The worker operation the call's device work runs as (a pool places it by this); null: none. */
  readonly workerOp: string | null;
  /** Accepts `wait: false` and then runs as a job (as does a call past the soft deadline). */
  readonly job: boolean;
  /** How the call holds its device lane; null: it takes no lane. Default of limits.device_*_tools. */
  readonly deviceMode: DeviceMode | null;
  /** Time limit in seconds, the default of limits.call_timeout_s; null: default_call_timeout_s. */
  readonly timeoutS: number | null;
  /** Concurrent calls, the default of limits.per_tool_concurrency; null: default_concurrency. */
  readonly concurrency: number | null;
  /** What the estimator models the call as; null: no device time worth counting. */
  readonly estimate: EstimateKind | null;
  /**
   * May start while its "allowed" audit record is being committed (queued first and committed
   * within the same event-loop turn, with other calls' records). The answer still waits for that
   * commit and for the "executed" one, so no answered call lacks its records; if the commit fails
   * the work is cancelled and the call refused. Only for work that changes nothing on the device
   * (inference), so work that ran and was then refused costs nothing but the time. Waiting for
   * the commit first cost a lone call an event-loop turn and a commit (~0.3 ms of ~5 on the
   * 2-core development VM, bench/decompose.ts).
   */
  readonly runWhileRecording: boolean;
}

/** Tools by name, for the per-call lookups. */
export function toolPolicyMap(tools: readonly ToolPolicy[]): ReadonlyMap<string, ToolPolicy> {
  return new Map(tools.map((t) => [t.name, t]));
}

/**
 * The record of a tool that answers from the server alone (status, the catalog, jobs): no worker
 * op, no job, no device lane, no estimate; default timeout and concurrency.
 */
export function hostOnlyPolicy(name: string, scope: Scope): ToolPolicy {
  return {
    name,
    scope,
    workerOp: null,
    job: false,
    deviceMode: null,
    timeoutS: null,
    concurrency: null,
    estimate: null,
    runWhileRecording: false,
  };
}
