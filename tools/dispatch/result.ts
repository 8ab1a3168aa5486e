// What a tools/call answers: a success result (structured content, a text rendering and links to
// the tpu:// resources it names) or an isError result carrying a catalogue code in _meta.
import type { Logger } from "pino";
import type { z } from "zod";
import { ERROR_CATALOGUE, ToolError } from "../errors.js";
import type { ToolDefinition } from "../types.js";

export interface CallToolResultLike {
  [k: string]: unknown;
  content: (
    | { type: "text"; text: string }
    | { type: "resource_link"; uri: string; name: string; mimeType?: string }
  )[];
  structuredContent?: Record<string, unknown>;
  isError?: boolean;
  _meta?: Record<string, unknown>;
}

export const ERROR_META_KEY = "tpu-mcp/error";

export function errorResult(e: ToolError): CallToolResultLike {
  const recoverable = ERROR_CATALOGUE[e.code].recoverable;
  return {
    content: [{ type: "text", text: `error ${e.code}: ${e.message}` }],
    isError: true,
    _meta: {
      [ERROR_META_KEY]: {
        code: e.code,
        message: e.message,
        recoverable,
        ...(e.details ? { details: e.details } : {}),
      },
    },
  };
}

/**
 * The answer as the tool declares it, or `internal`: a handler whose output drifted from its
 * output schema (a missing or mistyped field, a wrong shape) must never reach a client as a
 * silent wrong answer. Fields the schema does not name pass, as the published schema says
 * (server/mcp/json_schema.ts opens output objects: the worker reports more than each tool declares). The
 * log names the tool and the fields; the client sees only the code.
 */
export function checkOutput(
  tool: ToolDefinition<any, any>,
  out: unknown,
  logger: Pick<Logger, "error">,
): Record<string, unknown> {
  const parsed = tool.output.safeParse(out);
  if (parsed.success) return out as Record<string, unknown>;
  const problems = parsed.error.issues
    .slice(0, 5)
    .map((i: z.core.$ZodIssue) => `${i.path.join(".") || "(result)"}: ${i.message}`);
  logger.error({ tool: tool.name, problems }, "tool output does not match its output schema");
  throw new ToolError(
    "internal",
    "internal error: the tool's answer did not match its declared output; the server log has the details",
  );
}

export function successResult(
  tool: ToolDefinition<any, any>,
  out: Record<string, unknown>,
): CallToolResultLike {
  const content: CallToolResultLike["content"] = [{ type: "text", text: tool.render(out) }];
  // Resources named in the result are also linked, so clients can fetch them without parsing.
  const uris = new Set<string>();
  JSON.stringify(out, (_k, v) => {
    if (typeof v === "string" && v.startsWith("tpu://")) uris.add(v);
    return v;
  });
  for (const uri of uris)
    content.push({ type: "resource_link", uri, name: uri.slice("tpu://".length) });
  return { content, structuredContent: out };
}
