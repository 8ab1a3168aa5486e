// Builds the policy services from the config: one place, used by the server and by the CLI
// commands that write (approve, deny, workers drain/scale/reload). They make the data dir and
// the audit key when missing; read-only commands never come here (cli/operator.ts).
import type { Logger } from "pino";
import { SqliteApprovalStore } from "../../policies/approvals.js";
import { SqliteAuditLog } from "../../policies/audit.js";
import { loadOrCreateAuditKey } from "../../policies/audit_key.js";
import { Gate } from "../../policies/gate.js";
import { ConcurrencyLimiter, RateLimiter, SqliteBudgetLedger } from "../../policies/limits.js";
import { openPolicyDb } from "../../policies/sqlite.js";
import type { ServerConfig } from "../config/config.js";
import { createDataDir } from "../config/data_dir.js";

export interface PolicyServices {
  gate: Gate;
  approvals: SqliteApprovalStore;
  audit: SqliteAuditLog;
  budget: SqliteBudgetLedger;
  close(): void;
}

export function createPolicyServices(config: ServerConfig, logger: Logger): PolicyServices {
  const layout = createDataDir(config);
  const policy = config.policy;
  // One handle for the three stores of policy.db (they share the file, and close with it).
  const db = openPolicyDb(layout.policyDb);
  const approvals = new SqliteApprovalStore(db);
  const { key, created } = loadOrCreateAuditKey(layout.auditKey);
  const audit = new SqliteAuditLog(db, {
    logger: logger.child({ component: "audit" }),
    key,
    keyCreated: created,
  });
  const budget = new SqliteBudgetLedger(db, policy.limits.budget);
  const gate = new Gate({
    config: policy,
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
      if (db.open) db.close();
    },
  };
}
