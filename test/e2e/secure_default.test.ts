// Secure by default: a server with no config (what `npm start` serves, on a fresh data dir and
// a random 127.0.0.1 port) runs no benchmark until a human approves it, in band (an elicitation
// answered in the client) or out of band (the CLI command the refusal names, or the console).
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { ElicitRequestSchema } from "@modelcontextprotocol/sdk/types.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  CLI,
  ROOT,
  cli,
  connectHttp,
  errorOf,
  startHttpServer,
  writeConfig,
  type HttpServerProc,
} from "../helpers/server.js";
import { call } from "./scenario.js";

const run = promisify(execFile);
const BENCH = { model: "mnist-cnn", batch_sizes: [1], iterations: 2, warmup: 1 };

describe("secure by default: no config, a benchmark waits for a human", () => {
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-default-"));
  // Only the data dir differs from `npm start` (the shared .data is not this test's to change);
  // the first test shows the effective policy is exactly the no-config one.
  const config = join(dir, "config.json");
  writeFileSync(config, JSON.stringify({ data_dir: join(dir, "data") }));
  let server: HttpServerProc;
  beforeAll(async () => {
    server = await startHttpServer(config);
  });
  afterAll(async () => {
    await server?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  /** Benchmarks that really ran: the audit trail's `executed` records for run_benchmark. */
  const benchmarksRun = async () => {
    const r = await cli(config, "audit", "tail", "-n", "1000", "--json");
    expect(r.code, r.stderr).toBe(0);
    return JSON.parse(r.stdout).filter(
      (a: any) => a.tool === "run_benchmark" && a.outcome === "executed",
    ).length;
  };

  it("has the default rules as data, the same as with no config at all", async () => {
    const none = await run(process.execPath, [CLI, "config", "show"], { cwd: ROOT });
    const ours = await cli(config, "config", "show");
    const policy = (s: string) => JSON.parse(s).policy;
    expect(policy(ours.stdout)).toEqual(policy(none.stdout));
    expect(policy(none.stdout).approvals.rules).toContainEqual({
      tool: "run_benchmark",
      assurance: "token",
    });
    expect(server.stderr()).not.toMatch(/approvals are OFF/);
  });

  it("out of band: approval_required with the console URL and the exact CLI command, then the retry runs", async () => {
    const agent = await connectHttp(server.url, server.token);
    try {
      const first = await call(agent.client, "run_benchmark", BENCH);
      const e = errorOf(first)!;
      expect(e.code).toBe("approval_required");
      const { approval_id: id, approve_command: command, console_url } = e.details;
      expect(console_url).toBe(
        server.url.replace(/\/mcp$/, "/console/").replace("//127.0.0.1:", "//localhost:"),
      );
      // The message has it too (paths scrubbed from messages; details keep the exact command).
      expect(e.message).toContain(`node bin/tpu-mcp.js approvals approve ${id}`);
      // Retrying before a decision does not run it either.
      const early = await call(agent.client, "run_benchmark", { ...BENCH, approval_id: id });
      expect(errorOf(early)?.code).toBe("approval_pending");
      expect(await benchmarksRun()).toBe(0);

      // The human runs the command exactly as given (the embedded default's operator token).
      const [node, script, ...args] = command.split(" ");
      expect([node, script]).toEqual(["node", "bin/tpu-mcp.js"]);
      const decided = await run(process.execPath, [join(ROOT, script), ...args], { cwd: ROOT });
      expect(decided.stdout).toMatch(/^approved: /);

      const ok = await call(agent.client, "run_benchmark", { ...BENCH, approval_id: id });
      expect(ok.isError, JSON.stringify(ok)).toBeFalsy();
      expect(await benchmarksRun()).toBe(1);
    } finally {
      await agent.close();
    }
  });

  it("out of band in the console: the operator signs in with the generated operator token", async () => {
    const agent = await connectHttp(server.url, server.token);
    try {
      const args = { ...BENCH, iterations: 3 };
      const id = errorOf(await call(agent.client, "run_benchmark", args))!.details.approval_id;
      const base = server.url.replace(/\/mcp$/, "");
      const token = readFileSync(join(dir, "data", "operator-token"), "utf8").trim();
      const signIn = await fetch(`${base}/console/api/session`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ token }),
      });
      expect(signIn.status).toBe(200);
      const { csrf } = await signIn.json();
      const cookie = (signIn.headers.get("set-cookie") ?? "").split(";")[0];
      // The agent's own token cannot sign in to decide.
      const agentSignIn = await fetch(`${base}/console/api/session`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ token: server.token }),
      });
      expect(agentSignIn.status).toBe(403);
      const before = await benchmarksRun();
      const decide = await fetch(`${base}/console/api/approvals/${id}/approve`, {
        method: "POST",
        headers: { cookie, "x-csrf-token": csrf, "content-type": "application/json" },
        body: "{}",
      });
      expect(decide.status).toBe(200);
      const ok = await call(agent.client, "run_benchmark", { ...args, approval_id: id });
      expect(ok.isError, JSON.stringify(ok)).toBeFalsy();
      expect(await benchmarksRun()).toBe(before + 1);
    } finally {
      await agent.close();
    }
  });

  it("in band: a client that can ask its user gets the question; only a yes runs it", async () => {
    const agent = await connectHttp(server.url, server.token, {
      capabilities: { elicitation: { form: {} } },
    });
    const prompts: string[] = [];
    let approve = false;
    agent.client.setRequestHandler(ElicitRequestSchema, async (req) => {
      prompts.push(req.params.message);
      return { action: "accept", content: { approve } };
    });
    try {
      const args = { ...BENCH, iterations: 4 };
      const before = await benchmarksRun();
      const no = await call(agent.client, "run_benchmark", args);
      expect(errorOf(no)?.code).toBe("approval_declined");
      expect(await benchmarksRun()).toBe(before);
      approve = true;
      const yes = await call(agent.client, "run_benchmark", args);
      expect(yes.isError, JSON.stringify(yes)).toBeFalsy();
      expect(prompts).toHaveLength(2);
      expect(prompts[1]).toMatch(/run_benchmark/);
      expect(await benchmarksRun()).toBe(before + 1);
    } finally {
      await agent.close();
    }
  });
});

describe("approvals off: one explicit config line", () => {
  it("logs at start-up that the server runs without approvals", async () => {
    const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-noapprovals-"));
    // writeConfig's policy is the line itself: "approvals": {"rules": []}.
    const server = await startHttpServer(
      writeConfig({ runtime: { start: "lazy", device: "cpu" } }, dir),
    );
    try {
      expect(server.stderr()).toMatch(/approvals are OFF/);
    } finally {
      await server.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
