import { describe, expect, it } from "vitest";
import {
  canCall,
  parseScopes,
  requiredScope,
  visibleTools,
  type Principal,
} from "../../policies/scopes.js";

const p = (...scopes: Principal["scopes"]): Principal => ({ id: "p", scopes, via: "token" });
// Plain records, as the server hands them down: scopes are read from them, never from a name.
const reader = { policy: { scope: "models:read" as const }, name: "read_a" };
const loader = { policy: { scope: "models:load" as const }, name: "load_a" };
const jobs = { policy: { scope: "jobs:read" as const }, name: "job_a" };
const all = [reader, loader, jobs];

describe("scopes", () => {
  it("needs the scope a tool's record names", () => {
    expect(requiredScope(loader.policy)).toBe("models:load");
    expect(canCall(p("models:load"), loader.policy)).toBe(true);
    expect(canCall(p("models:read"), loader.policy)).toBe(false);
  });

  it("closes tools without a record behind admin", () => {
    expect(requiredScope(undefined)).toBe("admin");
    expect(canCall(p("models:read", "models:load"), undefined)).toBe(false);
    expect(canCall(p("admin"), undefined)).toBe(true);
  });

  it("treats admin as every scope", () => {
    for (const t of all) expect(canCall(p("admin"), t.policy)).toBe(true);
  });

  it("does not let approvals:grant call any tool", () => {
    expect(visibleTools(p("approvals:grant"), all)).toEqual([]);
  });

  it("lists only visible tools, keeping order", () => {
    expect(visibleTools(p("models:read", "jobs:read"), all)).toEqual([reader, jobs]);
  });

  it("parses scope claims as space-separated strings or arrays, dropping unknown scopes", () => {
    expect(parseScopes("models:read  inference:run bogus")).toEqual([
      "models:read",
      "inference:run",
    ]);
    expect(parseScopes(["admin", 3, "nope"])).toEqual(["admin"]);
    expect(parseScopes(undefined)).toEqual([]);
  });
});
