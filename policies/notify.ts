// Approval webhooks (`policy.approvals.notify`): one signed POST per approval requested or
// decided, sent in the background with retries. Delivery never delays or fails the tool call
// that caused it: notify() only queues, and every failure ends in a log line and a counter.
//
// Signature: HMAC-SHA256 with the target's secret over `${timestamp}.${body}`, hex, sent as
//   x-tpu-mcp-timestamp: <unix seconds>
//   x-tpu-mcp-signature: v1=<hex>
// Receivers recompute it over the raw body, compare in constant time, and refuse a timestamp
// more than WEBHOOK_TOLERANCE_S away from their clock (replay window). `x-tpu-mcp-delivery`
// is the same on every retry of one notification, so receivers can drop duplicates.

import { createHmac, randomUUID, timingSafeEqual } from "node:crypto";
import {
  approvalUrl,
  defaultApproveCommand,
  type ApprovalRecord,
  type ApproveCommand,
} from "./approval_record.js";
import type { PolicyLogger } from "./audit.js";
import { formatBytes } from "../lib/units.js";
import { extensionNote } from "./estimate.js";
import { costNote } from "./limits/pricing.js";

export const WEBHOOK_TOLERANCE_S = 300;
export type NotifyEventKind = "requested" | "decided";
export type WebhookEvent = "approval.requested" | "approval.approved" | "approval.denied";

export interface NotifyTarget {
  url: string;
  secret: Buffer;
  events: readonly NotifyEventKind[];
}

export interface NotifyOptions {
  targets: readonly NotifyTarget[];
  logger: PolicyLogger;
  /** Called once per notification and target when it is finally delivered or given up on. */
  onOutcome?: (outcome: "delivered" | "failed", attempts: number) => void;
  /** Called for each attempt that failed (and will be retried or given up). */
  onAttemptFailed?: () => void;
  maxAttempts?: number;
  /** First retry after this; each next one waits twice as long. */
  retryBaseMs?: number;
  attemptTimeoutMs?: number;
  /** The console URL to put in the message, once an HTTP server knows it. */
  consoleUrl?: () => string | undefined;
  /** The command an operator runs to approve; defaults to defaultApproveCommand. */
  approveCommand?: ApproveCommand;
}

export function signWebhook(secret: Buffer | string, timestamp: string, body: string): string {
  return createHmac("sha256", secret).update(`${timestamp}.${body}`, "utf8").digest("hex");
}

/** The receiver's check, exported for tests and for receivers written in TypeScript. */
export function verifyWebhook(
  secret: Buffer | string,
  headers: { timestamp?: string | null; signature?: string | null },
  body: string,
  opts: { nowS?: number; toleranceS?: number } = {},
): { ok: true } | { ok: false; reason: string } {
  const ts = headers.timestamp ?? "";
  if (!/^\d{1,12}$/.test(ts)) return { ok: false, reason: "missing or malformed timestamp" };
  const now = opts.nowS ?? Math.floor(Date.now() / 1000);
  if (Math.abs(now - Number(ts)) > (opts.toleranceS ?? WEBHOOK_TOLERANCE_S))
    return { ok: false, reason: "timestamp outside the replay window" };
  const m = /^v1=([0-9a-f]{64})$/.exec(headers.signature ?? "");
  if (!m) return { ok: false, reason: "missing or malformed signature" };
  const want = Buffer.from(signWebhook(secret, ts, body), "hex");
  if (!timingSafeEqual(want, Buffer.from(m[1], "hex")))
    return { ok: false, reason: "signature does not match" };
  return { ok: true };
}

function estimateText(r: ApprovalRecord): string {
  const e = r.estimate;
  if (!e) return "no estimate";
  return `~${e.device_seconds} device-s${costNote(e)}${extensionNote(e)}, ${formatBytes(e.memory_bytes)} memory${e.compile_s ? `, ${e.compile_s} s compile` : ""}`;
}

/** Slack's mrkdwn treats <, > and & specially; names and reasons come from callers. */
const slackEscape = (s: string) =>
  s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");

export function webhookText(
  event: WebhookEvent,
  r: ApprovalRecord,
  consoleUrl?: string,
  approveCommand: ApproveCommand = defaultApproveCommand,
): string {
  const who = slackEscape(r.principal);
  const url = approvalUrl(consoleUrl, r.id);
  const link = url ? ` Decide in the console: <${url}|${url}>` : "";
  if (event === "approval.requested") {
    // A passkey rule is decided in the console only: the CLI command would be refused.
    const how =
      r.assurance === "passkey"
        ? "Needs a passkey: approve it in the console, not with the CLI."
        : `Approve with \`${approveCommand(r.id)}\`.`;
    return (
      `Approval requested: ${who} wants to call \`${r.tool}\` (${estimateText(r)}). ` +
      `Expires ${r.expires_at}. ${how}${link}`
    );
  }
  const verb = event === "approval.approved" ? "approved" : "denied";
  const reason = r.reason ? `: ${slackEscape(r.reason)}` : "";
  return `Approval ${r.id} for ${who} → \`${r.tool}\` was ${verb} by ${slackEscape(r.decided_by ?? "?")}${reason}.`;
}

