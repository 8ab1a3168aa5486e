// Alerts: the rules of `policy.alerts` (docs/policies-and-approvals.md, "Alerts") over what the
// gate already counts — refusals per principal, budget use, approvals left waiting, worker
// restarts. A rule that fires does so once per window and per subject: one log line, one
// record in the alert store (the console lists them), one audit record, one signed webhook per
// target (policies/notify.ts's format, event `alert.fired`), and for a rule of
// `"action": "suspend"` the principal's suspension (the gate refuses it and stops its calls).
// Once per window holds across processes sharing the store: this process's latch stops its own
// repeats, and the store's `add` is the claim (an alert another replica stored in this window is
// not fired again here). Nothing here blocks a call: counting is in memory, the claim and the
// webhooks run in the background (`drain` waits for them).

import { randomUUID } from "node:crypto";
import type { AuditRecord, PolicyLogger } from "../audit.js";
import { systemClock, type Clock } from "../clock.js";
import type { AlertRule } from "../config.js";
import { postSignedWebhook } from "../notify.js";
import { resumeCommand, type Suspension } from "../suspensions.js";
import { EventWindows, FiringLatch } from "./rules.js";
import { latchKey, type AlertRecord, type AlertStore } from "./store.js";

export interface AlertsDeps {
  rules: readonly AlertRule[];
  store: AlertStore;
  logger: PolicyLogger;
  /** Suspends a principal: the gate records it, audits it and stops its running calls. */
  suspend(s: Suspension): Promise<void>;
  audit(rec: Omit<AuditRecord, "time">): void;
  /** The principal's device-seconds in its budget window, and the budget. */
  budgetUse(principal: string): Promise<{ used_s: number; limit_s: number; window_s: number }>;
  /** Approvals waiting for an operator now. */
  pendingApprovals(): Promise<
    { id: string; principal: string; tool: string; created_at: string }[]
  >;
  webhooks: readonly { url: string; secret: Buffer }[];
  clock?: Clock;
  /** How often approval_waiting rules look at the pending approvals; 0: never by itself. */
  checkIntervalMs?: number;
  /** Told of every alert that fired (metrics, the console's feed). */
  onFired?: (a: AlertRecord) => void;
  onWebhook?: (outcome: "delivered" | "failed") => void;
  retryBaseMs?: number;
}

/**
 * Refusals that say nothing of the principal's behaviour are not counted: its own suspension's
 * (counted once already), and the server's capacity and state (busy, a worker starting or gone),
 * which an honest client under load meets by the thousand (the hardening load test: 24 clients
 * for 30 s get about 3,000 `busy` and were suspended for it).
 */
const NOT_COUNTED = new Set([
  "principal_suspended",
  "busy",
  "runtime_setting_up",
  "worker_unavailable",
  "engine_unavailable",
]);

export class Alerts {
  private readonly clock: Clock;
  private readonly latch: FiringLatch;
  /** Per counting rule (refusals, worker_restarts), its windows by subject. */
  private readonly windows = new Map<string, EventWindows>();
  private readonly inFlight = new Set<Promise<unknown>>();
  /** The store's quiet times being read at start: nothing fires before they are known. */
  private seeding: Promise<void> | null;
  private timer?: NodeJS.Timeout;
  private closed = false;

  constructor(private readonly deps: AlertsDeps) {
    this.clock = deps.clock ?? systemClock;
    this.latch = new FiringLatch();
    this.seeding = deps.store.quiet(this.clock()).then(
      (quiet) => this.latch.seed(quiet),
      // Without them the store's claim still refuses an alert fired in its window.
      (e) => deps.logger.error({ err: String(e) }, "alerts: could not read the quiet times"),
    );
    this.track(this.seeding.finally(() => (this.seeding = null)));
    for (const r of deps.rules)
      if (r.kind === "refusals" || r.kind === "worker_restarts")
        this.windows.set(r.name, new EventWindows(r.window_s * 1000));
    const every = deps.checkIntervalMs ?? 0;
    if (every > 0 && deps.rules.some((r) => r.kind === "approval_waiting")) {
      this.timer = setInterval(() => void this.scanApprovals(), every);
      this.timer.unref?.();
    }
  }

