// Structured output that parses (issue 44): every prompt of bench/data/structured_prompts.jsonl
// (varied schemas: enums, bounded and unbounded numbers, arrays of objects with and without
// additionalProperties, nested objects) asked of the real built-in instruction model through MCP
// at max_new_tokens 160, `callers` at a time; the figure is the share of answers that parse as
// JSON and validate against their schema (target ≥ 99 %), and how many ended by length.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { Ajv2020 } from "ajv/dist/2020.js";
import { SMOLLM2, inWaves } from "../test/helpers/structured.js";
import { ROOT, type McpServer } from "./lib/procs.js";
import { section, type SectionResult } from "./lib/report.js";

export interface StructuredParseOptions {
  mcp: McpServer;
  callers: number;
  /** Only the first `limit` prompts (a quick run); all of them when undefined. */
  limit?: number;
  say: (msg: string) => void;
}

export const PROMPTS_FILE = join(ROOT, "bench", "data", "structured_prompts.jsonl");
const MAX_NEW_TOKENS = 160;

interface Prompt {
  id: string;
  prompt: string;
  schema: Record<string, unknown>;
}

export function readPrompts(file = PROMPTS_FILE): Prompt[] {
  return readFileSync(file, "utf8")
    .split("\n")
    .filter((line) => line.trim())
    .map((line) => JSON.parse(line) as Prompt);
}

export async function runStructuredParse(o: StructuredParseOptions): Promise<SectionResult> {
  const s = section("structured_parse");
  const prompts = readPrompts().slice(0, o.limit);
  const ajv = new Ajv2020({ allErrors: true, strict: false });
  await o.mcp.call("load_model", { model: SMOLLM2 });
  const answers = await inWaves(prompts.length, o.callers, async (i) => {
    const p = prompts[i]!;
    const r = await o.mcp.call("run_inference", {
      model: SMOLLM2,
      messages: [{ role: "user", content: p.prompt }],
      max_new_tokens: MAX_NEW_TOKENS,
      response_format: { type: "json_schema", json_schema: { name: "answer", schema: p.schema } },
    });
    return { p, g: r.generations[0] };
  });
  const failed: string[] = [];
  let lengthEnded = 0;
  for (const { p, g } of answers) {
    if (g.finish_reason === "length") lengthEnded++;
    let valid = false;
    try {
      valid = ajv.validate(p.schema, JSON.parse(g.text)) === true;
    } catch {
      valid = false;
    }
    if (!valid) failed.push(p.id);
  }
  const rate = (answers.length - failed.length) / answers.length;
  s.row(
    "answers that parse and validate",
    `${(rate * 100).toFixed(1)} %`,
    `${answers.length - failed.length} of ${answers.length}, max_new_tokens ${MAX_NEW_TOKENS}; target ≥ 99 %`,
  );
  s.row("answers ended by length", String(lengthEnded), `of ${answers.length}`);
  s.fig("valid_rate", rate);
  s.fig("length_ended", lengthEnded);
  if (failed.length) s.note(`structured_parse: invalid answers: ${failed.join(", ")}`);
  o.say(`structured_parse: ${answers.length - failed.length}/${answers.length} parse and validate`);
  return s.result();
}
