// Structured output against the real built-in instruction model: the JSON schema the suites ask
// for (nested object, enum, array, integer bounds), the prompts, a choice and a regex, and a
// JSON-schema validator (ajv, JSON Schema 2020-12) that says whether an answer is valid.
import { Ajv2020 } from "ajv/dist/2020.js";
import { expect } from "vitest";

export const SMOLLM2 = "smollm2-135m-instruct";

export const PERSON = {
  type: "object",
  properties: {
    name: { type: "string", maxLength: 16 },
    age: { type: "integer", minimum: 0, maximum: 120 },
    role: { enum: ["engineer", "artist", "doctor", "teacher"] },
    skills: {
      type: "array",
      items: { type: "string", maxLength: 12 },
      minItems: 1,
      maxItems: 3,
    },
    address: {
      type: "object",
      properties: {
        city: { type: "string", maxLength: 16 },
        zip: { type: "integer", minimum: 10000, maximum: 99999 },
      },
      required: ["city", "zip"],
      additionalProperties: false,
    },
  },
  required: ["name", "age", "role", "skills", "address"],
  additionalProperties: false,
} as const;

/** More than the longest answer PERSON allows in SmolLM2's tokens (strings of one-character tokens at their maxLength: about 105). */
export const PERSON_TOKENS = 128;

export const CHOICES = ["positive", "negative", "neutral"];
export const PATTERN = "[A-Z][a-z]{2,9}, [0-9]{4}";

const NAMES = ["Alice", "Bob", "Chen", "Dara", "Eve", "Femi", "Gus", "Hana", "Ivo", "Jun"];
const TOPICS = ["I love it", "awful service", "it is a chair", "best day ever", "meh"];

/** Prompt i of the JSON suite: a conversation asking for one person. */
export const personMessages = (i: number) => [
  {
    role: "user",
    content: `Describe a person named ${NAMES[i % NAMES.length]} (${i}) as JSON.`,
  },
];
export const choiceMessages = (i: number) => [
  { role: "user", content: `Is "${TOPICS[i % TOPICS.length]}" positive or negative?` },
];
export const regexMessages = (i: number) => [
  { role: "user", content: `Name a city and a year (${i}).` },
];

export const personFormat = {
  type: "json_schema",
  json_schema: { name: "person", schema: PERSON, strict: true },
};

const ajv = new Ajv2020({ allErrors: true });
const validPerson = ajv.compile(PERSON);

/** Whether a text parses as JSON and validates against PERSON. */
export function isPerson(text: string): boolean {
  try {
    return validPerson(JSON.parse(text)) === true;
  } catch {
    return false;
  }
}

export const isChoice = (text: string) => CHOICES.includes(text);
export const isPattern = (text: string) => new RegExp(`^(?:${PATTERN})$`).test(text);

/** The one generation of a run_inference answer, or the failure's text in the thrown error. */
export function generationOf(r: any): {
  text: string;
  finish_reason: string;
  grammar_complete?: boolean;
} {
  if (r.isError) throw new Error(JSON.stringify(r.content));
  return r.structuredContent.generations[0];
}

/**
 * fn(0..n-1), `wave` calls at a time: concurrent enough to batch, within run_inference's
 * concurrency and queue (32 running, a bounded queue: 50 at once are refused busy).
 */
export async function inWaves<T>(n: number, wave: number, fn: (i: number) => Promise<T>) {
  const out: T[] = [];
  for (let start = 0; start < n; start += wave) {
    const ids = [...Array(Math.min(wave, n - start)).keys()].map((k) => start + k);
    out.push(...(await Promise.all(ids.map(fn))));
  }
  return out;
}

/**
 * `prompts` choice prompts, then `prompts` regex prompts, `wave` at a time through `run` (an MCP
 * call or the engine's), each answer checked against its format: every one must follow it.
 */
export async function expectChoicesAndPatterns(
  run: (args: Record<string, unknown>) => Promise<unknown>,
  prompts: number,
  wave: number,
): Promise<void> {
  const choices = await inWaves(prompts, wave, (i) =>
    run({
      messages: choiceMessages(i),
      max_new_tokens: 8,
      response_format: { type: "choice", choices: CHOICES },
    }),
  );
  expect(choices.filter((r) => isChoice(generationOf(r).text)).length).toBe(prompts);
  const regexes = await inWaves(prompts, wave, (i) =>
    run({
      messages: regexMessages(i),
      max_new_tokens: 16,
      response_format: { type: "regex", pattern: PATTERN },
    }),
  );
  expect(regexes.filter((r) => isPattern(generationOf(r).text)).length).toBe(prompts);
}
