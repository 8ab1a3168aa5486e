// pino to stderr: under stdio, stdout is the MCP protocol channel and must carry nothing else.
//
// On a terminal (stderr a TTY), one short line of text per record: time, level, message, then
// the record's own fields, so the start banner stays in view. Anywhere else (a file, a pipe, a
// log collector), pino's JSON lines, one object per record. `log_format` (or TPU_MCP_LOG_FORMAT)
// chooses either by name.
import pino, { type Logger } from "pino";
import { terminalField } from "../terminal.js";

export const LOG_FORMATS = ["auto", "json", "pretty"] as const;
export type LogFormat = (typeof LOG_FORMATS)[number];
export const isLogFormat = (s: string): s is LogFormat =>
  (LOG_FORMATS as readonly string[]).includes(s);

const LEVELS: Record<number, string> = {
  10: "TRACE",
  20: "DEBUG",
  30: "INFO ",
  40: "WARN ",
  50: "ERROR",
  60: "FATAL",
};
/** Fields said by the line's layout, or not worth a terminal's width (the worker's own clock, its origin). */
const ENVELOPE = new Set([
  "level",
  "time",
  "msg",
  "pid",
  "hostname",
  "service",
  "worker_time",
  "source",
]);
/** A field's value longer than this is cut on a terminal (JSON keeps it whole). */
const MAX_VALUE = 80;

const two = (n: number) => String(n).padStart(2, "0");

/** One JSON record as a terminal line: `12:03:04 WARN  message  key=value …`. */
export function prettyLine(json: string): string {
  let rec: Record<string, unknown>;
  try {
    rec = JSON.parse(json);
  } catch {
    return terminalField(json.trimEnd()) + "\n";
  }
  const t = new Date(typeof rec.time === "number" ? rec.time : Date.now());
  const time = `${two(t.getHours())}:${two(t.getMinutes())}:${two(t.getSeconds())}`;
  const level = LEVELS[rec.level as number] ?? String(rec.level);
  const fields = Object.entries(rec)
    .filter(([k, v]) => !ENVELOPE.has(k) && v !== undefined)
    .map(([k, v]) => {
      const s = typeof v === "string" ? v : JSON.stringify(v);
      return `${k}=${s.length > MAX_VALUE ? `${s.slice(0, MAX_VALUE)}…` : s}`;
    });
  // Every part escaped: a message or field may hold caller text (server/terminal.ts).
  const text = [String(rec.msg ?? ""), ...fields].map(terminalField).join("  ");
  return `${time} ${level} ${text}\n`;
}

/** `auto`: text on a terminal, JSON elsewhere. */
export function resolveLogFormat(
  format: LogFormat,
  destination: NodeJS.WritableStream,
): "json" | "pretty" {
  if (format !== "auto") return format;
  return (destination as Partial<NodeJS.WriteStream>).isTTY === true ? "pretty" : "json";
}

export function createLogger(
  level: string,
  destination: NodeJS.WritableStream = process.stderr,
  format: LogFormat = "json",
): Logger {
  const options = { level, base: { service: "tpu-mcp" } };
  if (resolveLogFormat(format, destination) === "json") return pino(options, destination as any);
  // pino writes one JSON line per call: each is turned into its text line as it is written.
  return pino(options, { write: (line: string) => destination.write(prettyLine(line)) });
}
