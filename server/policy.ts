// Builds the policy services from the config: one place, used by the server and the operator CLI.
import type { Logger } from "pino";
import { SqliteApprovalStore } from "../policies/approvals.js";
import { SqliteAuditLog } from "../policies/audit.js";
import { loadOrCreateAuditKey } from "../policies/audit_key.js";
import { Gate } from "../policies/gate.js";
import { ConcurrencyLimiter, RateLimiter, SqliteBudgetLedger } from "../policies/limits.js";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { TOOL_POLICIES } from "../tools/registry.js";
import type { ServerConfig } from "./config.js";

export function policyDbPath(config: ServerConfig): string {
  return join(config.paths.data_dir, "policy.db");
}

export interface PolicyServices {
  gate: Gate;
  approvals: SqliteApprovalStore;
  audit: SqliteAuditLog;
  budget: SqliteBudgetLedger;
  close(): void;
}

export function createPolicyServices(config: ServerConfig, logger: Logger): PolicyServices {
  const dbPath = policyDbPath(config);
  const policy = config.policy;
  const approvals = new SqliteApprovalStore(dbPath);
  mkdirSync(config.paths.data_dir, { recursive: true });
  const { key, created } = loadOrCreateAuditKey(config.paths.audit_key);
  const audit = new SqliteAuditLog(dbPath, {
    logger: logger.child({ component: "audit" }),
    key,
    keyCreated: created,
  });
  const budget = new SqliteBudgetLedger(dbPath, policy.limits.budget);
  const gate = new Gate({
    config: policy,
    tools: TOOL_POLICIES,
    approvals,
    audit,
    limiter: new ConcurrencyLimiter(policy.limits),
    rateLimiter: new RateLimiter(policy.limits.rate_limit.per_principal_per_minute),
    budget,
    logger: logger.child({ component: "gate" }),
  });
  return {
    gate,
    approvals,
    audit,
    budget,
    close() {
      approvals.close();
      audit.close();
      budget.close();
    },
  };
}
