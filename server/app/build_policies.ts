// Builds the policy services from the config: one place, used by the server and by the CLI
// commands that write (approve, deny, workers drain/scale/reload). They make the data dir and
// the audit key when missing; read-only commands never come here (cli/operator.ts).
import type { Logger } from "pino";
import { SqliteApprovalStore, type ApproveCommand } from "../../policies/approvals.js";
import { SqliteAuditLog } from "../../policies/audit.js";
import { SqliteCallsInFlight } from "../../policies/calls_in_flight.js";
import { loadOrCreateAuditKey } from "../../policies/audit_key.js";
import { Gate, type GateObserver } from "../../policies/gate/gate.js";
import { SqliteAlertStore } from "../../policies/alerts/store.js";
import { SqliteSuspensionStore } from "../../policies/suspensions.js";
import { SqliteBudgetLedger } from "../../policies/limits/budget.js";
import { ConcurrencyLimiter } from "../../policies/limits/concurrency.js";
import { RateLimiter } from "../../policies/limits/rate.js";
import { PasskeyStore } from "../../policies/passkeys/store.js";
import { RequestStateSealer } from "../../policies/request_state.js";
import { openStoreDb } from "../../policies/sqlite.js";
import { isAbsolute, relative } from "node:path";
import { shellWord } from "../../lib/text.js";
import { TOOL_POLICIES } from "../../tools/registry.js";
import type { ServerConfig } from "../config/config.js";
import { createDataDir } from "../config/data_dir.js";

/**
 * The command an operator runs to approve, as it works pasted into a shell in the tpu-mcp folder:
 * `tpu-mcp` is not on a clone's PATH, and without the server's `--config` the operator's token is
 * unknown. The config's path is quoted for the shell where it needs it.
 */
export function approveCommand(config: ServerConfig): ApproveCommand {
  const file = config.paths.config_file;
  const rel = file && relative(config.paths.root, file);
  const where = file ? (rel && !rel.startsWith("..") && !isAbsolute(rel) ? rel : file) : undefined;
  return (id) =>
    `node bin/tpu-mcp.js approvals approve ${id}${where ? ` --config ${shellWord(where)}` : ""}`;
}

/** The console's public address from http.resource_url (`…/mcp` → `…/console/`), if set. */
export function publicConsoleUrl(resourceUrl: string | undefined): string | undefined {
  if (!resourceUrl) return undefined;
  const u = new URL(resourceUrl);
  const base = u.pathname.replace(/\/+$/, "").replace(/\/mcp$/, "");
  return `${u.origin}${base}/console/`;
}

export interface PolicyServices {
  gate: Gate;
  approvals: SqliteApprovalStore;
  audit: SqliteAuditLog;
  budget: SqliteBudgetLedger;
  passkeys: PasskeyStore;
  /** Admitted calls not yet charged; the server settles what a killed one left (reconcile). */
  calls: SqliteCallsInFlight;
  /** Suspended principals (policy.db), which the gate refuses. */
  suspensions: SqliteSuspensionStore;
  /** The alerts that fired (policy.db), and each rule's quiet time per subject. */
  alertStore: SqliteAlertStore;
  close(): void;
}

export function createPolicyServices(
  config: ServerConfig,
  logger: Logger,
  opts: { consoleUrl?: () => string | undefined; observer?: GateObserver } = {},
): PolicyServices {
  const layout = createDataDir(config, { warn: (msg) => logger.warn(msg) });
  const policy = config.policy;
  // One handle for the three stores of policy.db (they share the file, and close with it).
  const db = openStoreDb(layout.policyDb);
  const approvals = new SqliteApprovalStore(db, {
    keepDecidedS: policy.approvals.keep_decided_s,
  });
  const { key, created } = loadOrCreateAuditKey(layout.auditKey);
  const audit = new SqliteAuditLog(db, {
    logger: logger.child({ component: "audit" }),
    key,
    keyCreated: created,
    refusalWindowMs: policy.audit.refusal_window_s * 1000,
  });
  const budget = new SqliteBudgetLedger(db, policy.limits.budget);
  const passkeys = new PasskeyStore(db);
  const calls = new SqliteCallsInFlight(db, { withCharges: (write) => budget.alongside(write) });
  const suspensions = new SqliteSuspensionStore(db);
  const alertStore = new SqliteAlertStore(db);
  const gate = new Gate({
    config: policy,
    tools: TOOL_POLICIES,
    approvals,
    audit,
    limiter: new ConcurrencyLimiter(policy.limits),
    rateLimiter: new RateLimiter(policy.limits.rate_limit.per_principal_per_minute),
    budget,
    calls,
    suspensions,
    observer: opts.observer,
    logger: logger.child({ component: "gate" }),
    requestStates: new RequestStateSealer(key.key),
    approveCommand: approveCommand(config),
    // The CLI knows only the configured public address; the server adds the one it bound.
    consoleUrl: opts.consoleUrl ?? (() => publicConsoleUrl(config.http.resource_url)),
  });
  return {
    gate,
    approvals,
    audit,
    budget,
    passkeys,
    calls,
    suspensions,
    alertStore,
    close() {
      suspensions.close();
      alertStore.close();
      calls.close();
      passkeys.close();
      approvals.close();
      audit.close();
      budget.close();
      if (db.open) db.close();
    },
  };
}
