// A stdio server that cannot start still speaks MCP's framing: it answers each request with the
// reason as a JSON-RPC error, so the host shows what to do instead of "Connection closed", and
// ends when the host closes stdin.
import { createInterface } from "node:readline";

/** JSON-RPC's "internal error": the server exists but cannot serve. */
const INTERNAL_ERROR = -32603;

export function answerWithReason(
  message: string,
  input: NodeJS.ReadableStream = process.stdin,
  output: NodeJS.WritableStream = process.stdout,
): Promise<void> {
  const lines = createInterface({ input, crlfDelay: Infinity });
  lines.on("line", (line) => {
    let msg: { id?: unknown; method?: unknown };
    try {
      msg = JSON.parse(line);
    } catch {
      return; // not a message: nothing to answer
    }
    // Notifications (no id) and responses (no method) get no answer.
    if (msg?.id === undefined || msg.id === null || typeof msg.method !== "string") return;
    output.write(
      JSON.stringify({ jsonrpc: "2.0", id: msg.id, error: { code: INTERNAL_ERROR, message } }) +
        "\n",
    );
  });
  return new Promise((resolve) => lines.once("close", () => resolve()));
}
