// Tool calls from the built-in model (issue 46 item 2) through a real SDK client, the real server
// and a real worker running SmolLM2: with `tools`, every call the model returns parses and
// validates against its function's schema (ajv), ends `tool_calls` with an id and its arguments
// as an object; `required` always calls, a named choice calls that function, `none` never does;
// a tool message carries a call's result back into the conversation; bad tools and choices are
// refused with what to change. The whole set's accuracy is the bench's (bench/tool_calls.ts).
import type { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { scaled } from "../helpers/calibrate.js";
import { connectStdio, errorOf, writeConfig } from "../helpers/server.js";
import { SMOLLM2 } from "../helpers/structured.js";
import { TOOLS, callValid, toolMessages, toolRequests } from "../helpers/tool_calls.js";
import { call } from "./scenario.js";

const MAX_NEW = 96;
const SUBSET = toolRequests().filter((r) => ["w1", "t2"].includes(r.id));

describe("tool calls from SmolLM2 over MCP", () => {
  let client: Client;
  let close: () => Promise<void>;
  const infer = async (args: Record<string, unknown>) => {
    const r = await call(client, "run_inference", {
      model: SMOLLM2,
      max_new_tokens: MAX_NEW,
      ...args,
    });
    expect(r.isError, JSON.stringify(r.content).slice(0, 600)).toBeFalsy();
    return (r.structuredContent as any).generations[0];
  };
  beforeAll(async () => {
    const config = writeConfig({
      policy: {
        approvals: { rules: [] },
        limits: { rate_limit: { per_principal_per_minute: 6000 }, soft_deadline_s: 0 },
      },
    });
    ({ client, close } = await connectStdio(config));
    const r = await call(client, "load_model", { model: SMOLLM2 });
    expect(r.isError, JSON.stringify(r.content)).toBeFalsy();
  }, scaled(300_000));
  afterAll(async () => {
    await close?.();
  });

  it(
    "returns calls that parse and validate, required and named always calling",
    { timeout: scaled(600_000) },
    async () => {
      for (const req of SUBSET) {
        for (const choice of [
          "required",
          { type: "function", function: { name: req.expected.name } },
        ]) {
          const g = await infer({ messages: toolMessages(req), tools: TOOLS, tool_choice: choice });
          const why = `${req.id} ${JSON.stringify(choice)}: ${JSON.stringify(g)}`;
          expect(g.finish_reason, why).toBe("tool_calls");
          expect(g.tool_calls.length, why).toBeGreaterThanOrEqual(1);
          for (const c of g.tool_calls) {
            expect(c.id, why).toMatch(/^call_[0-9a-f]{24}$/);
            expect(typeof c.arguments, why).toBe("object");
            expect(callValid(c), why).toBe(true);
            if (typeof choice === "object") expect(c.name, why).toBe(req.expected.name);
          }
        }
      }
    },
  );

  it(
    "auto: a call that validates, or text; none: text only",
    { timeout: scaled(300_000) },
    async () => {
      const req = SUBSET[0]!;
      const auto = await infer({ messages: toolMessages(req), tools: TOOLS });
      if (auto.finish_reason === "tool_calls") expect(auto.tool_calls.every(callValid)).toBe(true);
      else expect(auto.tool_calls).toBeUndefined();
      const none = await infer({ messages: toolMessages(req), tools: TOOLS, tool_choice: "none" });
      expect(none.tool_calls).toBeUndefined();
      expect(none.finish_reason).not.toBe("tool_calls");
    },
  );

  it("carries a tool result back: the answer reads it", { timeout: scaled(300_000) }, async () => {
    const g = await infer({
      messages: [
        { role: "user", content: "What's the weather in Paris in celsius?" },
        {
          role: "assistant",
          content: "",
          tool_calls: [
            { id: "call_1", name: "get_weather", arguments: { city: "Paris", unit: "celsius" } },
          ],
        },
        { role: "tool", tool_call_id: "call_1", content: '{"temperature": 18, "sky": "sunny"}' },
      ],
      tools: TOOLS,
      tool_choice: "none",
    });
    expect(g.text).toMatch(/18|sunny/i);
  });

  it("refuses bad tools and choices, saying what to change", async () => {
    const base = { model: SMOLLM2, messages: toolMessages(SUBSET[0]!) };
    const cases: [Record<string, unknown>, RegExp][] = [
      [{ tool_choice: "required" }, /tool_choice: give tools/],
      [
        { tools: TOOLS, tool_choice: { type: "function", function: { name: "nope" } } },
        /tool_choice: nope is not among tools/,
      ],
      [{ tools: [TOOLS[0], TOOLS[0]] }, /given twice/],
      [
        { tools: TOOLS, response_format: { type: "json_object" } },
        /tools and response_format both constrain/,
      ],
      [{ tools: [{ type: "function", function: { name: "bad name!" } }] }, /tools/],
      [
        { messages: [{ role: "tool", tool_call_id: "x", content: "1" }] },
        /tool_call_id: x is no call of an earlier assistant message/,
      ],
    ];
    for (const [args, want] of cases) {
      const r = await call(client, "run_inference", { ...base, ...args });
      expect(errorOf(r)?.code, JSON.stringify(args)).toBe("invalid_argument");
      expect(errorOf(r)?.message, JSON.stringify(args)).toMatch(want);
    }
    const texts = await call(client, "run_inference", {
      model: SMOLLM2,
      texts: ["hi"],
      tools: TOOLS,
    });
    expect(errorOf(texts)?.message).toMatch(/tools: the model calls functions in a chat/);
  });
});
