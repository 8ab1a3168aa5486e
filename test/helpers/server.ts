// Starts the real `tpu-mcp` CLI (stdio or HTTP) in a child process with a config in a temp dir,
// and connects the SDK's real Client to it.
import { execFile, spawn, type ChildProcess, type SpawnOptions } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import Database from "better-sqlite3";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import {
  getDefaultEnvironment,
  StdioClientTransport,
} from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { TOOL_POLICIES } from "../../tools/registry.js";
import { scaled, slowdown } from "./calibrate.js";

export const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
export const CLI = join(ROOT, "bin", "tpu-mcp.js");

/** The demo policy (examples/policy.demo.json) and the tokens it names. */
export const DEMO_POLICY = JSON.parse(
  readFileSync(join(ROOT, "examples/policy.demo.json"), "utf8"),
).policy;
export const DEMO_TOKENS = {
  agent: "demo-agent-token",
  reader: "demo-reader-token",
  operator: "demo-operator-token",
} as const;

const run = promisify(execFile);

/** Runs `tpu-mcp <args> --config <config>` to its end: exit code and output, never a throw. */
export async function cli(config: string, ...args: string[]) {
  try {
    const r = await run(process.execPath, [CLI, ...args, "--config", config], {
      cwd: ROOT,
      timeout: scaled(60_000),
    });
    return { code: 0, stdout: r.stdout, stderr: r.stderr };
  } catch (e: any) {
    return {
      code: e.code as number,
      stdout: String(e.stdout ?? ""),
      stderr: String(e.stderr ?? ""),
    };
  }
}

/** The runtime's heartbeat timeout and stop grace, scaled with this machine's slowdown. */
export function workerGrace(): { heartbeat_timeout_s: number; stop_grace_s: number } {
  return {
    heartbeat_timeout_s: Math.round(20 * slowdown()),
    stop_grace_s: Math.round(8 * slowdown()),
  };
}

/** Writes a config file in a fresh temp dir (its own data_dir) and returns its path. */
export function writeConfig(
  extra: Record<string, unknown> = {},
  dir = mkdtempSync(join(tmpdir(), "tpu-mcp-")),
): string {
  const file = join(dir, "config.json");
  // A worker starved of CPU answers its heartbeat, and confirms a stopped call, late, not never:
  // not restarted for it here (a test with its own runtime section sets these itself).
  const heartbeat = workerGrace();
  const config: Record<string, unknown> = {
    data_dir: join(dir, "data"),
    log_level: "warn",
    runtime: {
      python: join(ROOT, ".venv/bin/python"),
      catalog: join(ROOT, "runtime/catalog.builtin.json"),
      device: "cpu",
      ...heartbeat,
    },
    // Not about approvals: the one line that turns the default rules off (a test that is passes
    // its own policy).
    policy: {
      approvals: { rules: [] },
      limits: { rate_limit: { per_principal_per_minute: 6000 } },
    },
    ...extra,
  };
  // The soft deadline (45 s) hands a call over as a job before a client's 60 s timeout; these
  // clients wait scaled(60 s), so a call that is slow only because the machine is loaded is
  // answered, not handed over (a load_model handed over left the next calls model_not_loaded).
  // The tools' call timeouts scale the same way: four SmolLM2 generations at load 15 passed
  // run_inference's 120 s and answered their partial text. A test about either sets its own.
  const policy = config.policy as { limits?: Record<string, unknown> } | undefined;
  if (policy) {
    const limits = policy.limits ?? {};
    const timeouts: Record<string, number> = {};
    for (const t of TOOL_POLICIES)
      if (t.timeoutS !== null) timeouts[t.name] = Math.round(t.timeoutS * slowdown());
    config.policy = {
      ...policy,
      limits: {
        ...limits,
        soft_deadline_s: limits.soft_deadline_s ?? Math.round(45 * slowdown()),
        call_timeout_s: { ...timeouts, ...(limits.call_timeout_s as object | undefined) },
      },
    };
  }
  writeFileSync(file, JSON.stringify(config, null, 2));
  return file;
}

/**
 * A request without its own timeout waits as long as this machine needs for what a quiet one
 * does in the SDK's default 60 s (test/helpers/calibrate.ts).
 */
export function scaledRequests(client: Client): Client {
  const request = client.request.bind(client);
  client.request = ((req, schema, options) =>
    request(req, schema, {
      ...options,
      timeout: options?.timeout ?? scaled(60_000),
    })) as Client["request"];
  return client;
}