  /** A refused call of `principal` (the gate's every refusal, before aggregation). */
  refused(principal: string, code: string): void {
    if (NOT_COUNTED.has(code)) return;
    const now = this.clock();
    for (const r of this.deps.rules) {
      if (r.kind !== "refusals") continue;
      const n = this.windows.get(r.name)!.add(principal, now);
      if (n < r.threshold) continue;
      this.fire(r, principal, principal, now, r.window_s, {
        refusals: n,
        window_s: r.window_s,
        last_code: code,
      });
    }
  }

  /** A charge to `principal`'s budget was made; resolves once its rules were looked at. */
  async charged(principal: string): Promise<void> {
    const rules = this.deps.rules.filter((r) => r.kind === "budget");
    if (rules.length === 0) return;
    let use;
    try {
      use = await this.deps.budgetUse(principal);
    } catch (e) {
      this.deps.logger.warn({ err: String(e) }, "alerts: could not read the budget");
      return;
    }
    if (!(use.limit_s > 0)) return;
    const pct = (use.used_s / use.limit_s) * 100;
    const now = this.clock();
    for (const r of rules)
      if (pct >= r.percent)
        this.fire(r, principal, principal, now, use.window_s, {
          percent_used: Math.round(pct * 10) / 10,
          used_s: use.used_s,
          limit_s: use.limit_s,
          window_s: use.window_s,
        });
  }

  /** A worker restarted (the pool's restart event). */
  workerRestarted(worker: string): void {
    const now = this.clock();
    for (const r of this.deps.rules) {
      if (r.kind !== "worker_restarts") continue;
      const n = this.windows.get(r.name)!.add(worker, now);
      if (n >= r.threshold)
        this.fire(r, worker, null, now, r.window_s, { restarts: n, window_s: r.window_s });
    }
  }

  /** Fires approval_waiting rules for approvals pending longer than their `after_s`. */
  async scanApprovals(): Promise<void> {
    const rules = this.deps.rules.filter((r) => r.kind === "approval_waiting");
    if (rules.length === 0 || this.closed) return;
    let pending;
    try {
      pending = await this.deps.pendingApprovals();
    } catch (e) {
      this.deps.logger.warn({ err: String(e) }, "alerts: could not read pending approvals");
      return;
    }
    const now = this.clock();
    for (const a of pending) {
      const waited = (now - Date.parse(a.created_at)) / 1000;
      for (const r of rules)
        if (waited >= r.after_s)
          // Once per approval: quiet for a day, longer than any approval lives.
          this.fire(r, a.id, a.principal, now, 86_400, {
            approval_id: a.id,
            tool: a.tool,
            waited_s: Math.round(waited),
          });
    }
  }

  recent(limit = 100): Promise<AlertRecord[]> {
    return this.deps.store.recent(limit);
  }

  /** Resolves when every alert fired so far is stored and acted on, and its webhooks delivered or given up. */
  async drain(): Promise<void> {
    while (this.inFlight.size) await Promise.allSettled([...this.inFlight]);
  }

  close(): void {
    this.closed = true;
    if (this.timer) clearInterval(this.timer);
  }

  private fire(
    rule: AlertRule,
    subject: string,
    principal: string | null,
    nowMs: number,
    windowS: number,
    details: Record<string, unknown>,
  ): void {
    if (this.closed) return;
    if (this.seeding) {
      const again = () => this.fire(rule, subject, principal, nowMs, windowS, details);
      this.track(this.seeding.then(again));
      return;
    }
    if (!this.latch.tryFire(latchKey(rule.name, subject), nowMs, nowMs + windowS * 1000)) return;
    const suspend = "action" in rule && rule.action === "suspend" && principal !== null;
    const until =
      suspend && rule.suspend_s > 0 ? new Date(nowMs + rule.suspend_s * 1000).toISOString() : null;
    const alert: AlertRecord = {
      id: randomUUID(),
      rule: rule.name,
      kind: rule.kind,
      subject,
      principal,
      message: messageOf(rule, subject, details, suspend, until),
      fired_at: new Date(nowMs).toISOString(),
      quiet_until: new Date(nowMs + windowS * 1000).toISOString(),
      action: suspend ? "suspend" : "notify",
      details: suspend ? { ...details, suspended_until: until } : details,
    };
    this.track(
      this.claim(alert).then((stored) => {
        if (stored) this.fired(rule, alert, details, until);
      }),
    );
  }

