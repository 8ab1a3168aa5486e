// Structured output at full size and under attack, on the real built-in instruction model through
// a real SDK client and a real worker:
// - 50 prompts with a JSON schema of five fields (nested object, enum, array, integer bounds)
//   return 50 answers that parse and validate (ajv), in both protocol eras; the same with a
//   choice and a regex; without the constraint the share that does not validate is printed;
// - hostile response_formats (deeply nested, huge enums, oversized, pathological regexes) are
//   refused with response_format_refused or bounded (they end, saying whether they completed
//   their grammar), while the worker answers other calls meanwhile.
import type { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connectStdio, errorOf, writeConfig } from "../helpers/server.js";
import { callModern, connectModernStdio } from "../helpers/modern.js";
import { scaled, slowdown } from "../helpers/calibrate.js";
import {
  CHOICES,
  PERSON_TOKENS,
  SMOLLM2,
  choiceMessages,
  expectChoicesAndPatterns,
  generationOf,
  inWaves,
  isChoice,
  isPerson,
  personFormat,
  personMessages,
  regexMessages,
} from "../helpers/structured.js";
import { call } from "../e2e/scenario.js";

const PROMPTS = 50;
/** The model's decode batch (its catalog batching.max_batch). */
const WAVE = 8;

const config = () =>
  writeConfig({
    policy: {
      approvals: { rules: [] },
      limits: {
        rate_limit: { per_principal_per_minute: 6000 },
        soft_deadline_s: 0,
        // Not about budgets: eight generations at once are each charged their wall time, and
        // on a loaded machine the 2 × 150 answers spent the default hour (3,600 s) midway.
        budget: { device_seconds_per_window: Math.round(3600 * slowdown()) },
      },
    },
  });

type Run = (args: Record<string, unknown>) => Promise<any>;

/** The 50-prompt runs of one era: JSON schema, then without it, then choice and regex. */
async function fiftyOfEach(run: Run, era: string) {
  const asked = (i: number) => ({ messages: personMessages(i), max_new_tokens: PERSON_TOKENS });
  const json = await inWaves(PROMPTS, WAVE, (i) =>
    run({ ...asked(i), response_format: personFormat }),
  );
  const bad = json.map(generationOf).filter((g) => !isPerson(g.text) || !g.grammar_complete);
  expect(bad, JSON.stringify(bad.slice(0, 2))).toEqual([]);
  // Without the constraint, a sample of the same prompts (each runs to max_new_tokens: slow).
  const sample = 16;
  const free = await inWaves(sample, WAVE, (i) => run(asked(i)));
  const invalid = free.filter((r) => !isPerson(generationOf(r).text)).length;
  process.stderr.write(`[structured ${era}] unconstrained: ${invalid}/${sample} do not validate\n`);
  expect(invalid).toBeGreaterThan(0);
  await expectChoicesAndPatterns(run, PROMPTS, WAVE);
}

function nested(levels: number): Record<string, unknown> {
  let node: Record<string, unknown> = { type: "string" };
  for (let i = 0; i < levels; i++)
    node = { type: "object", properties: { a: node }, required: ["a"] };
  return node;
}

/** Refused before anything compiles. */
const REFUSED: Array<[string, Record<string, unknown>]> = [
  ["a schema nested 200 levels deep", { type: "json_schema", schema: nested(200) }],
  [
    "an enum of 100,000 values",
    { type: "json_schema", schema: { enum: [...Array(100_000).keys()].map(String) } },
  ],
  [
    "a schema of 60 KB",
    {
      type: "json_schema",
      schema: {
        type: "object",
        properties: Object.fromEntries(
          [...Array(2000).keys()].map((i) => [`field_${i}`, { type: "integer" }]),
        ),
      },
    },
  ],
  ["1,000 choices", { type: "choice", choices: [...Array(1000).keys()].map((i) => `c${i}`) }],
  [
    "an unsupported format",
    { type: "json_schema", schema: { type: "string", format: "credit-card" } },
  ],
];
/** Admitted, and bounded by llguidance's limits while they decode. */
const PATHOLOGICAL = ["(a|b)*a(a|b){900}", "(x+x+)+y", "(.*a){20}", "((a|b|c|d){30}){30}"];

describe("structured output, 50 prompts, over stdio (2025-11-25)", () => {
  let client: Client;
  let close: () => Promise<void>;
  const run: Run = (args) => call(client, "run_inference", { model: SMOLLM2, ...args });
  beforeAll(async () => {
    ({ client, close } = await connectStdio(config()));
    const r = await call(client, "load_model", { model: SMOLLM2 });
    expect(r.isError, JSON.stringify(r.content)).toBeFalsy();
  }, scaled(300_000));
  afterAll(async () => {
    await close?.();
  });

  it(
    `${PROMPTS} answers validate against the schema; choice and regex likewise`,
    { timeout: scaled(1_800_000) },
    async () => {
      await fiftyOfEach(run, "2025-11-25");
    },
  );

  it(
    "refuses or bounds hostile response_formats while the worker answers other calls",
    { timeout: scaled(600_000) },
    async () => {
      // Plain generations run the whole time: each must be answered while the hostile calls go on.
      const plain = [0, 1, 2].map((i) => run({ messages: personMessages(i), max_new_tokens: 48 }));
      const refused = await Promise.all(
        REFUSED.map(([, fmt]) =>
          run({ messages: personMessages(0), max_new_tokens: 8, response_format: fmt }),
        ),
      );
      refused.forEach((r, i) => {
        expect(errorOf(r)?.code, REFUSED[i]![0]).toBe("response_format_refused");
        expect(JSON.stringify(r.content), REFUSED[i]![0]).toMatch(
          /: (flatten|use fewer|make it smaller|change|remove)/,
        );
      });
      const bounded = await Promise.all(
        PATHOLOGICAL.map((pattern) =>
          run({
            messages: regexMessages(0),
            max_new_tokens: 32,
            response_format: { type: "regex", pattern },
          }),
        ),
      );
      for (const r of bounded) {
        if (r.isError) {
          expect(errorOf(r)?.code).toBe("response_format_refused");
          continue;
        }
        const g = generationOf(r);
        // It ended (its grammar complete, or cut off and saying so), never presented as complete when not.
        expect(typeof g.grammar_complete).toBe("boolean");
        if (g.finish_reason === "length") expect(g.grammar_complete).toBe(false);
      }
      for (const r of await Promise.all(plain))
        expect(generationOf(r).text.length).toBeGreaterThan(0);
      // And the grammar path still works after all that.
      const after = generationOf(
        await run({
          messages: choiceMessages(0),
          max_new_tokens: 8,
          response_format: { type: "choice", choices: CHOICES },
        }),
      );
      expect(isChoice(after.text)).toBe(true);
    },
  );
});

describe("structured output, 50 prompts, over stdio (2026-07-28)", () => {
  it(
    `${PROMPTS} answers validate against the schema; choice and regex likewise`,
    { timeout: scaled(1_800_000) },
    async () => {
      const { client, close } = await connectModernStdio(config());
      try {
        const load = await callModern(client, "load_model", { model: SMOLLM2 });
        expect(load.isError, JSON.stringify(load.content)).toBeFalsy();
        await fiftyOfEach(
          (args) => callModern(client, "run_inference", { model: SMOLLM2, ...args }),
          "2026-07-28",
        );
      } finally {
        await close();
      }
    },
  );
});