export async function connectStdio(
  configFile: string,
  clientOpts: ConstructorParameters<typeof Client>[1] = {},
  /** Variables added to the SDK's default environment of the server (and so of its worker). */
  env?: Record<string, string>,
) {
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: [CLI, "stdio", "--config", configFile],
    cwd: ROOT,
    stderr: "pipe",
    ...(env ? { env: { ...getDefaultEnvironment(), ...env } } : {}),
  });
  const client = scaledRequests(new Client({ name: "tpu-mcp-test", version: "0.0.0" }, clientOpts));
  await client.connect(transport);
  return { client, transport, close: () => client.close() };
}

export interface HttpServerProc {
  url: string;
  token?: string;
  proc: ChildProcess;
  stderr: () => string;
  stop(): Promise<void>;
}

/** `spawnOpts` (uid, gid, env): e.g. the server as another OS user (test/helpers/os_user.ts). */
export function startHttpServer(
  configFile: string,
  args: string[] = [],
  spawnOpts: Pick<SpawnOptions, "uid" | "gid" | "env"> = {},
): Promise<HttpServerProc> {
  const proc = spawn(
    process.execPath,
    [CLI, "http", "--port", "0", "--config", configFile, ...args],
    {
      cwd: ROOT,
      stdio: ["ignore", "pipe", "pipe"],
      ...spawnOpts,
    },
  );
  let err = "";
  return new Promise((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`server did not start:\n${err}`)),
      scaled(60_000),
    );
    proc.stderr!.on("data", (d) => {
      err += d.toString();
      const m = /serving MCP \(Streamable HTTP\) at (\S+)/.exec(err);
      const t = /bearer token[^\n]*:\n\s+(\S+)/.exec(err);
      if (m && (t || !/bearer token \(generated/.test(err)) && err.includes("stop with Ctrl-C")) {
        clearTimeout(timer);
        resolve({
          url: m[1],
          token: t?.[1],
          proc,
          stderr: () => err,
          stop: () =>
            new Promise<void>((r) => {
              if (proc.exitCode !== null) return r();
              proc.once("exit", () => r());
              proc.kill("SIGTERM");
            }),
        });
      }
    });
    proc.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`server exited with ${code}:\n${err}`));
    });
  });
}

export async function connectHttp(
  url: string,
  token?: string,
  clientOpts: ConstructorParameters<typeof Client>[1] = {},
) {
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: token ? { headers: { Authorization: `Bearer ${token}` } } : {},
  });
  const client = scaledRequests(new Client({ name: "tpu-mcp-test", version: "0.0.0" }, clientOpts));
  await client.connect(transport);
  return { client, transport, close: () => client.close() };
}

/**
 * Until every admitted call of a server on `dataDir` has been charged (policy.db's
 * calls_in_flight is empty) and its worker is ready (/readyz answers 200). A call stopped by its
 * budget is answered at once but charged when the worker has stopped its work; a worker that
 * does not confirm within the runtime's stop grace (a loaded machine) is then replaced, and a
 * call made meanwhile is answered worker_died or worker_unavailable, which says nothing of what a
 * test asks.
 */
export async function stoppedWorkSettled(
  server: Pick<HttpServerProc, "url">,
  dataDir: string,
): Promise<void> {
  const readyz = new URL("/readyz", server.url);
  const until = Date.now() + scaled(120_000);
  const uncharged = () => {
    const db = new Database(join(dataDir, "policy.db"), { readonly: true, fileMustExist: true });
    try {
      return (db.prepare("SELECT count(*) AS n FROM calls_in_flight").get() as { n: number }).n;
    } finally {
      db.close();
    }
  };
  for (;;) {
    const left = uncharged();
    const ready = left === 0 && (await fetch(readyz).catch(() => null))?.status === 200;
    if (ready) return;
    if (Date.now() > until)
      throw new Error(`not settled: ${left} call(s) uncharged, or the worker is not ready`);
    await new Promise((res) => setTimeout(res, 200));
  }
}

/** A raw JSON-RPC initialize request, for tests that speak HTTP or stdio without the SDK. */
export const INITIALIZE = {
  jsonrpc: "2.0",
  id: 1,
  method: "initialize",
  params: {
    protocolVersion: "2025-11-25",
    capabilities: {},
    clientInfo: { name: "x", version: "1" },
  },
} as const;

export function errorOf(
  r: CallToolResult | any,
): { code: string; message: string; details?: any } | undefined {
  return r?._meta?.["tpu-mcp/error"];
}

export function cosine(a: number[], b: number[]): number {
  let d = 0;
  let na = 0;
  let nb = 0;
  for (let i = 0; i < a.length; i++) {
    d += a[i] * b[i];
    na += a[i] * a[i];
    nb += b[i] * b[i];
  }
  return d / Math.sqrt(na * nb);
}
