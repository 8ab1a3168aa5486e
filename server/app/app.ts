// Composition root: builds every long-lived service once (runtime, stores, gate, tools) from a
// validated config. Transports (stdio, HTTP) ask it for one MCP server per session.
import { EventEmitter } from "node:events";
import { readFileSync } from "node:fs";
import { basename, join, resolve } from "node:path";
import type { Logger } from "pino";
import type { ApprovalQueue } from "../../policies/approval_record.js";
import type { AuditTrail } from "../../policies/audit.js";
import type { LeftBehind } from "../../policies/gate/reconcile.js";
import { Authenticator } from "../../policies/auth.js";
import { clientFormRules, clientFormText } from "../../policies/gate/answers.js";
import type { Gate } from "../../policies/gate/gate.js";
import { ApprovalNotifier, type NotifyTarget } from "../../policies/notify.js";
import { Alerts } from "../../policies/alerts/alerts.js";
import { AuditSink } from "../../policies/audit_sink.js";
import { fileSinkTarget, httpSinkTarget } from "../../policies/audit_sink_targets.js";
import { readCatalog, type Catalog } from "../../runtime/catalog.js";
import { memoryFor } from "../../policies/estimate.js";
import type { Runtime } from "../../runtime/types.js";
import { buildTools } from "../../tools/registry.js";
import { inBandOnly } from "../../tools/support/approvable.js";
import { inertSettings } from "../config/inert.js";
import { WorkerModelFacts } from "../../tools/stores/facts.js";
import type { Jobs } from "../../tools/stores/jobs.js";
import type { Outputs } from "../../tools/stores/outputs.js";
import type { Reports } from "../../tools/stores/reports.js";
import type { ToolDefinition, ToolEnv, ToolServices } from "../../tools/types.js";
import { ApprovalFeed } from "./approval_feed.js";
import { ConfigError, type ServerConfig } from "../config/config.js";
import { checkSecretFile } from "../config/data_dir.js";
import { watchLapsed } from "./lapsed_calls.js";
import { CloseHooks } from "./close_hooks.js";
import { Metrics } from "./metrics.js";
import { startTelemetry, telemetryMeter } from "./telemetry.js";
import { approveCommand, createPolicyServices, publicConsoleUrl } from "./build_policies.js";
import type { Passkeys } from "../../policies/passkeys/store.js";
import { openServerStores, type SharedBackend, type Storage } from "./storage.js";
import { sharedFleetStore } from "./postgres/fleet.js";
import { KeptModels } from "../../tools/stores/kept.js";
import { toToolError } from "../../tools/errors.js";
import { buildRuntime, type BuiltRuntime, type RuntimeHooks } from "./build_runtime.js";
import { replicaIdentity, replicaStatus, type ReplicaIdentity } from "./replica.js";
import { watchControl, type ControlHandler } from "../control/channel.js";
import { drainHandler } from "../control/drain.js";
import { fleetHandler } from "../control/fleet.js";
import { createReloader, reloadHandler, type ReloadResult } from "../control/reload.js";
import type { SetupWatch } from "../setup/background.js";

