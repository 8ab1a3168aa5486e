// Scopes and the tool → scope table. A tool missing from the table needs `admin`, so a new tool
// is closed by default until someone decides who may call it.

export const SCOPES = [
  "models:read",
  "models:load",
  "models:unload",
  "inference:run",
  "benchmark:run",
  "jobs:read",
  "approvals:grant",
  "metrics:read",
  "admin",
] as const;
export type Scope = (typeof SCOPES)[number];

export const TOOL_SCOPES = {
  get_runtime_status: "models:read",
  list_models: "models:read",
  check_model: "models:read",
  load_model: "models:load",
  unload_model: "models:unload",
  run_inference: "inference:run",
  run_benchmark: "benchmark:run",
  get_job: "jobs:read",
  cancel_job: "jobs:read",
} as const satisfies Record<string, Scope>;

export type ToolName = keyof typeof TOOL_SCOPES;
export const TOOL_NAMES = Object.keys(TOOL_SCOPES) as ToolName[];

export interface Principal {
  /** A static token's id as configured; a JWT's is `jwt:<sub>` (policies/auth.ts), never the same. */
  id: string;
  scopes: readonly Scope[];
  via: "token" | "jwt" | "stdio";
}

export function isScope(s: string): s is Scope {
  return (SCOPES as readonly string[]).includes(s);
}

export function isKnownTool(tool: string): tool is ToolName {
  return Object.prototype.hasOwnProperty.call(TOOL_SCOPES, tool);
}

export function requiredScope(tool: string): Scope {
  return isKnownTool(tool) ? TOOL_SCOPES[tool] : "admin";
}

export function hasScope(principal: Pick<Principal, "scopes">, scope: Scope): boolean {
  return principal.scopes.includes("admin") || principal.scopes.includes(scope);
}

export function canCall(principal: Pick<Principal, "scopes">, tool: string): boolean {
  return hasScope(principal, requiredScope(tool));
}

/** Tools the principal may see (tools/list): the others are not listed at all. Order is kept. */
export function visibleTools<T extends string | { name: string }>(
  principal: Pick<Principal, "scopes">,
  allTools: readonly T[],
): T[] {
  return allTools.filter((t) => canCall(principal, typeof t === "string" ? t : t.name));
}

/** Known scopes from a claim value (space-separated string or array); unknown ones are dropped. */
export function parseScopes(value: unknown): Scope[] {
  const parts =
    typeof value === "string"
      ? value.split(/\s+/)
      : Array.isArray(value)
        ? value.filter((v): v is string => typeof v === "string")
        : [];
  return [...new Set(parts.filter(isScope))];
}
