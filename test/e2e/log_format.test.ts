// Logs as a person and as a machine read them: the real server with its stderr on a
// pseudo-terminal (test/helpers/stderr_tty.py) writes one short text line per record, so the
// start banner stays in view; with stderr a pipe it writes pino's JSON lines; TPU_MCP_LOG_FORMAT
// chooses either by name. Under stdio, stdout stays the MCP channel alone (a real client speaks
// over it while the logs go to the terminal).
import { spawn } from "node:child_process";
import { join } from "node:path";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { describe, expect, it } from "vitest";
import { scaled } from "../helpers/calibrate.js";
import { CLI, ROOT, scaledRequests, startHttpServer, writeConfig } from "../helpers/server.js";
import { call } from "./scenario.js";

const PY = join(ROOT, ".venv/bin/python");
const TTY = join(ROOT, "test/helpers/stderr_tty.py");
/** Info level (the default), so the start's records are logged; no worker needed. */
const config = () =>
  writeConfig({
    log_level: "info",
    runtime: {
      python: PY,
      catalog: join(ROOT, "runtime/catalog.builtin.json"),
      device: "cpu",
      start: "lazy",
    },
  });
/** writeConfig turns approvals off: the one warning every start with it logs. */
const APPROVALS_OFF = "approvals are OFF";
const TEXT_LINE = /^\d\d:\d\d:\d\d (TRACE|DEBUG|INFO |WARN |ERROR|FATAL) \S/;

/** `tpu-mcp http` with stderr on a terminal: everything it wrote there up to its banner's end. */
async function httpOnTerminal(env: Record<string, string> = {}): Promise<string[]> {
  const proc = spawn(
    PY,
    [TTY, process.execPath, CLI, "http", "--port", "0", "--config", config()],
    {
      cwd: ROOT,
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...process.env, ...env },
    },
  );
  let seen = "";
  try {
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no banner:\n${seen}`)), scaled(60_000));
      proc.stderr!.on("data", (d) => {
        seen += d.toString();
        if (seen.includes("stop with Ctrl-C")) {
          clearTimeout(timer);
          resolve();
        }
      });
      proc.once("exit", (code) => reject(new Error(`exited with ${code}:\n${seen}`)));
    });
  } finally {
    if (proc.exitCode === null) {
      const exited = new Promise((r) => proc.once("exit", r));
      proc.kill("SIGTERM");
      await exited;
    }
  }
  // A terminal ends its lines with \r\n.
  return seen.split(/\r?\n/);
}

describe("log format", () => {
  it("on a terminal: one short text line per record, the banner after them", async () => {
    const lines = await httpOnTerminal();
    const warning = lines.find((l) => l.includes(APPROVALS_OFF));
    expect(warning, lines.join("\n")).toMatch(/^\d\d:\d\d:\d\d WARN {2}approvals are OFF: /);
    expect(lines.filter((l) => l.trimStart().startsWith("{"))).toEqual([]);
    const records = lines.filter((l) => TEXT_LINE.test(l));
    expect(records.length).toBeGreaterThanOrEqual(2);
    // Short: no JSON envelope (pid, hostname, service) and no field runs past a terminal's width.
    for (const r of records) {
      expect(r).not.toMatch(/"level"|service=|hostname=|pid=/);
      for (const field of r.slice(15).split("  ").slice(1)) expect(field.length).toBeLessThan(120);
    }
    expect(lines).toContain("stop with Ctrl-C");
  });

  it("without a terminal: pino's JSON lines", async () => {
    const server = await startHttpServer(config());
    try {
      const records = server
        .stderr()
        .split("\n")
        .filter((l) => l.startsWith("{"))
        .map((l) => JSON.parse(l));
      expect(records).toContainEqual(
        expect.objectContaining({
          level: 40,
          service: "tpu-mcp",
          msg: expect.stringContaining(APPROVALS_OFF),
        }),
      );
      expect(server.stderr()).not.toMatch(/^\d\d:\d\d:\d\d WARN/m);
    } finally {
      await server.stop();
    }
  });

  it("TPU_MCP_LOG_FORMAT=json on a terminal: JSON lines", async () => {
    const lines = await httpOnTerminal({ TPU_MCP_LOG_FORMAT: "json" });
    const warning = lines.find((l) => l.includes(APPROVALS_OFF))!;
    expect(JSON.parse(warning)).toMatchObject({ level: 40 });
    expect(lines.filter((l) => TEXT_LINE.test(l))).toEqual([]);
  });

  it("under stdio with stderr on a terminal: text logs there, stdout only the MCP channel", async () => {
    const transport = new StdioClientTransport({
      command: PY,
      args: [TTY, process.execPath, CLI, "stdio", "--config", config()],
      cwd: ROOT,
      stderr: "pipe",
    });
    let stderr = "";
    transport.stderr!.on("data", (d) => (stderr += d.toString()));
    const client = scaledRequests(new Client({ name: "log-format-test", version: "0.0.0" }));
    const protocolErrors: Error[] = [];
    client.onerror = (e) => protocolErrors.push(e);
    await client.connect(transport);
    try {
      const listed = await call(client, "list_models", {});
      expect(listed.structuredContent.models.length).toBeGreaterThan(0);
    } finally {
      await client.close();
    }
    // A log line on stdout would have been a line the client could not parse.
    expect(protocolErrors).toEqual([]);
    const lines = stderr.split(/\r?\n/);
    expect(lines.find((l) => l.includes(APPROVALS_OFF))).toMatch(/^\d\d:\d\d:\d\d WARN {2}/);
    expect(lines.filter((l) => l.trimStart().startsWith("{"))).toEqual([]);
  });
});