/** The tool services (runtime, stores, env, logger) live here once; toolServices() projects them. */
export interface App extends ToolServices {
  config: ServerConfig;
  logger: Logger;
  catalog: Catalog;
  env: ToolEnv;
  tools: ToolDefinition<any, any>[];
  runtime: Runtime;
  /** The Ray fleet adding workers to the pool (runtime.ray); absent without one. */
  ray?: BuiltRuntime["fleet"];
  /** An installed package's set-up, while the server waits for it; absent from a clone. */
  setupWatch?: SetupWatch;
  gate: Gate;
  auth: Authenticator;
  /** Every store and shared counter, from the config's `storage` (server/app/storage.ts). */
  storage: Storage;
  /** Which replica this process is (server/app/replica.ts). */
  identity: ReplicaIdentity;
  approvals: ApprovalQueue;
  audit: AuditTrail;
  /** Operators' passkeys, for the console's WebAuthn ceremonies. */
  passkeys: Passkeys;
  jobs: Jobs;
  outputs: Outputs;
  reports: Reports;
  facts: WorkerModelFacts;
  metrics: Metrics;
  /** Approval events (this process and the CLI beside it), for the console and webhooks. */
  approvalFeed: ApprovalFeed;
  notifier: ApprovalNotifier;
  /** The alert rules at work (policy.alerts): the console lists what fired. */
  alerts: Alerts;
  /** The streaming audit sink (policy.audit.sink); absent when none is configured. */
  auditSink?: AuditSink;
  /** Where the operator console is served, once an HTTP server runs (for webhook messages). */
  consoleUrl?: string;
  /** Runtime notices ("worker restarted", "worker failed") for MCP logging in every session, and
   *  `tools_changed` when a reload rebuilt the tools (a grown catalog). */
  notices: EventEmitter<{
    notice: [level: "warning" | "error", data: Record<string, unknown>];
    tools_changed: [];
  }>;
  /** Re-reads the config file and applies what can change at run time (SIGHUP, workers reload). */
  reload(by: string): Promise<ReloadResult>;
  /** Registers a close hook (fastify's onClose): hooks run last-registered first. */
  onClose(name: string, fn: () => unknown): void;
  /** Runs every close hook; each runs even when one before it failed. */
  close(): Promise<void>;
  /**
   * Resolves once the server may accept calls: what a killed server left running is settled
   * (reconcile.ts). The transports wait for it; it never rejects (a failure is logged).
   */
  ready: Promise<void>;
}

