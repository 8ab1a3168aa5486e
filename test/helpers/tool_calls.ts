// The function-calling set of the tool-call test and bench (written for them; bench/data/
// tool_calls.jsonl and tool_calls_tools.json): five functions, twenty requests each answered by
// one call, and the two measures: a call valid against its function's schema (ajv, JSON Schema
// 2020-12), and a call accurate (the expected function, every expected argument equal: strings
// compared trimmed and case-insensitive; an optional argument the answer adds is not counted).
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { Ajv2020 } from "ajv/dist/2020.js";

const ROOT = join(import.meta.dirname, "..", "..");
export const TOOL_SET_FILE = join(ROOT, "bench", "data", "tool_calls.jsonl");

export interface FnTool {
  type: "function";
  function: { name: string; description: string; parameters: Record<string, unknown> };
}
export interface ToolRequest {
  id: string;
  prompt: string;
  expected: { name: string; arguments: Record<string, unknown> };
}
export interface Call {
  name: string;
  arguments: unknown;
}

export const TOOLS: FnTool[] = JSON.parse(
  readFileSync(join(ROOT, "bench", "data", "tool_calls_tools.json"), "utf8"),
);

export function toolRequests(file = TOOL_SET_FILE): ToolRequest[] {
  return readFileSync(file, "utf8")
    .split("\n")
    .filter((l) => l.trim())
    .map((l) => JSON.parse(l) as ToolRequest);
}

const ajv = new Ajv2020({ allErrors: true, strict: false });

/** Does the call name one of `tools` and validate against its parameters? */
export function callValid(call: Call, tools: FnTool[] = TOOLS): boolean {
  const fn = tools.find((t) => t.function.name === call.name);
  if (!fn || !call.arguments || typeof call.arguments !== "object") return false;
  return ajv.validate(fn.function.parameters, call.arguments) === true;
}

const norm = (v: unknown) => (typeof v === "string" ? v.trim().toLowerCase() : v);

/** The expected function, with every expected argument. */
export function callAccurate(call: Call, expected: ToolRequest["expected"]): boolean {
  if (call.name !== expected.name || !call.arguments || typeof call.arguments !== "object")
    return false;
  const got = call.arguments as Record<string, unknown>;
  return Object.entries(expected.arguments).every(([k, v]) => norm(got[k]) === norm(v));
}

/** One request as run_inference's messages. */
export const toolMessages = (r: ToolRequest) => [{ role: "user", content: r.prompt }];
