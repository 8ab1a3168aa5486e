// Scopes, and what a tool needs: its own record says (policies/tool_policy.ts). A tool without a
// record needs `admin`, so a new tool is closed by default until someone decides who may call it.
import type { ToolPolicy } from "./tool_policy.js";

/** What the stdio principal holds unless the config names its scopes: all but the operator's. */
export const DEFAULT_STDIO_SCOPES = [
  "models:read",
  "models:load",
  "models:unload",
  "inference:run",
  "benchmark:run",
  "jobs:read",
] as const;

export const SCOPES = [
  ...DEFAULT_STDIO_SCOPES,
  "approvals:grant",
  "metrics:read",
  "admin",
] as const;
export type Scope = (typeof SCOPES)[number];

export interface Principal {
  /** A static token's id as configured; a JWT's is `jwt:<sub>` (policies/auth.ts), never the same. */
  id: string;
  scopes: readonly Scope[];
  via: "token" | "jwt" | "stdio" | "passkey";
}

export function isScope(s: string): s is Scope {
  return (SCOPES as readonly string[]).includes(s);
}

/** The scope a tool needs; a tool nobody described (no record) needs `admin`. */
export function requiredScope(tool: Pick<ToolPolicy, "scope"> | undefined): Scope {
  return tool ? tool.scope : "admin";
}

export function hasScope(principal: Pick<Principal, "scopes">, scope: Scope): boolean {
  return principal.scopes.includes("admin") || principal.scopes.includes(scope);
}

export function canCall(
  principal: Pick<Principal, "scopes">,
  tool: Pick<ToolPolicy, "scope"> | undefined,
): boolean {
  return hasScope(principal, requiredScope(tool));
}

/** Tools the principal may see (tools/list): the others are not listed at all. Order is kept. */
export function visibleTools<T extends { policy: Pick<ToolPolicy, "scope"> }>(
  principal: Pick<Principal, "scopes">,
  allTools: readonly T[],
): T[] {
  return allTools.filter((t) => canCall(principal, t.policy));
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
