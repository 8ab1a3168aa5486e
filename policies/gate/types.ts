// What the gate is handed (a call, its dependencies) and what it hands down (the call's deadline).

import type { ApprovalStore, ApproveCommand } from "../approval_record.js";
import type { AuditLog, PolicyLogger } from "../audit.js";
import type { Clock } from "../clock.js";
import type { PolicyConfig } from "../config.js";
import type { CostEstimate } from "../estimate.js";
import type { BudgetLedger } from "../limits/budget.js";
import type { CallsInFlight } from "../calls_in_flight.js";
import type { ConcurrencyLimiter } from "../limits/concurrency.js";
import type { RateLimit } from "../limits/rate.js";
import type { RequestStateSealer } from "../request_state.js";
import type { Principal } from "../scopes.js";
import type { SuspensionStore } from "../suspensions.js";
import type { ToolPolicy } from "../tool_policy.js";

/** The deadline of one admitted call, handed down to the runtime as its request timeout. */
export interface CallDeadline {
  /** Epoch ms at which the gate stops the call (its tool's timeout). */
  at: number;
  /** Until the gate gives up waiting for a stopped call's own answer (`at` + its stop grace). */
  remainingMs(): number;
}

export type ElicitAnswer = "accept" | "decline" | "cancel";

/** The one-field form an approval prompt asks the person to fill (an elicitation requestedSchema). */
export type ApprovalForm = {
  [k: string]: unknown;
  type: "object";
  properties: { approve: { type: "boolean"; title: string; description: string } };
  required: string[];
};

export interface ElicitPrompt {
  tool: string;
  args_preview: unknown;
  estimate: CostEstimate | null;
  message: string;
  /** What the client shows to take the answer (answers.ts builds it beside the message). */
  form: ApprovalForm;
}

/**
 * What a call that needs the user's approval answers in the 2026-07-28 era instead of running:
 * the question and a requestState sealed to this principal, call and approval, which the client
 * echoes with the answer. The gate returns it (it is not a refusal); the server turns it into
 * the protocol's input_required result. A class, so that no handler's result can pass for one.
 */
export class InputRequired {
  readonly kind = "input_required";
  constructor(
    readonly approvalId: string,
    readonly prompt: ElicitPrompt,
    readonly state: string,
    readonly expiresAt: string,
  ) {}
}

/**
 * Sends one approval prompt to the client and resolves with the user's answer. The transport
 * only sends: the gate decides whether to ask and times the answer, and aborts `signal` when it
 * stops waiting (timeout, caller cancelled), which must cancel the request on the wire.
 */
export type Elicit = (prompt: ElicitPrompt, signal: AbortSignal) => Promise<ElicitAnswer>;

/**
 * In the 2026-07-28 era the server cannot push a question: the call answers input_required with a
 * sealed requestState, and the client's retry carries the state back with the user's answer.
 */
export interface InBandApproval {
  /** The client declared it can answer a form (its elicitation capability, per request). */
  canAsk: boolean;
  /** The retry's echoed requestState: attacker-controlled until opened by the sealer. */
  state?: unknown;
  /** The user's answer carried by the retry, when it carried one. */
  answer?: ElicitAnswer;
}

export interface GateCall {
  principal: Principal;
  tool: string;
  /** Validated tool arguments, including the optional approval_id. */
  args: Record<string, unknown>;
  /** Target device ("tpu", "cuda:1", "cpu"); device-bound tools take its lane. */
  device?: string;
  estimate?: CostEstimate;
  /**
   * Makes the estimate once the caller is admitted (scope, rate); used when `estimate` is absent.
   * Handed the call's `signal` (a job's own once a job adopted the call, not the request's).
   */
  estimator?: (signal?: AbortSignal) => Promise<CostEstimate | undefined>;
  /** The device kind (cpu, cuda, tpu) the estimate priced, once it is made: what `pricing` reads. */
  deviceKind?: () => string | undefined;
  signal?: AbortSignal;
  /** Present only when the client can show an elicitation form (the 2025 era's push). */
  elicit?: Elicit;
  /** The 2026-07-28 era's in-band approval (input_required rounds); absent in the 2025 era. */
  inBand?: InBandApproval;
  /** Where the call ran (the worker of a pool), read when its outcome is audited. */
  ranOn?: () => string | undefined;
  /** The call's trace (tools/support/trace.ts); absent unless tracing. */
  trace?: GateTrace;
}

/** What the gate does with a call's trace: stamps, a span per waiting step, ids to audit. */
export interface GateTrace {
  mark(stage: string): void;
  child(name: string): { end(errorType?: string): void };
  ids(): { trace_id: string; span_id: string } | undefined;
}

/** The trace and span ids an audit record names, so an auditor finds the call's trace. */
export function traceIds(call: Pick<GateCall, "trace">): { trace_id?: string; span_id?: string } {
  return call.trace?.ids() ?? {};
}

/** Told what the gate counts, for the alert rules (policies/alerts/); never blocks a call. */
export interface GateObserver {
  /** Every refusal, before repeats are aggregated in the audit trail. */
  refused(principal: string, code: string): void;
  /** A call's device time was charged to `principal`'s budget (never awaited). */
  charged(principal: string): void | Promise<void>;
}

/** Request-state nonces, consumed once: true the first time one is presented, false on a replay. */
export interface ConsumedStates {
  consume(nonce: string): Promise<boolean>;
}

export interface GateDeps {
  config: PolicyConfig;
  /** Every tool's record (scope, run-while-recording, ...); a tool without one needs admin. */
  tools: readonly ToolPolicy[];
  approvals: ApprovalStore;
  audit: AuditLog;
  limiter: ConcurrencyLimiter;
  rateLimiter: RateLimit;
  budget: BudgetLedger;
  /** Where admitted calls are kept until charged, so a restart can settle them (reconcile.ts). */
  calls?: CallsInFlight;
  clock?: Clock;
  logger: PolicyLogger;
  /** Seals the in-band approval's requestState (2026-07-28 era); without it nothing is asked in band. */
  requestStates?: RequestStateSealer;
  /**
   * Each sealed state's nonce consumed once, wherever it is presented (a shared store across
   * replicas). Absent (SQLite): single use comes from the approval's decide-once alone.
   */
  consumedStates?: ConsumedStates;
  /** The command an operator runs to approve; defaults to defaultApproveCommand. */
  approveCommand?: ApproveCommand;
  /** Suspended principals (refused principal_suspended); absent: nobody is ever suspended. */
  suspensions?: SuspensionStore;
  observer?: GateObserver;
  /** Where operators decide in a browser, once known (approval_required names it). */
  consoleUrl?: () => string | undefined;
  /**
   * While no console URL is known (over stdio): the command that serves a console on the same
   * data, and its address when fixed. Absent: approval_required names no console.
   */
  consoleStart?: { command: string; url?: string };
}