export function webhookEventFor(type: string, r: ApprovalRecord): WebhookEvent | null {
  if (type === "created") return "approval.requested";
  if (type !== "decided") return null;
  if (r.status === "denied") return "approval.denied";
  // Approved, and maybe already used or expired by the time a poll saw the decision.
  return r.decided_by ? "approval.approved" : null;
}

export interface SignedPostOptions {
  logger: PolicyLogger;
  onAttemptFailed?: () => void;
  maxAttempts?: number;
  retryBaseMs?: number;
  attemptTimeoutMs?: number;
  /** True once the sender is closing: no retry is started then. */
  closed?: () => boolean;
  /** Added to the log lines (the approval id, the alert id). */
  logFields?: Record<string, unknown>;
}

/**
 * One signed POST of `body` (the signature and headers above), retried with exponential backoff
 * on network errors, timeouts, 5xx, 408 and 429; a receiver's other refusals are final. Every
 * failure is logged; never throws.
 */
export async function postSignedWebhook(
  target: { url: string; secret: Buffer },
  event: string,
  body: string,
  opts: SignedPostOptions,
): Promise<{ outcome: "delivered" | "failed"; attempts: number }> {
  const delivery = (JSON.parse(body) as { delivery?: string }).delivery ?? randomUUID();
  const max = opts.maxAttempts ?? 5;
  const base = opts.retryBaseMs ?? 1000;
  const log = opts.logger;
  let last = "";
  let attempts = 0;
  for (let attempt = 1; attempt <= max; attempt++) {
    if (opts.closed?.() && attempt > 1) break;
    attempts = attempt;
    const ts = String(Math.floor(Date.now() / 1000));
    let retryable = true;
    try {
      const res = await fetch(target.url, {
        method: "POST",
        headers: {
          "content-type": "application/json",
          "user-agent": "tpu-mcp-webhook/0.1",
          "x-tpu-mcp-event": event,
          "x-tpu-mcp-delivery": delivery,
          "x-tpu-mcp-timestamp": ts,
          "x-tpu-mcp-signature": `v1=${signWebhook(target.secret, ts, body)}`,
        },
        body,
        redirect: "error",
        signal: AbortSignal.timeout(opts.attemptTimeoutMs ?? 10_000),
      });
      await res.arrayBuffer().catch(() => {});
      if (res.ok) return { outcome: "delivered", attempts: attempt };
      last = `HTTP ${res.status}`;
      // A receiver that refuses the request (bad signature, gone) will refuse it again.
      retryable = res.status >= 500 || res.status === 429 || res.status === 408;
    } catch (e) {
      last = (e as Error).name === "TimeoutError" ? "timed out" : String((e as Error).message);
    }
    opts.onAttemptFailed?.();
    if (!retryable || attempt === max) break;
    const wait = base * 2 ** (attempt - 1);
    log.warn(
      { url: target.url, event, ...opts.logFields, attempt, error: last, retry_in_ms: wait },
      "webhook delivery failed; retrying",
    );
    await sleep(wait);
  }
  log.error(
    { url: target.url, event, ...opts.logFields, error: last },
    "webhook delivery failed; giving up",
  );
  return { outcome: "failed", attempts };
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms).unref?.());

export class ApprovalNotifier {
  private readonly inFlight = new Set<Promise<void>>();
  private closed = false;

  constructor(private readonly opts: NotifyOptions) {}

  get enabled(): boolean {
    return this.opts.targets.length > 0;
  }

  /** Queues one POST per interested target; returns at once. */
  notify(type: "created" | "decided" | string, record: ApprovalRecord): void {
    if (this.closed) return;
    const event = webhookEventFor(type, record);
    if (!event) return;
    const kind: NotifyEventKind = event === "approval.requested" ? "requested" : "decided";
    for (const target of this.opts.targets) {
      if (!target.events.includes(kind)) continue;
      const p = this.deliver(target, event, record).catch((e) =>
        this.opts.logger.error({ err: String(e), url: target.url }, "webhook delivery crashed"),
      );
      this.inFlight.add(p);
      void p.finally(() => this.inFlight.delete(p));
    }
  }

  /** Resolves when every queued delivery has finished (delivered or given up). */
  async drain(): Promise<void> {
    while (this.inFlight.size) await Promise.allSettled([...this.inFlight]);
  }

  close(): void {
    this.closed = true;
  }

  private async deliver(target: NotifyTarget, event: WebhookEvent, r: ApprovalRecord) {
    const consoleUrl = this.opts.consoleUrl?.();
    const delivery = randomUUID();
    const body = JSON.stringify({
      text: webhookText(event, r, consoleUrl, this.opts.approveCommand),
      event,
      delivery,
      approval: r,
      // What a decision must prove ("token" or "passkey"), and where to make it.
      assurance: r.assurance,
      ...(consoleUrl
        ? { console_url: consoleUrl, approval_url: approvalUrl(consoleUrl, r.id) }
        : {}),
    });
    const { outcome, attempts } = await postSignedWebhook(target, event, body, {
      ...this.opts,
      closed: () => this.closed,
      logFields: { approval_id: r.id },
    });
    this.opts.onOutcome?.(outcome, attempts);
  }
}
