// The MCP Inspector (the reference client, 2.12) in both of its protocol eras, through its CLI
// (scripts/inspector.sh): every tool over HTTP against one running server, the approval decided
// out of band and used with approval_id, and a stdio server in the modern era. The Inspector's
// CLI cannot answer a form, so in-band approval is covered by the SDK clients
// (test/e2e/modern.test.ts, test/e2e/python_client.test.ts).
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  CLI,
  cli,
  DEMO_POLICY,
  DEMO_TOKENS,
  startHttpServer,
  writeConfig,
  type HttpServerProc,
} from "../helpers/server.js";
import { ROOT } from "./helpers.js";
import { scaled } from "../helpers/calibrate.js";

const run = promisify(execFile);
const SERVER_INFO = "io.modelcontextprotocol/serverInfo";

async function inspector(args: string[]): Promise<any> {
  try {
    const r = await run(
      "bash",
      [join(ROOT, "scripts/inspector.sh"), "--format", "json", "-q", ...args],
      {
        cwd: ROOT,
        timeout: scaled(240_000),
        maxBuffer: 64 * 1024 * 1024,
      },
    );
    return JSON.parse(r.stdout);
  } catch (e: any) {
    // A tool result with isError exits non-zero (exit code 5) but prints the result all the same.
    const out = String(e.stdout ?? "");
    if (out.startsWith("{") && JSON.parse(out).result) return JSON.parse(out);
    throw new Error(
      `inspector failed: ${String(e.stdout ?? "").slice(0, 2000)}\n${String(e.stderr ?? e).slice(-2000)}`,
    );
  }
}

describe.each(["legacy", "modern"])("the MCP Inspector, %s era, over HTTP", (era) => {
  let srv: HttpServerProc;
  let config: string;
  beforeAll(async () => {
    config = writeConfig({
      policy: {
        ...DEMO_POLICY,
        limits: { ...DEMO_POLICY.limits, rate_limit: { per_principal_per_minute: 6000 } },
      },
    });
    srv = await startHttpServer(config);
  }, scaled(120_000));
  afterAll(async () => srv?.stop());

  const toolCall = async (tool: string, args: Record<string, unknown> = {}) => {
    const out = await inspector([
      "--server-url",
      srv.url,
      "--transport",
      "http",
      "--header",
      `Authorization: Bearer ${DEMO_TOKENS.agent}`,
      "--protocol-era",
      era,
      "--method",
      "tools/call",
      "--tool-name",
      tool,
      "--tool-args-json",
      JSON.stringify(args),
    ]);
    const result = out.result ?? out;
    // Only 2026-07-28 results carry the server's identity in every response's _meta.
    expect(result._meta?.[SERVER_INFO] !== undefined, `${tool}: era marker`).toBe(era === "modern");
    return result;
  };
  const errorCode = (r: any) => r._meta?.["tpu-mcp/error"]?.code;
  const approve = async (r: any) => {
    expect(errorCode(r)).toBe("approval_required");
    const id = r._meta["tpu-mcp/error"].details.approval_id;
    const ok = await cli(config, "approvals", "approve", id, "--token", DEMO_TOKENS.operator);
    expect(ok.code, ok.stderr).toBe(0);
    return id as string;
  };

  it(
    "uses every tool, with a benchmark approved out of band",
    { timeout: scaled(600_000) },
    async () => {
      const status = await toolCall("get_runtime_status");
      expect(status.isError, JSON.stringify(status).slice(0, 300)).toBeFalsy();
      expect(status.structuredContent).toBeDefined();
      const models = (await toolCall("list_models")).structuredContent.models.map((m: any) => m.id);
      expect(models).toContain("mnist-cnn");
      expect((await toolCall("check_model", { model: "mnist-cnn" })).isError).toBeFalsy();
      expect((await toolCall("load_model", { model: "mnist-cnn" })).isError).toBeFalsy();
      const image = { dtype: "float32", shape: [1, 1, 28, 28], data: new Array(784).fill(0) };
      const inf = await toolCall("run_inference", { model: "mnist-cnn", tensors: [image] });
      expect(inf.isError, JSON.stringify(inf).slice(0, 300)).toBeFalsy();

      const bench = { model: "mnist-cnn", batch_sizes: [1], iterations: 3, warmup: 1 };
      const id = await approve(await toolCall("run_benchmark", bench));
      const ran = await toolCall("run_benchmark", { ...bench, approval_id: id });
      expect(ran.isError, JSON.stringify(ran).slice(0, 300)).toBeFalsy();
      expect(ran.structuredContent.configs).toHaveLength(1);

      const long = { model: "mnist-cnn", batch_sizes: [1, 2, 4], iterations: 5000, wait: false };
      const id2 = await approve(await toolCall("run_benchmark", long));
      const job = (await toolCall("run_benchmark", { ...long, approval_id: id2 }))
        .structuredContent;
      expect(job.job_id).toMatch(/^job_/);
      expect((await toolCall("get_job", { job_id: job.job_id })).structuredContent.job_id).toBe(
        job.job_id,
      );
      const cancelled = await toolCall("cancel_job", { job_id: job.job_id });
      expect(cancelled.isError, JSON.stringify(cancelled).slice(0, 300)).toBeFalsy();
      expect((await toolCall("unload_model", { model: "mnist-cnn" })).isError).toBeFalsy();
    },
  );
});

describe("the MCP Inspector over stdio", () => {
  it.each(["legacy", "modern"])("%s era: a fresh server per CLI call answers", async (era) => {
    const config = writeConfig({});
    const out = await inspector([
      "--protocol-era",
      era,
      "--method",
      "tools/call",
      "--tool-name",
      "list_models",
      "--",
      process.execPath,
      CLI,
      "stdio",
      "--config",
      config,
    ]);
    const result = out.result ?? out;
    expect(result.isError).toBeFalsy();
    expect(result._meta?.[SERVER_INFO] !== undefined).toBe(era === "modern");
  });
});

describe("the README's Inspector commands, as written", () => {
  let srv: HttpServerProc;
  beforeAll(async () => {
    // What `npm start` serves: no tokens in the config, so the server generates the agent's.
    const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-readme-inspector-"));
    const config = join(dir, "config.json");
    writeFileSync(config, JSON.stringify({ data_dir: join(dir, "data") }));
    srv = await startHttpServer(config);
  }, scaled(120_000));
  afterAll(async () => srv?.stop());

  it(
    "runs each scripts/inspector.sh command of the README against a running server",
    { timeout: scaled(600_000) },
    async () => {
      const readme = readFileSync(join(ROOT, "README.md"), "utf8");
      const block = /```sh\n(TOKEN=\$\(cat \.data\/local-token\)[^\n]*\n[\s\S]*?)```/.exec(readme);
      expect(block, "the README's Inspector block").not.toBeNull();
      const commands = block![1]
        .replace(/\\\n\s*/g, " ")
        .split("\n")
        .filter((l) => l.startsWith("scripts/inspector.sh"));
      expect(commands.length).toBeGreaterThan(0);
      for (const command of commands) {
        const r = await run(
          "bash",
          ["-c", command.replaceAll("http://127.0.0.1:7801/mcp", srv.url)],
          {
            cwd: ROOT,
            env: { ...process.env, TOKEN: srv.token! },
            timeout: scaled(240_000),
            maxBuffer: 64 * 1024 * 1024,
          },
        );
        // Exit 0 (a tool error exits 5): the call ran and answered.
        expect(r.stdout.length, command).toBeGreaterThan(0);
      }
    },
  );
});
