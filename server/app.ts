// Composition root: builds every long-lived service once (runtime, stores, gate, tools) from a
// validated config. Transports (stdio, HTTP) ask it for one MCP server per session.
import { EventEmitter } from "node:events";
import { mkdirSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import type { Logger } from "pino";
import type { SqliteApprovalStore } from "../policies/approvals.js";
import type { SqliteAuditLog } from "../policies/audit.js";
import { Authenticator } from "../policies/auth.js";
import type { Gate } from "../policies/gate.js";
import { ApprovalNotifier, type NotifyTarget } from "../policies/notify.js";
import { readCatalog, type Catalog } from "../runtime/catalog.js";
import { memoryFor } from "../policies/estimate.js";
import type { Runtime } from "../runtime/types.js";
import { buildTools } from "../tools/registry.js";
import { WorkerModelFacts } from "../tools/support/facts.js";
import { SqliteJobs } from "../tools/support/jobs.js";
import { MemoryOutputs } from "../tools/support/outputs.js";
import { SqliteReports } from "../tools/support/reports.js";
import type { ToolDefinition, ToolEnv, ToolServices } from "../tools/types.js";
import { ApprovalFeed } from "./approval_feed.js";
import { ConfigError, type ServerConfig } from "./config.js";
import { Metrics } from "./metrics.js";
import { createPolicyServices } from "./policy.js";
import { buildRuntime, type BuiltRuntime, type RuntimeHooks } from "./runtime.js";
import { watchWorkerControl } from "./workers.js";
import { watchFleetScale } from "./fleet.js";
import { createReloader, watchReloadRequests, type ReloadResult } from "./reload.js";

export interface App {
  config: ServerConfig;
  logger: Logger;
  catalog: Catalog;
  env: ToolEnv;
  tools: ToolDefinition<any, any>[];
  runtime: Runtime;
  /** The Ray fleet adding workers to the pool (runtime.ray); absent without one. */
  fleet?: BuiltRuntime["fleet"];
  gate: Gate;
  auth: Authenticator;
  approvals: SqliteApprovalStore;
  audit: SqliteAuditLog;
  jobs: SqliteJobs;
  outputs: MemoryOutputs;
  reports: SqliteReports;
  facts: WorkerModelFacts;
  metrics: Metrics;
  /** What every tool handler gets besides the per-call parts (MCP calls, the console). */
  services: ToolServices;
  /** Approval events (this process and the CLI beside it), for the console and webhooks. */
  approvalFeed: ApprovalFeed;
  notifier: ApprovalNotifier;
  /** Where the operator console is served, once an HTTP server runs (for webhook messages). */
  consoleUrl?: string;
  /** Runtime notices ("worker restarted", "worker failed") for MCP logging in every session. */
  notices: EventEmitter<{ notice: [level: "warning" | "error", data: Record<string, unknown>] }>;
  /** Re-reads the config file and applies what can change at run time (SIGHUP, workers reload). */
  reload(by: string): Promise<ReloadResult>;
  close(): Promise<void>;
}

export function createApp(
  config: ServerConfig,
  logger: Logger,
  opts: {
    runtime?: Runtime;
    hooks?: RuntimeHooks;
    /** Reads and validates the config file again (reload); absent: nothing to reload. */
    loadConfig?: () => ServerConfig;
    /** The config as the file gave it, when `config` adds to it (a generated token). */
    fileConfig?: ServerConfig;
  } = {},
): App {
  mkdirSync(config.paths.data_dir, { recursive: true });
  // Before anything starts: a webhook without its secret is a configuration error.
  const notifyTargets = readNotifyTargets(config);
  const catalog = readCatalog(config.paths.catalog);
  const env: ToolEnv = {
    catalog,
    limits: {
      max_texts: config.inference.max_texts,
      inline_max_elements: config.inference.inline_max_elements,
      max_tensor_elements: config.inference.max_tensor_elements,
      benchmark: { ...config.benchmark },
    },
  };
  const rtLog = logger.child({ component: "runtime" });
  // Late-bound: the pool's placement needs model facts, which are read through the runtime.
  let factsRef: WorkerModelFacts | null = null;
  let auditRef: SqliteAuditLog | null = null;
  const built: BuiltRuntime = opts.runtime
    ? { pool: opts.runtime }
    : buildRuntime(config, rtLog, {
        async needBytes(model, dtype) {
          const entry = catalog.models.find((m) => m.id === model);
          const fact = await factsRef?.get(model).catch(() => undefined);
          if (!entry || !fact?.parameters) return null;
          return memoryFor(fact.parameters, dtype ?? entry.default_dtype, 1);
        },
        onRefused(r) {
          rtLog.warn(r, "remote worker refused or unreachable");
          // Refusals that say something about trust (certificate, token) go to the audit trail.
          if (r.reason === "tls" || r.reason === "unauthorized")
            auditRef?.append({
              time: new Date().toISOString(),
              principal: "control-plane",
              tool: "worker.connect",
              args_digest: null,
              args: { worker: r.worker, address: r.address },
              outcome: "denied",
              code: r.reason === "tls" ? "worker_tls_refused" : "worker_token_refused",
              reason: r.message,
            });
        },
        ...opts.hooks,
      });
  const { pool: runtime, fleet } = built;
  const metrics = new Metrics();
  const notices: App["notices"] = new EventEmitter();
  notices.setMaxListeners(0); // one listener per open session
  runtime.on("restart", (info) => {
    metrics.workerRestarts.inc();
    const msg = "worker restarted; loaded models were lost and must be loaded again";
    rtLog.warn(info, msg);
    notices.emit("notice", "warning", { message: msg, ...info });
  });
  runtime.on("failed", (info) => {
    rtLog.error(info, "worker failed; run `tpu-mcp doctor`");
    notices.emit("notice", "error", {
      message: "the worker cannot be started; run `tpu-mcp doctor`",
      ...info,
    });
  });

  const policy = createPolicyServices(config, logger);
  const { gate, approvals, audit } = policy;
  const auth = new Authenticator(config.policy);
  const jobs = new SqliteJobs(join(config.paths.data_dir, "jobs.db"), {
    onError: (err) => logger.error({ err }, "job failed unexpectedly"),
  });
  const reports = new SqliteReports(join(config.paths.data_dir, "reports.db"));
  const outputs = new MemoryOutputs(config.inference.outputs_max_bytes);
  const facts = new WorkerModelFacts(runtime);
  factsRef = facts;
  auditRef = audit;
  metrics.observeWorkers(runtime, fleet?.state);
  const control = watchWorkerControl(config, runtime, rtLog);
  const fleetScale = watchFleetScale(config, fleet?.fleet, rtLog);
  const reloader = createReloader(
    opts.fileConfig ?? config,
    opts.loadConfig,
    fleet?.fleet,
    logger.child({ component: "reload" }),
  );
  const reloadRequests = watchReloadRequests(config, reloader, logger);
  const tools = buildTools(env);

  const approvalFeed = new ApprovalFeed(approvals, {
    onError: (e) => logger.warn({ err: String(e) }, "approval feed poll failed"),
  });
  const notifyLog = logger.child({ component: "notify" });
  const notifier = new ApprovalNotifier({
    targets: notifyTargets,
    logger: notifyLog,
    onOutcome: (outcome) => metrics.webhookDeliveries.inc({ outcome }),
    onAttemptFailed: () => metrics.webhookAttemptFailures.inc(),
    consoleUrl: () => app.consoleUrl,
  });
  const stopNotify = notifier.enabled
    ? approvalFeed.on((e) => notifier.notify(e.type, e.record))
    : () => {};

  const app: App = {
    config,
    logger,
    catalog,
    env,
    tools,
    runtime,
    fleet,
    gate,
    auth,
    approvals,
    audit,
    jobs,
    outputs,
    reports,
    facts,
    metrics,
    services: {
      runtime,
      ...(fleet ? { fleet: fleet.state } : {}),
      jobs,
      outputs,
      reports,
      facts,
      env,
      logger,
    },
    approvalFeed,
    notifier,
    notices,
    reload: (by) => reloader.reload(by),
    async close() {
      stopNotify();
      approvalFeed.close();
      notifier.close();
      control.close();
      fleetScale.close();
      reloadRequests.close();
      jobs.close();
      await runtime.close();
      reports.close();
      policy.close();
    },
  };
  return app;
}

/** Webhook targets with their secrets read now, so a missing secret stops the start-up. */
function readNotifyTargets(config: ServerConfig): NotifyTarget[] {
  return config.policy.approvals.notify.map((n, i) => {
    const file = resolve(config.paths.config_dir, n.secret_file);
    let secret: Buffer;
    try {
      secret = Buffer.from(readFileSync(file, "utf8").trim(), "utf8");
    } catch (e) {
      throw new ConfigError("(config)", [
        `policy.approvals.notify.${i}.secret_file: cannot read ${file} (${(e as NodeJS.ErrnoException).code ?? e})`,
      ]);
    }
    if (secret.length < 16) {
      throw new ConfigError("(config)", [
        `policy.approvals.notify.${i}.secret_file: the secret in ${file} is shorter than 16 bytes; use \`tpu-mcp token new\` to make one`,
      ]);
    }
    return { url: n.url, secret, events: n.events };
  });
}