  /**
   * Stores the alert: false when the rule was already quiet for the subject in the store (another
   * process fired it in this window), and this one stays unsaid. A store that fails does not
   * silence the alert.
   */
  private async claim(alert: AlertRecord): Promise<boolean> {
    const log = this.deps.logger;
    try {
      if (await this.deps.store.add(alert)) return true;
      log.info(
        { rule: alert.rule, subject: alert.subject },
        "alert already fired in this window by another process sharing the store",
      );
      return false;
    } catch (e) {
      log.error({ err: String(e), alert }, "alert store write failed");
      return true;
    }
  }

  /** The alert's effects, once it is this process's to fire. */
  private fired(
    rule: AlertRule,
    alert: AlertRecord,
    details: Record<string, unknown>,
    until: string | null,
  ): void {
    const { subject, principal } = alert;
    const suspend = alert.action === "suspend";
    const log = this.deps.logger;
    log.warn({ alert }, `alert ${rule.name}: ${alert.message}`);
    this.deps.audit({
      principal: principal ?? "tpu-mcp",
      tool: "alert",
      args_digest: null,
      args: { rule: rule.name, kind: rule.kind, subject, alert_id: alert.id, ...details },
      outcome: "alert",
      code: rule.kind,
      reason: alert.message,
    });
    if (suspend) {
      // The refusals that led here are spent: after a resume, counting starts from nothing.
      this.windows.get(rule.name)?.reset(principal!);
      const failed = (e: unknown) => log.error({ err: String(e), alert }, "suspension failed");
      try {
        this.deps
          .suspend({
            principal: principal!,
            reason: suspensionReason(rule, details),
            rule: rule.name,
            since: alert.fired_at,
            until,
          })
          .catch(failed);
      } catch (e) {
        failed(e);
      }
    }
    this.deps.onFired?.(alert);
    this.send(alert);
  }

  private track(p: Promise<unknown>): void {
    this.inFlight.add(p);
    void p.finally(() => this.inFlight.delete(p));
  }

  private send(alert: AlertRecord): void {
    const body = JSON.stringify({
      text: `tpu-mcp alert ${alert.rule}: ${alert.message}`,
      event: "alert.fired",
      delivery: randomUUID(),
      alert,
    });
    for (const target of this.deps.webhooks) {
      const p = postSignedWebhook(target, "alert.fired", body, {
        logger: this.deps.logger,
        retryBaseMs: this.deps.retryBaseMs,
        closed: () => this.closed,
        logFields: { alert_id: alert.id, rule: alert.rule },
      }).then((r) => this.deps.onWebhook?.(r.outcome));
      this.track(p);
    }
  }
}

function suspensionReason(rule: AlertRule, d: Record<string, unknown>): string {
  if (rule.kind === "refusals") return `${d.refusals} refused calls within ${d.window_s} s`;
  if (rule.kind === "budget") return `${d.percent_used} % of its device-time budget used`;
  return rule.kind;
}

function messageOf(
  rule: AlertRule,
  subject: string,
  d: Record<string, unknown>,
  suspended: boolean,
  until: string | null,
): string {
  const action = suspended
    ? ` ${subject} is suspended ${until ? `until ${until}` : "until an operator resumes it"} (\`${resumeCommand(subject)}\` lifts it); its running calls were stopped.`
    : "";
  switch (rule.kind) {
    case "refusals":
      return `${subject} had ${d.refusals} refused calls within ${d.window_s} s (the rule's threshold is ${rule.threshold}).${action}`;
    case "budget":
      return `${subject} has used ${d.percent_used} % of its device-time budget (${d.used_s} of ${d.limit_s} s per ${d.window_s} s window).${action}`;
    case "approval_waiting":
      return `approval ${subject} (${d.tool}) has waited ${d.waited_s} s for an operator.`;
    case "worker_restarts":
      return `worker ${subject} restarted ${d.restarts} times within ${d.window_s} s; run \`tpu-mcp doctor\`.`;
  }
}
