// Which approval rules can only be met in band: a rule on a tool whose input takes no
// `approval_id` can be answered by the person at the client (elicitation, input_required), but an
// approval decided out of band (console, CLI, webhook) has no way back into that tool's call.
import type { ToolDefinition } from "../types.js";

/** Does the tool accept `approval_id` (the out-of-band approval's way back into the call)? */
export function takesApprovalId(tool: ToolDefinition<any, any>): boolean {
  const shape = (tool.input as { shape?: Record<string, unknown> }).shape;
  return !!shape && Object.hasOwn(shape, "approval_id");
}

/** The tools named by a rule (or matched by "*") that cannot take an out-of-band approval. */
export function inBandOnly(
  rules: readonly { tool: string }[],
  tools: readonly ToolDefinition<any, any>[],
): string[] {
  const named = new Set(rules.map((r) => r.tool));
  // "*" gates every tool; only the named ones are worth a warning (a wildcard is deliberate).
  return tools.filter((t) => named.has(t.name) && !takesApprovalId(t)).map((t) => t.name);
}
