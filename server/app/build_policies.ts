// Builds the policy services from the config: one place, used by the server and by the CLI
// commands that write (approve, deny, workers drain/scale/reload). They make the data dir and
// the audit key when missing; read-only commands never come here (cli/operator.ts).
import type { Logger } from "pino";
import type { ApproveCommand } from "../../policies/approval_record.js";
import { Gate, type GateObserver } from "../../policies/gate/gate.js";
import { RequestStateSealer } from "../../policies/request_state.js";
import { TOOL_POLICIES } from "../../tools/registry.js";
import type { ServerConfig } from "../config/config.js";
import { cliCommand, consoleStart, type CliTarget } from "../config/cli_command.js";
import {
  databaseUrl,
  openCommandBackend,
  openPolicyStores,
  type PolicyStores,
  type SharedBackend,
} from "./storage.js";

/**
 * The command an operator runs to approve, as it works pasted into a shell in any folder: the
 * program this server was installed as, with its --home and --config (cli_command.ts).
 */
export function approveCommand(config: ServerConfig): ApproveCommand {
  const target = cliTarget(config);
  return (id) => cliCommand(target, ["approvals", "approve", id]);
}

/** Where the server's code and data are, for the commands it prints. */
export function cliTarget(config: ServerConfig): CliTarget {
  return { layout: config.paths.install, configFile: config.paths.config_file };
}

/** The console's public address from http.resource_url (`…/mcp` → `…/console/`), if set. */
export function publicConsoleUrl(resourceUrl: string | undefined): string | undefined {
  if (!resourceUrl) return undefined;
  const u = new URL(resourceUrl);
  const base = u.pathname.replace(/\/+$/, "").replace(/\/mcp$/, "");
  return `${u.origin}${base}/console/`;
}

/** The gate on the policy stores (server/app/storage.ts), which it closes with them. */
export interface PolicyServices extends PolicyStores {
  gate: Gate;
}

export async function createPolicyServices(
  config: ServerConfig,
  logger: Logger,
  opts: {
    consoleUrl?: () => string | undefined;
    observer?: GateObserver;
    /**
     * The Postgres backend, opened first (storage.ts openSharedBackend); null with SQLite. A
     * CLI command on storage.postgres passes none: it opens one of its own, closed with these.
     */
    shared?: SharedBackend | null;
  } = {},
): Promise<PolicyServices> {
  const own =
    !opts.shared && databaseUrl(config) !== null ? await openCommandBackend(config) : null;
  let opened: PolicyStores;
  try {
    opened = await openPolicyStores(config, logger, opts.shared ?? own);
  } catch (e) {
    await own?.close();
    throw e;
  }
  const stores: PolicyStores = own
    ? {
        ...opened,
        async close() {
          await opened.close();
          await own.close();
        },
      }
    : opened;
  const gate = new Gate({
    config: config.policy,
    tools: TOOL_POLICIES,
    approvals: stores.approvals,
    audit: stores.audit,
    limiter: stores.limiter,
    rateLimiter: stores.rateLimiter,
    budget: stores.budget,
    calls: stores.calls,
    suspensions: stores.suspensions,
    ...(stores.consumedStates ? { consumedStates: stores.consumedStates } : {}),
    observer: opts.observer,
    logger: logger.child({ component: "gate" }),
    // Sealed with the audit key: every replica holding the key opens what another sealed.
    // On Postgres its expiry is the database's clock: a replica's own clock may be off.
    requestStates: new RequestStateSealer(stores.auditKey.key.key, opts.shared?.clock),
    approveCommand: approveCommand(config),
    // The CLI knows only the configured public address; the server adds the one it bound.
    consoleUrl: opts.consoleUrl ?? (() => publicConsoleUrl(config.http.resource_url)),
    // Used only while no console URL is known: a stdio server's operator serves one over HTTP.
    consoleStart: consoleStart(cliTarget(config), config.http.port),
  });
  return { ...stores, gate };
}
