// pino to stderr: under stdio, stdout is the MCP protocol channel and must carry nothing else.
import pino, { type Logger } from "pino";

export function createLogger(
  level: string,
  destination: NodeJS.WritableStream = process.stderr,
): Logger {
  return pino({ level, base: { service: "tpu-mcp" } }, destination as any);
}
