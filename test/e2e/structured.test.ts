// Structured output over MCP on the real built-in instruction model, through a real SDK client
// and a real worker, in both protocol eras: answers constrained by a JSON schema validate against
// it (ajv), a choice is one of the choices, a regex answer matches; the same prompts without the
// constraint mostly do not validate (the share is printed); a schema past the bounds is refused
// with response_format_refused. The 50-prompt run is the hardening suite's
// (test/hardening/structured_output.test.ts): this one is the default suite's smaller version.
import type { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connectStdio, errorOf, writeConfig } from "../helpers/server.js";
import { callModern, connectModernStdio } from "../helpers/modern.js";
import { scaled } from "../helpers/calibrate.js";
import {
  CHOICES,
  PATTERN,
  PERSON_TOKENS,
  SMOLLM2,
  choiceMessages,
  generationOf,
  isChoice,
  isPattern,
  isPerson,
  personFormat,
  personMessages,
  regexMessages,
} from "../helpers/structured.js";
import { call } from "./scenario.js";

const config = () =>
  writeConfig({
    policy: {
      approvals: { rules: [] },
      limits: { rate_limit: { per_principal_per_minute: 6000 }, soft_deadline_s: 0 },
    },
  });

type Call = (name: string, args: Record<string, unknown>) => Promise<any>;

const person = (i: number, constrained = true) => ({
  model: SMOLLM2,
  messages: personMessages(i),
  max_new_tokens: PERSON_TOKENS,
  ...(constrained ? { response_format: personFormat } : {}),
});

describe("structured output over stdio (2025-11-25)", () => {
  let client: Client;
  let close: () => Promise<void>;
  const run: Call = (name, args) => call(client, name, args);
  beforeAll(async () => {
    ({ client, close } = await connectStdio(config()));
    const r = await run("load_model", { model: SMOLLM2 });
    expect(r.isError, JSON.stringify(r.content)).toBeFalsy();
  }, scaled(300_000));
  afterAll(async () => {
    await close?.();
  });

  it(
    "answers that validate against the JSON schema, where unconstrained ones mostly do not",
    { timeout: scaled(600_000) },
    async () => {
      const n = 8;
      const ids = [...Array(n).keys()];
      const constrained = await Promise.all(ids.map((i) => run("run_inference", person(i))));
      for (const r of constrained) {
        const g = generationOf(r);
        expect(isPerson(g.text), g.text).toBe(true);
        expect(g).toMatchObject({ finish_reason: "stop", grammar_complete: true });
        expect(r.structuredContent.grammar_compile_ms).toBeGreaterThanOrEqual(0);
      }
      const free = await Promise.all(ids.map((i) => run("run_inference", person(i, false))));
      const invalid = free.filter((r) => !isPerson(generationOf(r).text)).length;
      process.stderr.write(`[structured] unconstrained: ${invalid}/${n} do not validate\n`);
      expect(invalid).toBeGreaterThan(0);
    },
  );

  it(
    "answers one of the choices, and text matching the regex",
    { timeout: scaled(300_000) },
    async () => {
      const choices = await Promise.all(
        [0, 1, 2].map((i) =>
          run("run_inference", {
            model: SMOLLM2,
            messages: choiceMessages(i),
            max_new_tokens: 8,
            response_format: { type: "choice", choices: CHOICES },
          }),
        ),
      );
      for (const r of choices) expect(isChoice(generationOf(r).text)).toBe(true);
      const r = await run("run_inference", {
        model: SMOLLM2,
        messages: regexMessages(0),
        max_new_tokens: 16,
        response_format: { type: "regex", pattern: PATTERN },
      });
      const g = generationOf(r);
      expect(isPattern(g.text), g.text).toBe(true);
      expect(g.grammar_complete).toBe(true);
    },
  );

  it(
    "reports an answer cut off inside its JSON as incomplete, never as valid",
    { timeout: scaled(120_000) },
    async () => {
      const g = generationOf(await run("run_inference", { ...person(0), max_new_tokens: 5 }));
      expect(g).toMatchObject({ finish_reason: "length", grammar_complete: false });
      expect(isPerson(g.text)).toBe(false);
    },
  );

  it("refuses a schema past the bounds with response_format_refused, saying what to change", async () => {
    let deep: Record<string, unknown> = { type: "string" };
    for (let i = 0; i < 20; i++) deep = { type: "object", properties: { a: deep } };
    const r = await run("run_inference", {
      ...person(0),
      response_format: { type: "json_schema", schema: deep },
    });
    expect(errorOf(r)).toMatchObject({ code: "response_format_refused" });
    expect(JSON.stringify(r.content)).toMatch(/nests deeper than 16 levels: flatten it/);
    const shape = await run("run_inference", {
      ...person(0),
      response_format: { type: "regex" },
    });
    expect(errorOf(shape)).toMatchObject({ code: "invalid_argument" });
    expect(JSON.stringify(shape.content)).toMatch(/type regex needs pattern/);
  });
});

describe("structured output over stdio (2026-07-28)", () => {
  it("constrains the same way in the stateless era", { timeout: scaled(600_000) }, async () => {
    const { client, close } = await connectModernStdio(config());
    try {
      const run: Call = (name, args) => callModern(client, name, args);
      const load = await run("load_model", { model: SMOLLM2 });
      expect(load.isError, JSON.stringify(load.content)).toBeFalsy();
      const rs = await Promise.all([0, 1, 2, 3].map((i) => run("run_inference", person(i))));
      for (const r of rs) expect(isPerson(generationOf(r).text)).toBe(true);
      const c = await run("run_inference", {
        model: SMOLLM2,
        messages: choiceMessages(1),
        max_new_tokens: 8,
        response_format: { type: "choice", choices: CHOICES },
      });
      expect(isChoice(generationOf(c).text)).toBe(true);
      const x = await run("run_inference", {
        model: SMOLLM2,
        messages: regexMessages(1),
        max_new_tokens: 16,
        response_format: { type: "regex", pattern: PATTERN },
      });
      expect(isPattern(generationOf(x).text)).toBe(true);
    } finally {
      await close();
    }
  });
});
