// An approval as the gate and the operator see it: its record, the store's contract, its id,
// the operator's command, and the one rule for whether an approval may be used for a call
// (approvalUsableError). No SQLite here: the store (approvals.ts) and the gate both read these.

import { randomBytes } from "node:crypto";
import { PolicyError } from "./errors.js";
import type { CostEstimate } from "./estimate.js";

/** What a decision on an approval must prove, weakest first (the rule's `assurance`). */
export type ApprovalAssurance = "client_form" | "token" | "passkey";

export type ApprovalStatus = "pending" | "approved" | "denied" | "used" | "expired";

export interface ApprovalRecord {
  id: string;
  principal: string;
  tool: string;
  args_digest: string;
  /** Redacted arguments, for the operator deciding. */
  args_preview: unknown;
  estimate: CostEstimate | null;
  /**
   * What a decision must prove: "client_form" (the answer to the client's form counts too),
   * "token" (any operator token) or "passkey" (a signed decision).
   */
  assurance: ApprovalAssurance;
  status: ApprovalStatus;
  created_at: string;
  /** Pending: decide before this. Approved: use before this (the TTL restarts on approval). */
  expires_at: string;
  decided_by: string | null;
  decided_at: string | null;
  reason: string | null;
  used_at: string | null;
  /**
   * The approval policy's version when it was requested (policy_version.ts); null for one
   * recorded before versions were. Used under another version it does not count.
   */
  policy_version: string | null;
  /** The rule that asked for it, in words (what the approver is shown); null before rules were kept. */
  rule: string | null;
}

export interface CreateApprovalRequest {
  principal: string;
  tool: string;
  args_digest: string;
  args_preview: unknown;
  estimate?: CostEstimate | null;
  /** From the rule that asked for the approval; default "token". */
  assurance?: ApprovalAssurance;
  /** The approval policy's version now (policy_version.ts). */
  policy_version?: string;
  /** The rule that asked for it, in words. */
  rule?: string;
  ttl_s: number;
  /**
   * The most pending approvals this principal may hold; a request over it is refused with
   * `approval_limit` (the older ones stay: what an operator may be reading never vanishes).
   */
  max_pending?: number;
}

/** One page of approvals, and how many there are in all under the same filter. */
export interface ApprovalPage {
  items: ApprovalRecord[];
  /** Pending (undecided, unexpired) approvals in the whole store, not just this page. */
  pending_total: number;
  /** Everything else (approved, denied, used, expired) still kept. */
  history_total: number;
  offset: number;
  limit: number;
}

export interface ApprovalListFilter {
  status?: ApprovalStatus;
  limit?: number;
  offset?: number;
}

/** What happened to an approval in this process (the console and webhooks listen). */
export interface ApprovalEvent {
  type: "created" | "decided" | "used";
  record: ApprovalRecord;
}
export type ApprovalListener = (event: ApprovalEvent) => void;

/**
 * The approvals' store. Every method that reads or writes returns a promise (a shared store
 * answers over the network); SQLite answers inside the call and resolves at once. The atomic
 * steps are each ONE method, so a shared store makes each one transaction (or one conditional
 * UPDATE): `create` (with its max_pending check), `approve` / `deny` (decided once: only a pending,
 * unexpired approval is decided; every other caller gets approval_already_decided) and `consume`
 * (used once). Calls one process makes are applied in call order.
 */
export interface ApprovalStore {
  create(req: CreateApprovalRequest): Promise<ApprovalRecord>;
  get(id: string): Promise<ApprovalRecord | undefined>;
  /** Pending first (soonest to expire first), then the rest, newest first; one page of it. */
  list(filter?: ApprovalListFilter): Promise<ApprovalRecord[]>;
  /**
   * A pending or approved, unexpired approval for exactly this call, so retries do not pile up
   * requests; with `policyVersion`, only one requested under that version (or before versions).
   */
  findOpen(
    principal: string,
    tool: string,
    digest: string,
    policyVersion?: string,
  ): Promise<ApprovalRecord | undefined>;
  /** Decides a pending approval once (atomic); throws a PolicyError otherwise. */
  approve(id: string, approver: string): Promise<ApprovalRecord>;
  /** Decides a pending approval once (atomic); throws a PolicyError otherwise. */
  deny(id: string, approver: string, reason?: string): Promise<ApprovalRecord>;
  /** Throws the error consume would throw, without using the approval up. */
  check(id: string, principal: string, tool: string, digest: string): Promise<ApprovalRecord>;
  /** Atomically marks a matching approved approval used; throws a PolicyError otherwise. */
  consume(id: string, principal: string, tool: string, digest: string): Promise<ApprovalRecord>;
  /** Calls `fn` after every change this store makes; returns the unsubscribe function (in memory). */
  subscribe?(fn: ApprovalListener): () => void;
  /** Makes a used approval usable again after its call was interrupted (SqliteApprovalQueue). */
  restoreUsed?(
    id: string,
    principal: string,
    tool: string,
    digest: string,
  ): Promise<ApprovalRecord | undefined>;
  close(): void | Promise<void>;
}

