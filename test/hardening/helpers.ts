// Shared pieces of the hardening suites: an in-process server (createApp + the SDK's in-memory
// transport pair) for fast fuzzing, temp dirs that are always removed, the demo policy and its
// tokens, and small readers for the audit trail and the jobs table.
import { createHash } from "node:crypto";
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js";
import Database from "better-sqlite3";
import pino from "pino";
import type { Principal } from "../../policies/scopes.js";
import { createApp, type App } from "../../server/app/app.js";
import { parseConfig } from "../../server/config/config.js";
import { createMcpServer } from "../../server/mcp/server.js";
import {
  CLI,
  DEMO_POLICY,
  DEMO_TOKENS,
  ROOT,
  cli,
  startHttpServer,
  type HttpServerProc,
} from "../helpers/server.js";
import { scaled } from "../helpers/calibrate.js";
import { auditRows } from "../helpers/audit_rows.js";

export { auditRows };

export { CLI, DEMO_POLICY, ROOT, cli };
export const DATA = join(ROOT, "test", "hardening", "data");
export const PYTHON = join(ROOT, ".venv", "bin", "python");

export const TOKENS = DEMO_TOKENS;

export const sha256 = (s: string) => createHash("sha256").update(s).digest("hex");

/** Temp dirs made by a suite, removed by `cleanupTemp()` in its afterAll. */
const temps: string[] = [];
export function tempDir(prefix = "tpu-mcp-hard-"): string {
  const d = mkdtempSync(join(tmpdir(), prefix));
  temps.push(d);
  return d;
}
export function cleanupTemp(): void {
  for (const d of temps.splice(0)) {
    try {
      chmodRecursiveWritable(d);
      rmSync(d, { recursive: true, force: true });
    } catch {
      /* best effort */
    }
  }
}
function chmodRecursiveWritable(d: string) {
  try {
    chmodSync(d, 0o755);
  } catch {
    /* ignore */
  }
}

/** A shell script usable as runtime.python: `body` runs first, then it may exec the venv python. */
export function pythonWrapper(dir: string, body: string): string {
  const file = join(dir, `python-wrapper-${Math.random().toString(36).slice(2)}.sh`);
  writeFileSync(file, `#!/bin/sh\n${body}\n`, { mode: 0o755 });
  chmodSync(file, 0o755);
  return file;
}

export function baseConfig(dir: string, extra: Record<string, any> = {}): Record<string, any> {
  const { runtime, policy, ...rest } = extra;
  return {
    data_dir: join(dir, "data"),
    log_level: "warn",
    runtime: {
      python: PYTHON,
      catalog: join(ROOT, "runtime/catalog.builtin.json"),
      device: "cpu",
      ...(runtime ?? {}),
    },
    // Approvals off unless the test's policy names its own (the default rules would ask).
    policy: {
      approvals: { rules: [] },
      limits: { rate_limit: { per_principal_per_minute: 100_000 } },
      ...(policy ?? {}),
    },
    ...rest,
  };
}

export interface InProcess {
  app: App;
  connect(principal: Principal): Promise<Client>;
  close(): Promise<void>;
}

/** createApp in this process; each `connect` is one MCP session over an in-memory transport pair. */
export async function inProcess(raw: Record<string, any>): Promise<InProcess> {
  const config = parseConfig(raw, { root: ROOT });
  const logger = pino({ level: "silent" });
  const app = await createApp(config, logger);
  const clients: Client[] = [];
  let closing: Promise<void> | null = null;
  return {
    app,
    async connect(principal) {
      const server = createMcpServer(app, principal);
      const [ct, st] = InMemoryTransport.createLinkedPair();
      await server.connect(st);
      const client = new Client({ name: "hardening", version: "0.0.0" });
      await client.connect(ct);
      clients.push(client);
      return client;
    },
    close() {
      closing ??= (async () => {
        await Promise.all(clients.map((c) => c.close().catch(() => {})));
        await app.close();
      })();
      return closing;
    },
  };
}

export const errorOf = (
  r: any,
): { code: string; message: string; details?: any; recoverable?: boolean } | undefined =>
  r?._meta?.["tpu-mcp/error"];

/** Nothing that looks like a server path, a stack frame or a Python traceback. */
export const LEAK_RE =
  /\/work\/|\/tmp\/|\/home\/|\/usr\/|\.venv|node_modules|\bat [\w.<>]+ \(|\.ts:\d+|\.py", line|Traceback/;

export function jobRows(dataDir: string): Array<Record<string, any>> {
  const db = new Database(join(dataDir, "jobs.db"), { readonly: true, fileMustExist: true });
  try {
    return db.prepare("SELECT * FROM jobs").all() as any[];
  } finally {
    db.close();
  }
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Polls `fn` until it is truthy; `timeoutMs` is what a quiet machine needs, scaled to this one. */
export async function until<T>(
  fn: () => Promise<T | undefined | false> | T | undefined | false,
  timeoutMs: number,
  stepMs = 100,
): Promise<T> {
  const t0 = Date.now();
  const limit = scaled(timeoutMs);
  for (;;) {
    const v = await fn();
    if (v) return v as T;
    if (Date.now() - t0 > limit) throw new Error(`condition not met within ${limit} ms`);
    await sleep(stepMs);
  }
}

/** Figures measured by the suites, printed and merged into test/hardening/.results/figures.json. */
export function recordFigure(name: string, value: unknown): void {
  const dir = join(ROOT, "test", "hardening", ".results");
  mkdirSync(dir, { recursive: true });
  const file = join(dir, "figures.json");
  let cur: Record<string, unknown> = {};
  try {
    cur = JSON.parse(readFileSync(file, "utf8"));
  } catch {
    /* first figure */
  }
  cur[name] = value;
  writeFileSync(file, JSON.stringify(cur, null, 2) + "\n");
  process.stderr.write(`[figure] ${name}: ${JSON.stringify(value)}\n`);
}

/**
 * A real HTTP server with the demo policy and a lazy worker (the auth suites never start one),
 * its folder made by tempDir and removed by cleanupTemp.
 */
export async function startLazyDemoServer(): Promise<{ server: HttpServerProc; dataDir: string }> {
  const dir = tempDir();
  const cfg = join(dir, "config.json");
  writeFileSync(
    cfg,
    JSON.stringify(baseConfig(dir, { policy: DEMO_POLICY, runtime: { start: "lazy" } })),
  );
  return { server: await startHttpServer(cfg), dataDir: join(dir, "data") };
}
