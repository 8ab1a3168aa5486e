// What every admission step and the supervisor share: the gate's dependencies, its budget lines
// and the three ways it writes the audit trail.

import type { Alongside, AuditRecord } from "../audit.js";
import { systemClock, type Clock } from "../clock.js";
import type { PolicyConfig } from "../config.js";
import { policyVersion } from "../policy_version.js";
import type { PolicyError } from "../errors.js";
import { toolPolicyMap, type ToolPolicy } from "../tool_policy.js";
import { BudgetLines } from "./budget_lines.js";
import type { ElicitAnswer, GateDeps } from "./types.js";

export interface GateContext {
  readonly deps: GateDeps;
  /** As in effect: a reload may replace its approvals section (Gate.applyApprovals). */
  config: PolicyConfig;
  /** The approvals section's version (policy_version.ts), recorded on every approval requested. */
  policyVersion: string;
  readonly clock: Clock;
  readonly lines: BudgetLines;
  /** Every tool's record by name (scope, run-while-recording, ...); a tool without one needs admin. */
  readonly tools: ReadonlyMap<string, ToolPolicy>;
  /** The stops of the calls running now, by principal (a suspension stops them all). */
  readonly running: Map<string, Set<(err: PolicyError) => void>>;
  /** In-band prompts being shown, by approval id (approval_flow.ts): a retry joins, never re-asks. */
  readonly prompts: Map<string, Promise<ElicitAnswer | "timeout" | "operator" | null>>;
  /**
   * Appends a decision's record; losing it is logged loudly, never thrown: the decision stands.
   * Not awaited: the store chains records in call order, so the trail's order is the gate's.
   */
  audit(rec: Omit<AuditRecord, "time">): void;
  /**
   * Appends a refusal, or counts it into the aggregate of the refusals it repeats (the rule is in
   * audit_refusals.ts); never throws, like `audit`.
   */
  auditRefusal(rec: Omit<AuditRecord, "time">): void;
  /**
   * Appends and waits for the commit (group commit when the store offers it); may throw.
   * `alongside` is written in the same transaction where the store offers it (else just before).
   */
  auditDurable(rec: AuditRecord, alongside?: Alongside): Promise<void>;
}

export function gateContext(deps: GateDeps): GateContext {
  const clock = deps.clock ?? systemClock;
  const tools = toolPolicyMap(deps.tools);
  return {
    deps,
    config: deps.config,
    policyVersion: policyVersion(deps.config.approvals),
    clock,
    tools,
    prompts: new Map(),
    running: new Map(),
    lines: new BudgetLines(deps.config.limits, deps.budget, clock, tools, deps.config.pricing),
    audit(rec) {
      const lost = (e: unknown) =>
        deps.logger.error({ err: String(e), audit: rec }, "audit append failed");
      try {
        deps.audit.append({ time: new Date(clock()).toISOString(), ...rec }).catch(lost);
      } catch (e) {
        lost(e);
      }
    },
    auditRefusal(rec) {
      const a = deps.audit;
      const lost = (e: unknown) =>
        deps.logger.error({ err: String(e), audit: rec }, "audit append failed");
      try {
        const full = { time: new Date(clock()).toISOString(), ...rec };
        (a.appendRefusal ? a.appendRefusal(full) : a.append(full)).catch(lost);
      } catch (e) {
        lost(e);
      }
      if (rec.outcome === "denied" && rec.code) deps.observer?.refused(rec.principal, rec.code);
    },
    async auditDurable(rec, alongside) {
      const a = deps.audit;
      if (a.appendDurable) await a.appendDurable(rec, alongside);
      else {
        await alongside?.();
        await a.append(rec);
      }
    },
  };
}