export async function createApp(
  config: ServerConfig,
  logger: Logger,
  opts: {
    runtime?: Runtime;
    hooks?: RuntimeHooks;
    /** Reads and validates the config file again (reload); absent: nothing to reload. */
    loadConfig?: () => ServerConfig;
    /** The config as the file gave it, when `config` adds to it (a generated token). */
    fileConfig?: ServerConfig;
    /** An installed package's set-up in progress: the worker waits for it (server/setup/). */
    setup?: SetupWatch;
    /** Which replica this is (the HTTP command knows its port); default: no fixed address. */
    replica?: ReplicaIdentity;
    /** The Postgres backend, opened before (storage.ts openSharedBackend); the caller closes it. */
    shared?: SharedBackend | null;
  } = {},
): Promise<App> {
  const replica = opts.replica ?? replicaIdentity(config, null);
  // Before anything starts: a webhook without its secret is a configuration error.
  const notifyTargets = readNotifyTargets(config);
  const alertTargets = readAlertTargets(config);
  const catalog = readCatalog(config.paths.catalog);
  // A catalog of one's own replaces the built-in one (no merge): said at start, so a missing
  // built-in model is not a surprise later.
  if (basename(config.paths.catalog) !== "catalog.builtin.json")
    logger.warn(
      `the catalog ${config.paths.catalog} replaces the built-in one: only its ${catalog.models.length} model(s) are served (${catalog.models.map((m) => m.id).join(", ")}); copy entries of runtime/catalog.builtin.json into it to keep built-in ones`,
    );
  const env: ToolEnv = {
    catalog,
    limits: {
      max_texts: config.inference.max_texts,
      inline_max_elements: config.inference.inline_max_elements,
      max_tensor_elements: config.inference.max_tensor_elements,
      prefix_cache_shared: config.inference.prefix_cache_shared,
      benchmark: { ...config.benchmark },
    },
    ...(config.policy.pricing ? { pricing: config.policy.pricing } : {}),
  };
  // Each resource registers its close where it is opened; close() runs them last-opened first,
  // so the stores a call in flight writes to (audit, reports) outlive the runtime.
  const hooks = new CloseHooks(logger);
  // First opened, last closed: the spans of everything closing are flushed.
  hooks.add("telemetry", startTelemetry(config.telemetry, logger));

  // Late-bound: the gate tells the alert rules what it counts; they act through the gate.
  const alertsRef: { current?: Alerts } = {};
  const metricsRef: { current?: Metrics } = {};
  const policy = await createPolicyServices(config, logger, {
    shared: opts.shared ?? null,
    // Late-bound: the HTTP server learns its address after the app is built.
    consoleUrl: () => publicConsoleUrl(config.http.resource_url) ?? app.consoleUrl,
    observer: {
      refused: (principal, code) => alertsRef.current?.refused(principal, code),
      charged: (principal) => alertsRef.current?.charged(principal),
    },
  });
  hooks.add("policy stores", () => policy.close());
  const { gate, approvals, audit } = policy;
  const auditSink = startAuditSink(config, audit, logger);
  if (auditSink) {
    const off = audit.onAppended((records) => auditSink.offer(records));
    hooks.add("audit sink", async () => {
      off();
      await auditSink.close();
    });
  }
  const alertLog = logger.child({ component: "alerts" });
  const alerts = new Alerts({
    rules: config.policy.alerts.rules,
    store: policy.alertStore,
    logger: alertLog,
    suspend: (s) => gate.suspendPrincipal(s),
    audit: (rec) => {
      const lost = (e: unknown) =>
        alertLog.error({ err: String(e), audit: rec }, "audit append failed");
      try {
        audit.append({ time: new Date().toISOString(), ...rec }).catch(lost);
      } catch (e) {
        lost(e);
      }
    },
    budgetUse: (principal) => policy.budget.check(principal, 0),
    pendingApprovals: () => approvals.list({ status: "pending", limit: 500 }),
    webhooks: alertTargets,
    checkIntervalMs: config.policy.alerts.check_interval_s * 1000,
    // Late-bound: the metrics are made after the alert rules.
    onFired: (a) => metricsRef.current?.alertsFired.inc({ rule: a.rule, action: a.action }),
    onWebhook: (outcome) => metricsRef.current?.alertWebhookDeliveries.inc({ outcome }),
  });
  alertsRef.current = alerts;
  hooks.add("alerts", () => alerts.close());
  // Before the server accepts a call: the calls a killed server left running are settled.
  const ready = reconcileAtStart(gate, policy.calls, logger);
  // On a shared store: the calls of a replica that died and stays gone, once their lease lapses.
  const { lapsed, leaseMs } = policy.calls;
  if (lapsed && leaseMs) {
    const stop = watchLapsed(gate, { lapsed: () => lapsed.call(policy.calls), leaseMs }, logger);
    hooks.add("lapsed calls", stop);
  }
  if (config.policy.approvals.rules.length === 0)
    logger.warn(
      'approvals are OFF: the config gives "policy": {"approvals": {"rules": []}}, so every call (benchmarks, large loads) runs without asking a human. Remove that line to get the default rules back (docs/policies-and-approvals.md).',
    );
  const clientForm = clientFormRules(config.policy.approvals);
  if (clientForm.length > 0) logger.warn(clientFormText(clientForm));
  let served: Awaited<ReturnType<typeof openServerStores>>;
  try {
    served = await openServerStores(config, logger, opts.shared ?? null);
  } catch (e) {
    // Nothing serves yet: what was opened (the policy stores, the alerts) closes before the refusal.
    await hooks.run().catch(() => {});
    throw e;
  }
  const { reports, jobs, outputs, channel } = served;
  // Closed where they always were: reports after the runtime (a call in flight writes its
  // measurement), jobs and the channel before it (a running job is aborted, not failed).
  hooks.add("reports", () => reports.close());
  const storage: Storage = {
    ...policy,
    ...served,
    async close() {
      await served.close();
      await policy.close();
    },
  };

  const rtLog = logger.child({ component: "runtime" });
  // Late-bound: the pool's placement needs model facts, which are read through the runtime.
  let factsRef: WorkerModelFacts | null = null;
  const built: BuiltRuntime = opts.runtime
    ? { pool: opts.runtime }
    : buildRuntime(config, rtLog, {
        async needBytes(model, dtype) {
          const entry = catalog.models.find((m) => m.id === model);
          const fact = await factsRef?.get(model).catch(() => undefined);
          if (!entry || !fact?.parameters) return null;
          const d = dtype ?? entry.default_dtype;
          // The worker's own pre-flight where it gave one: the figure its load checks.
          return fact.memory_bytes?.[d] ?? memoryFor(fact.parameters, d, 1);
        },
        onRefused(r) {
          rtLog.warn(r, "remote worker refused or unreachable");
          // Refusals that say something about trust (certificate, token) go to the audit trail.
          if (r.reason === "tls" || r.reason === "unauthorized")
            void audit
              .append({
                time: new Date().toISOString(),
                principal: "control-plane",
                tool: "worker.connect",
                args_digest: null,
                args: { worker: r.worker, address: r.address },
                outcome: "denied",
                code: r.reason === "tls" ? "worker_tls_refused" : "worker_token_refused",
                reason: r.message,
              })
              .catch((e) => rtLog.error({ err: String(e) }, "audit append failed"));
        },
        onRestore(r) {
          // The control plane's own load of a replaced Ray actor's model: audited as its action,
          // and a model it could not load again is a notice in every session.
          void audit
            .append({
              time: new Date().toISOString(),
              principal: "control-plane",
              tool: "load_model",
              args_digest: null,
              args: { ...r.args, model: r.model, device: r.worker, reason: "worker replaced" },
              outcome: r.outcome === "restored" ? "executed" : "failed",
              worker: r.worker,
              ...(r.code ? { code: r.code } : {}),
              ...(r.message ? { reason: r.message } : {}),
            })
            .catch((e) => rtLog.error({ err: String(e) }, "audit append failed"));
          if (r.outcome !== "restored")
            notices.emit("notice", "warning", {
              message: `${r.model} was lost on ${r.worker} (its worker was replaced) and not loaded again: ${r.message}; load it again (load_model)`,
              worker: r.worker,
              model: r.model,
            });
        },
        ...(opts.setup ? { prerequisite: () => opts.setup!.blocked() } : {}),
        // On a shared store the replicas share one Ray fleet (server/control/shared_fleet.ts).
        ...(opts.shared && "postgres" in config.storage
          ? {
              sharedFleet: sharedFleetStore(
                opts.shared.pool,
                opts.shared.replica.id,
                config.storage.postgres.fleet_lease_s,
              ),
            }
          : {}),
        ...opts.hooks,
      });
  const { pool: runtime, fleet } = built;
  hooks.add("runtime", () => runtime.close());
  if (opts.setup) {
    const setup = opts.setup;
    hooks.add("set-up watch", () => setup.stop());
    setup.onReady(() => {
      if (config.runtime.start === "eager")
        runtime
          .start()
          .catch((e: unknown) => rtLog.error({ err: String(e) }, "worker start failed"));
    });
    setup.start();
  }
  // Labelled only where there are replicas to tell apart (a shared store): one SQLite server's
  // series are as they always were.
  const metrics = new Metrics(replica.storage === "postgres" ? { replica: replica.id } : {});
  metricsRef.current = metrics;
  // The conventions' series over OTLP too, when telemetry exports metrics.
  const meter = telemetryMeter();
  if (meter) metrics.exportConventionsTo(meter);
  if (auditSink) metrics.observeAuditSink(() => auditSink.status());
  const notices: App["notices"] = new EventEmitter();
  notices.setMaxListeners(0); // one listener per open session
  runtime.on("restart", (info) => {
    metrics.workerRestarts.inc();
    alerts.workerRestarted((info as { worker?: string }).worker ?? "worker");
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

  const auth = new Authenticator(config.policy);
  hooks.add("jobs", () => jobs.close());
  const facts = new WorkerModelFacts(runtime);
  // Kept fine-tunes: expired ones are removed with their files and unloaded where loaded.
  env.kept = new KeptModels(join(config.paths.data_dir, "kept"), config.kept);
  const kept = env.kept;
  const sweep = setInterval(
    () => {
      for (const r of kept.sweep()) {
        facts.invalidate();
        void runtime
          .call("unload", { model: r.id })
          .catch((e) => (toToolError(e).code === "model_not_loaded" ? undefined : e))
          .then(
            (e) =>
              e &&
              logger.warn({ err: String(e), model: r.id }, "expired kept model: unload failed"),
          );
      }
    },
    Math.min(60, config.kept.ttl_s) * 1000,
  );
  sweep.unref();
  hooks.add("kept sweep", () => clearInterval(sweep));
  factsRef = facts;
  metrics.observeWorkers(runtime, fleet?.state);

  // workers.db: `tpu-mcp workers drain|scale|reload` beside this server, one poller for all.
  hooks.add("control channel", () => channel.close());
  const reloader = createReloader(
    opts.fileConfig ?? config,
    opts.loadConfig,
    fleet?.fleet,
    logger.child({ component: "reload" }),
    channel,
    {
      current: () => env.catalog,
      async apply(next) {
        await runtime.call("reload_catalog", {});
        // The published schemas name the catalog's models: rebuilt, so a new one is accepted and
        // listed (every session reads app.tools per request).
        env.catalog = next;
        app.catalog = next;
        app.tools = buildTools(env);
        facts.invalidate();
        notices.emit("tools_changed");
      },
    },
    // The gate's next calls decide under the new approval policy (its version changes with it).
    { apply: (next) => gate.applyApprovals(next) },
  );
  const control = watchControl(
    channel,
    [
      drainHandler(runtime, rtLog),
      fleetHandler(fleet?.fleet, rtLog),
      reloadHandler(channel, reloader, logger),
    ].filter((h): h is ControlHandler => h !== null),
    rtLog,
  );
  hooks.add("control poller", () => control.close());
  // Known now and fixed for the process: the published schemas name only what this runtime has.
  env.deployment = { pool: !runtime.single, fleet: fleet !== undefined, setup: !!opts.setup };
  const tools = buildTools(env);
  const inBand = inBandOnly(config.policy.approvals.rules, tools);
  if (inBand.length)
    logger.warn(
      `approval rules name ${inBand.join(", ")}, which take no approval_id: such a call can be approved only in band, by whoever answers the client's form under a rule of "assurance": "client_form", never from the console or the CLI (under any other rule it never runs). Gate a tool that takes approval_id (docs/policies-and-approvals.md).`,
    );

  for (const note of inertSettings(config)) logger.warn(note);

  const approvalFeed = new ApprovalFeed(approvals, {
    onError: (e) => logger.warn({ err: String(e) }, "approval feed poll failed"),
  });
  hooks.add("approval feed", () => approvalFeed.close());
  const notifier = new ApprovalNotifier({
    targets: notifyTargets,
    logger: logger.child({ component: "notify" }),
    onOutcome: (outcome) => metrics.webhookDeliveries.inc({ outcome }),
    onAttemptFailed: () => metrics.webhookAttemptFailures.inc(),
    // The public address when configured: behind a proxy the bound one is unreachable.
    consoleUrl: () => publicConsoleUrl(config.http.resource_url) ?? app.consoleUrl,
    approveCommand: approveCommand(config),
  });
  hooks.add("notifier", () => notifier.close());
  if (notifier.enabled) {
    const stopNotify = approvalFeed.on((e) => notifier.notify(e.type, e.record));
    hooks.add("notifier subscription", stopNotify);
  }

  const app: App = {
    config,
    logger,
    catalog,
    env,
    tools,
    runtime,
    ...(fleet ? { ray: fleet, fleet: fleet.state } : {}),
    ...(opts.setup ? { setupWatch: opts.setup, setup: () => opts.setup!.progress() } : {}),
    gate,
    auth,
    storage,
    identity: replica,
    approvals,
    audit,
    passkeys: policy.passkeys,
    jobs,
    outputs,
    reports,
    facts,
    metrics,
    approvalFeed,
    notifier,
    alerts,
    ...(auditSink ? { auditSink } : {}),
    notices,
    reload: (by) => reloader.reload(by),
    onClose: (name, fn) => hooks.add(name, fn),
    // The open refusal windows' aggregates first: stopping the workers can take seconds, and a
    // host that kills a slow shutdown (an MCP client ends stdio, then signals) must not lose them.
    close: async () => {
      await audit.flushRefusals().catch((err) => logger.error({ err }, "audit flush failed"));
      await hooks.run();
    },
    ready,
  };
  return app;
}

/**
 * The console's URL under the configured public `http.resource_url` (the MCP endpoint, e.g.
 * `https://tpu.example.com/mcp` → `https://tpu.example.com/console/`; a path prefix is kept).
 */
// Defined beside the policy services (the gate names the console in its refusals).
export { publicConsoleUrl } from "./build_policies.js";

/**
 * Settles what a server killed mid-call left (policies/gate/reconcile.ts). A write that fails
 * (a full disk) is logged and leaves the rows for the next start; the server still starts.
 */
async function reconcileAtStart(gate: Gate, calls: LeftBehind, logger: Logger): Promise<void> {
  try {
    const settled = await gate.reconcileInterrupted(calls);
    if (settled.length > 0)
      logger.warn(
        {
          calls: settled.map((r) => ({
            tool: r.tool,
            principal: r.principal,
            approval_id: r.approval_id,
          })),
        },
        `${settled.length} call(s) were running when the server last stopped: recorded interrupted, charged, their approvals given back (tpu-mcp audit tail)`,
      );
  } catch (e) {
    logger.error(
      { err: String(e) },
      "could not settle the calls the last run left running; retried at the next start",
    );
  }
}

/** What every tool handler gets besides the per-call parts (MCP calls, the console). */
export function toolServices(app: App): ToolServices {
  const { runtime, fleet, setup, jobs, outputs, reports, facts, env, logger } = app;
  return {
    runtime,
    ...(fleet ? { fleet } : {}),
    replica: () =>
      replicaStatus(
        app.identity,
        // The fleet's actors are described by `fleet`; the rest are the replica's own workers.
        runtime.workers().filter((w) => !app.ray?.fleet.owns(w.name)),
        app.ray ? (app.ray.fleet.term ? "shared" : "own") : null,
      ),
    ...(setup ? { setup } : {}),
    jobs,
    outputs,
    reports,
    facts,
    env,
    logger,
  };
}

/** Webhook targets with their secrets read now, so a missing secret stops the start-up. */
function readNotifyTargets(config: ServerConfig): NotifyTarget[] {
  return config.policy.approvals.notify.map((n, i) => ({
    url: n.url,
    secret: readWebhookSecret(config, n.secret_file, `policy.approvals.notify.${i}`),
    events: n.events,
  }));
}

/**
 * The streaming audit sink of policy.audit.sink, started at the trail's head (what came before
 * is `tpu-mcp audit export`'s); a secret file that cannot be read stops the start-up.
 */
function startAuditSink(
  config: ServerConfig,
  audit: App["audit"],
  logger: Logger,
): AuditSink | undefined {
  const c = config.policy.audit.sink;
  if (!c) return undefined;
  const target =
    c.kind === "file"
      ? fileSinkTarget(resolve(config.paths.config_dir, c.path), c.max_bytes, c.keep)
      : httpSinkTarget(c.url, {
          ...(c.secret_file
            ? { secret: readWebhookSecret(config, c.secret_file, "policy.audit.sink") }
            : {}),
        });
  return new AuditSink({
    target,
    logger: logger.child({ component: "audit-sink" }),
    maxQueue: c.max_queue,
    start: audit.exportHead().then((head) => ({ seq: head.seq, export_hash: head.export_hash })),
    readRange: (from, to) => audit.readRange(from, to),
    ...(c.kind === "http"
      ? { batch: c.batch, retryBaseMs: c.retry_base_ms, maxBackoffMs: c.max_backoff_s * 1000 }
      : {}),
  });
}

/** The alert webhooks (policy.alerts.notify), read as the approval ones are. */
function readAlertTargets(config: ServerConfig): { url: string; secret: Buffer }[] {
  return config.policy.alerts.notify.map((n, i) => ({
    url: n.url,
    secret: readWebhookSecret(config, n.secret_file, `policy.alerts.notify.${i}`),
  }));
}

function readWebhookSecret(config: ServerConfig, secretFile: string, where: string): Buffer {
  {
    const file = resolve(config.paths.config_dir, secretFile);
    let secret: Buffer;
    try {
      secret = Buffer.from(readFileSync(file, "utf8").trim(), "utf8");
    } catch (e) {
      throw new ConfigError("(config)", [
        `${where}.secret_file: cannot read ${file} (${(e as NodeJS.ErrnoException).code ?? e})`,
      ]);
    }
    if (secret.length < 16) {
      throw new ConfigError("(config)", [
        `${where}.secret_file: the secret in ${file} is shorter than 16 bytes; use \`tpu-mcp token new\` to make one`,
      ]);
    }
    // Whoever reads it can sign webhooks the receivers trust: owner-only, as ssh wants keys.
    try {
      checkSecretFile(file, "the webhook secret");
    } catch (e) {
      throw new ConfigError("(config)", [`${where}.secret_file: ${(e as Error).message}`]);
    }
    return secret;
  }
}