/**
 * The approvals store as the server, its console and the CLI use it (shared across replicas: an
 * approval requested through one is listed, decided and consumed through any other). A decision
 * and a use each happen once, however many callers race for them.
 */
export interface ApprovalQueue extends ApprovalStore {
  /** One page of list(): its items and the cursor of the next page. */
  page(filter?: ApprovalListFilter): Promise<ApprovalPage>;
  /** Changes when any approval was created, decided or used (also by another process); cheap, sync. */
  changeMark(): string;
  subscribe(fn: ApprovalListener): () => void;
  restoreUsed(
    id: string,
    principal: string,
    tool: string,
    digest: string,
  ): Promise<ApprovalRecord | undefined>;
  /** Deletes approvals over for longer than the configured keep; how many went. */
  prune(): Promise<number>;
}

/** 'apr_' + 128 random bits in hex: unguessable, and safe in a shell command line. */
export function newApprovalId(): string {
  return `apr_${randomBytes(16).toString("hex")}`;
}

/**
 * The operator's command for an approval, as run from the tpu-mcp folder of a clone (the
 * `tpu-mcp` bin is not on its PATH). The server passes its own, with `--config`.
 */
export type ApproveCommand = (id: string) => string;
export const defaultApproveCommand: ApproveCommand = (id) =>
  `node bin/tpu-mcp.js approvals approve ${id}`;

/** The console's page for one approval (its hash route); undefined while no console URL is known. */
export function approvalUrl(consoleUrl: string | undefined, id: string): string | undefined {
  return consoleUrl ? `${consoleUrl.replace(/\/?$/, "/")}#/approvals/${id}` : undefined;
}

/**
 * The usability check shared by check() and consume(). Mismatch comes before status so an id
 * presented for another call says nothing about that other call's state.
 */
export function approvalUsableError(
  rec: ApprovalRecord | undefined,
  id: string,
  principal: string,
  tool: string,
  digest: string,
): PolicyError | null {
  // Another principal's approval is indistinguishable from a missing one: ids are not a way to
  // learn what others asked for.
  if (!rec || rec.principal !== principal) {
    return new PolicyError(
      "approval_not_found",
      `No approval ${id} exists. Call ${tool} again without approval_id to request one.`,
      { approval_id: id },
    );
  }
  if (rec.tool !== tool || rec.args_digest !== digest) {
    const what = rec.tool !== tool ? "tool" : "arguments";
    return new PolicyError(
      "approval_mismatch",
      `Approval ${id} was granted for a different ${what}; it covers only the exact call it was requested for. Call again with the original arguments, or without approval_id to request a new approval.`,
      { approval_id: id, mismatch: what },
    );
  }
  switch (rec.status) {
    case "approved":
      return null;
    case "pending":
      return new PolicyError(
        "approval_pending",
        `Approval ${id} is still pending. Ask an operator to approve it (in the console, or with the command given when it was requested), then retry.`,
        { approval_id: id, expires_at: rec.expires_at },
      );
    case "denied":
      return new PolicyError(
        "approval_denied",
        `Approval ${id} was denied by ${rec.decided_by}${rec.reason ? `: ${rec.reason}` : ""}. Do not retry this call unchanged.`,
        { approval_id: id, reason: rec.reason },
      );
    case "used":
      return new PolicyError(
        "approval_used",
        `Approval ${id} was already used; approvals are single-use. Call again without approval_id to request a new one.`,
        { approval_id: id, used_at: rec.used_at },
      );
    case "expired":
      return new PolicyError(
        "approval_expired",
        `Approval ${id} expired at ${rec.expires_at}. Call again without approval_id to request a new one.`,
        { approval_id: id, expires_at: rec.expires_at },
      );
  }
}
