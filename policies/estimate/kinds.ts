// The one dispatch on the kind of work: each kind's estimate in a file of its own.
import type { EstimateKind } from "../tool_policy.js";
import { benchmark } from "./benchmark.js";
import { check } from "./check.js";
import { inference } from "./inference.js";
import { load } from "./load.js";
import type { WorkKind } from "./work_kind.js";

export const WORK_KINDS: Readonly<Record<EstimateKind, WorkKind>> = {
  load,
  check,
  benchmark,
  inference,
};
