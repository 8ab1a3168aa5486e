// The worker's stderr is its log: one JSON object per line when possible. This splits the stream
// into lines (bounded), re-levels JSON lines by their own `level`, passes anything else on as a
// warning (a traceback, a library's print), and keeps the last lines to explain a crash.

export type LogLevel = "debug" | "info" | "warn" | "error";

export interface WorkerLogLine {
  level: LogLevel;
  msg: string;
  /** The line's other fields (the worker's own `time` renamed worker_time: pino has one). */
  fields: Record<string, unknown>;
}

const LINE_MAX = 64 * 1024;
const TAIL_LINES = 20;

const LEVELS: Record<string, LogLevel> = {
  trace: "debug",
  debug: "debug",
  info: "info",
  warn: "warn",
  warning: "warn",
  error: "error",
  critical: "error",
  fatal: "error",
};

export class StderrLog {
  private partial = "";
  private readonly last: string[] = [];

  constructor(private readonly onLine: (line: WorkerLogLine) => void) {}

  push(text: string): void {
    const lines = (this.partial + text).split("\n");
    this.partial = lines.pop() ?? "";
    if (this.partial.length > LINE_MAX) {
      this.line(this.partial.slice(0, LINE_MAX) + "…");
      this.partial = "";
    }
    for (const line of lines) this.line(line);
  }

  /** The process is gone: an unterminated last line is still a line. */
  flush(): void {
    if (this.partial) this.line(this.partial);
    this.partial = "";
  }

  /** The last `n` lines (each cut at 500 characters), to log with an exit. */
  tail(n: number): string[] {
    return this.last.slice(-n);
  }

  private line(raw: string): void {
    const line = raw.trimEnd();
    if (!line) return;
    this.last.push(line.length > 500 ? line.slice(0, 500) + "…" : line);
    if (this.last.length > TAIL_LINES) this.last.shift();
    let fields: Record<string, unknown> | null = null;
    if (line.startsWith("{")) {
      try {
        const v = JSON.parse(line);
        if (v && typeof v === "object" && !Array.isArray(v)) fields = v as Record<string, unknown>;
      } catch {
        /* not JSON: forwarded as text below */
      }
    }
    // Non-JSON stderr (tracebacks, library warnings) is unexpected from the worker: warn.
    // The worker's own `time` (seconds) would collide with pino's: keep it as worker_time.
    const {
      level: rawLevel,
      msg: rawMsg,
      message: rawMessage,
      time: workerTime,
      ...rest
    } = fields ?? {};
    this.onLine({
      level: LEVELS[String(rawLevel ?? (fields ? "info" : "warn")).toLowerCase()] ?? "info",
      msg: String(rawMsg ?? rawMessage ?? (fields ? "" : line)),
      fields: workerTime === undefined ? rest : { ...rest, worker_time: workerTime },
    });
  }
}
