import { describe, expect, it } from "vitest";
import {
  canCall,
  parseScopes,
  requiredScope,
  TOOL_NAMES,
  visibleTools,
  type Principal,
} from "../../policies/scopes.js";

const p = (...scopes: Principal["scopes"]): Principal => ({ id: "p", scopes, via: "token" });

describe("scopes", () => {
  it("maps every tool to its scope", () => {
    expect(requiredScope("get_runtime_status")).toBe("models:read");
    expect(requiredScope("list_models")).toBe("models:read");
    expect(requiredScope("check_model")).toBe("models:read");
    expect(requiredScope("load_model")).toBe("models:load");
    expect(requiredScope("unload_model")).toBe("models:unload");
    expect(requiredScope("run_inference")).toBe("inference:run");
    expect(requiredScope("run_benchmark")).toBe("benchmark:run");
    expect(requiredScope("get_job")).toBe("jobs:read");
    expect(requiredScope("cancel_job")).toBe("jobs:read");
  });

  it("closes unknown tools behind admin", () => {
    expect(requiredScope("drop_database")).toBe("admin");
    expect(canCall(p("models:read", "models:load"), "drop_database")).toBe(false);
    expect(canCall(p("admin"), "drop_database")).toBe(true);
  });

  it("lets a principal call only what its scopes allow", () => {
    const reader = p("models:read");
    expect(canCall(reader, "list_models")).toBe(true);
    expect(canCall(reader, "load_model")).toBe(false);
    expect(canCall(reader, "run_inference")).toBe(false);
  });

  it("treats admin as every scope", () => {
    for (const t of TOOL_NAMES) expect(canCall(p("admin"), t)).toBe(true);
  });

  it("does not let approvals:grant call any tool", () => {
    expect(visibleTools(p("approvals:grant"), TOOL_NAMES)).toEqual([]);
  });

  it("lists only visible tools, keeping order", () => {
    expect(visibleTools(p("models:read", "jobs:read"), TOOL_NAMES)).toEqual([
      "get_runtime_status",
      "list_models",
      "check_model",
      "get_job",
      "cancel_job",
    ]);
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
