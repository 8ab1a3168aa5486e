// The policies layer's public surface. Nothing here imports runtime/, tools/ or server/.
export * from "./approvals.js";
export * from "./audit.js";
export * from "./auth.js";
export * from "./clock.js";
export * from "./config.js";
export * from "./digest.js";
export * from "./errors.js";
export * from "./estimate.js";
export * from "./gate.js";
export {
  ConcurrencyLimiter,
  RateLimiter,
  SqliteBudgetLedger,
  deviceKey,
  type BudgetCheck,
  type BudgetLedger,
  type DeviceMode,
  type RateDecision,
  type Release,
} from "./limits.js";
export * from "./scopes.js";
export * from "./sqlite.js";
