// Approval through MCP form elicitation, for clients that support it: only an explicit accept
// runs the call.
import { ElicitRequestSchema } from "@modelcontextprotocol/sdk/types.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connectStdio, errorOf, writeConfig } from "../helpers/server.js";
import { call } from "./scenario.js";

describe("approval by elicitation", () => {
  let conn: Awaited<ReturnType<typeof connectStdio>>;
  let answer: { action: "accept" | "decline" | "cancel"; content?: Record<string, unknown> };
  const prompts: any[] = [];
  beforeAll(async () => {
    const config = writeConfig({
      policy: {
        approvals: { rules: [{ tool: "load_model" }], elicitation: true },
        limits: { rate_limit: { per_principal_per_minute: 6000 } },
      },
    });
    conn = await connectStdio(config, { capabilities: { elicitation: { form: {} } } });
    conn.client.setRequestHandler(ElicitRequestSchema, async (req) => {
      prompts.push(req.params);
      return answer;
    });
  });
  afterAll(async () => {
    await conn?.close();
  });

  it("runs the call when the user accepts, showing the tool, arguments and estimate", async () => {
    answer = { action: "accept", content: { approve: true } };
    const r = await call(conn.client, "load_model", { model: "mnist-cnn" });
    expect(r.isError, JSON.stringify(r)).toBeFalsy();
    const p = prompts.at(-1);
    expect(p.message).toMatch(/load_model/);
    expect(JSON.stringify(p.requestedSchema)).toMatch(/mnist-cnn/);
    await call(conn.client, "unload_model", { model: "mnist-cnn" });
  });

  it("does not run it when the user declines, cancels, or accepts without ticking approve", async () => {
    for (const a of [
      { action: "decline" as const },
      { action: "cancel" as const },
      { action: "accept" as const, content: { approve: false } },
    ]) {
      answer = a;
      const r = await call(conn.client, "load_model", { model: "mnist-cnn" });
      expect(errorOf(r)?.code, JSON.stringify(a)).toBe("approval_declined");
    }
    const st = await call(conn.client, "get_runtime_status", {});
    expect(st.structuredContent.loaded.map((m: any) => m.model)).not.toContain("mnist-cnn");
  });
});
