// Cost estimates from plain facts (no runtime import): the tools layer passes what it knows about
// the model, the device and past benchmarks, and gets device-seconds, memory and compile time
// back. The numbers are deliberately conservative: they drive approvals, budgets and refusals,
// so erring high costs a prompt while erring low costs an out-of-memory crash on the device.
// The estimator lives in estimate/, one file per kind of work (kinds.ts dispatches).
export * from "./estimate/types.js";
export { dtypeBytes, dtypeCostFactor, extensionS, latencyMs, memoryFor } from "./estimate/model.js";
export {
  classOf,
  estimateCost,
  estimateDetail,
  hostDrift,
  workKey,
  workOf,
  type EstimateDetail,
} from "./estimate/index.js";
