// Tool calls from the built-in model (issue 46, docs/tools.md "Tool calls"): run_inference's
// `tools` and `tool_choice` as the caller gives them (OpenAI-compatible shapes), their checks
// against each other and the conversation, and the calls read back out of the generated text.
// The worker renders the tools (the model's chat template, or its fallback prompt) and constrains
// the text with a grammar of the functions' schemas (runtime/worker/tpu_worker/generation/tools.py),
// so a text whose grammar completed holds only calls that validate.
import { randomBytes } from "node:crypto";
import { z } from "zod";
import { ToolError } from "../errors.js";
import { wellFormedText } from "../schemas.js";
import type { ToolEnv } from "../types.js";

export const MAX_TOOLS = 32;
const NAME = /^[A-Za-z0-9_.-]{1,64}$/;

export const toolsInput = z
  .array(
    z
      .object({
        type: z.literal("function"),
        function: z
          .object({
            name: z.string().regex(NAME),
            description: z.string().max(1024).optional(),
            parameters: z.looseObject({}).optional().describe("JSON schema of the arguments"),
          })
          .strict(),
      })
      .strict(),
  )
  .min(1)
  .max(MAX_TOOLS);

export const toolChoiceInput = z.union([
  z.enum(["auto", "none", "required"]),
  z
    .object({
      type: z.literal("function"),
      function: z.object({ name: z.string().regex(NAME) }).strict(),
    })
    .strict(),
]);

/** One call, as returned and as given back in an assistant message. */
export const ToolCall = z.object({
  id: z.string().min(1).max(64),
  name: z.string(),
  arguments: z.record(z.string(), z.unknown()),
});
export type ToolCall = z.infer<typeof ToolCall>;

/** The short shapes tools/list publishes for run_inference's tool-call fields (run_inference.ts). */
export function listedToolInputs(env: ToolEnv, maxChars: number) {
  return {
    tools: z.array(z.looseObject({})).optional().describe("OpenAI-style functions"),
    tool_choice: z.union([z.enum(["auto", "none", "required"]), z.looseObject({})]).optional(),
    messages: z
      .array(
        z.object({
          role: z.enum(["system", "user", "assistant", "tool"]),
          content: wellFormedText.max(maxChars),
          tool_calls: z.array(z.looseObject({})).optional(),
          tool_call_id: z.string().optional(),
        }),
      )
      .min(1)
      .max(env.limits.max_texts)
      .optional(),
  };
}

type Tools = z.infer<typeof toolsInput>;
type ToolChoice = z.infer<typeof toolChoiceInput>;
interface Message {
  role: string;
  content: string;
  tool_call_id?: string;
  tool_calls?: ToolCall[];
}

const bad = (message: string) => new ToolError("invalid_argument", message);

/** The checks zod's shapes cannot say: unique names, a choice among them, calls answered in order. */
export function checkTools(args: {
  tools?: Tools;
  tool_choice?: ToolChoice;
  messages?: Message[];
  texts?: unknown;
  response_format?: unknown;
}): void {
  const { tools, tool_choice: choice } = args;
  if (choice !== undefined && !tools)
    throw bad("tool_choice: give tools, the functions the model may call");
  if (tools) {
    if (!args.messages) throw bad("tools: the model calls functions in a chat; give messages");
    if (args.response_format)
      throw bad("tools: tools and response_format both constrain the answer; give one of them");
    const names = tools.map((t) => t.function.name);
    const twice = names.find((n, i) => names.indexOf(n) !== i);
    if (twice) throw bad(`tools: the function name ${twice} is given twice; names must be unique`);
    if (typeof choice === "object" && !names.includes(choice.function.name))
      throw bad(
        `tool_choice: ${choice.function.name} is not among tools (${names.join(", ")}); name one of them`,
      );
  }
  const calls = new Set<string>();
  args.messages?.forEach((m, i) => {
    if (m.tool_calls && m.role !== "assistant")
      throw bad(`messages.${i}.tool_calls: only an assistant message carries calls`);
    if ((m.role === "tool") !== (m.tool_call_id !== undefined))
      throw bad(
        `messages.${i}: a tool message, and only one, names the call it answers by tool_call_id`,
      );
    m.tool_calls?.forEach((c) => calls.add(c.id));
    if (m.tool_call_id !== undefined && !calls.has(m.tool_call_id))
      throw bad(
        `messages.${i}.tool_call_id: ${m.tool_call_id} is no call of an earlier assistant message; give the id its tool_calls returned`,
      );
  });
}

const CALL = /<tool_call>\n(.*?)\n<\/tool_call>/gs;

/**
 * The calls in a generated text and the text around them, or undefined when the text holds none,
 * or one that does not parse or names no given function (an answer cut before its grammar
 * completed, or written without one).
 */
export function readToolCalls(
  text: string,
  tools: Tools,
): { calls: ToolCall[]; text: string } | undefined {
  const names = new Set(tools.map((t) => t.function.name));
  const calls: ToolCall[] = [];
  for (const m of text.matchAll(CALL)) {
    let v: unknown;
    try {
      v = JSON.parse(m[1]!);
    } catch {
      return undefined;
    }
    const c = v as { name?: unknown; arguments?: unknown };
    const args = c?.arguments;
    if (typeof c?.name !== "string" || !names.has(c.name)) return undefined;
    if (!args || typeof args !== "object" || Array.isArray(args)) return undefined;
    calls.push({
      id: `call_${randomBytes(12).toString("hex")}`,
      name: c.name,
      arguments: args as Record<string, unknown>,
    });
  }
  if (!calls.length) return undefined;
  return { calls, text: text.replace(CALL, "").trim() };
}
