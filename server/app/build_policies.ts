// Builds the policy services from the config: one place, used by the server and the operator CLI.
import type { Logger } from "pino";
import { SqliteApprovalStore, type ApproveCommand } from "../../policies/approvals.js";
import { SqliteAuditLog } from "../../policies/audit.js";
import { loadOrCreateAuditKey } from "../../policies/audit_key.js";
import { Gate } from "../../policies/gate/gate.js";
import { SqliteBudgetLedger } from "../../policies/limits/budget.js";
import { ConcurrencyLimiter } from "../../policies/limits/concurrency.js";
import { RateLimiter } from "../../policies/limits/rate.js";
import { mkdirSync } from "node:fs";
import { isAbsolute, join, relative } from "node:path";
import type { ServerConfig } from "../config/config.js";

export function policyDbPath(config: ServerConfig): string {
  return join(config.paths.data_dir, "policy.db");
}

/**
 * The command an operator runs to approve, as it works from the tpu-mcp folder: `tpu-mcp` is not
 * on a clone's PATH, and without the server's `--config` the operator's token is unknown.
 */
export function approveCommand(config: ServerConfig): ApproveCommand {
  const file = config.paths.config_file;
  const rel = file && relative(config.paths.root, file);
  const where = file ? (rel && !rel.startsWith("..") && !isAbsolute(rel) ? rel : file) : undefined;
  return (id) => `node bin/tpu-mcp.js approvals approve ${id}${where ? ` --config ${where}` : ""}`;
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
    approvals,
    audit,
    limiter: new ConcurrencyLimiter(policy.limits),
    rateLimiter: new RateLimiter(policy.limits.rate_limit.per_principal_per_minute),
    budget,
    logger: logger.child({ component: "gate" }),
    approveCommand: approveCommand(config),
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
