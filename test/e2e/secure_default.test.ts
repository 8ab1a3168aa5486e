// Secure by default: a server with no config (what `npm start` serves, on a fresh data dir and
// a random 127.0.0.1 port) runs no benchmark until a human approves it, in band (an elicitation
// answered in the client) or out of band (the CLI command the refusal names, or the console).
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
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
/** A shell's environment as a terminal has it: this Node first on PATH (`node …` commands). */
const shellEnv = (extra: Record<string, string> = {}) => ({
  ...process.env,
  PATH: `${dirname(process.execPath)}:${process.env.PATH ?? ""}`,
  ...extra,
});
const BENCH = { model: "mnist-cnn", batch_sizes: [1], iterations: 2, warmup: 1 };

describe("secure by default: no config, a benchmark waits for a human", () => {
  // A config outside the clone, in a folder whose name the shell would split: the command the
  // refusal prints must still work pasted as it is.
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp default "));
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

  it("out of band: approval_required with the console link and the CLI command a shell runs as shown, then the retry runs", async () => {
    const agent = await connectHttp(server.url, server.token);
    try {
      const first = await call(agent.client, "run_benchmark", BENCH);
      const e = errorOf(first)!;
      expect(e.code).toBe("approval_required");
      const { approval_id: id, console_url } = e.details;
      expect(console_url).toBe(
        server.url.replace(/\/mcp$/, "/console/").replace("//127.0.0.1:", "//localhost:"),
      );
      // What a host shows its user is the text content; _meta is not shown.
      const shown = (first.content as { type: string; text?: string }[])[0].text!;
      expect(shown).not.toContain("<path>");
      expect(shown).toContain(`(${console_url}#/approvals/${id})`);
      const command = /`([^`]+)`/.exec(shown)?.[1];
      expect(command).toMatch(
        new RegExp(`^node bin/tpu-mcp\\.js approvals approve ${id} --config `),
      );
      // Retrying before a decision does not run it either.
      const early = await call(agent.client, "run_benchmark", { ...BENCH, approval_id: id });
      expect(errorOf(early)?.code).toBe("approval_pending");
      expect(await benchmarksRun()).toBe(0);

      // The human pastes the command into a shell in the clone's root, exactly as shown (the
      // embedded default's operator token; the config outside the clone, its path quoted).
      const decided = await run("/bin/sh", ["-c", command!], { cwd: ROOT, env: shellEnv() });
      expect(decided.stdout).toMatch(/^approved: /);

      const ok = await call(agent.client, "run_benchmark", { ...BENCH, approval_id: id });
      expect(ok.isError, JSON.stringify(ok)).toBeFalsy();
      expect(await benchmarksRun()).toBe(1);
    } finally {
      await agent.close();
    }
  });

  it("accepts the generated operator token passed explicitly, with --token or TPU_MCP_TOKEN", async () => {
    const agent = await connectHttp(server.url, server.token);
    try {
      const request = async (iterations: number) =>
        errorOf(await call(agent.client, "run_benchmark", { ...BENCH, iterations }))!.details
          .approval_id as string;
      const tokenFile = join(dir, "data", "operator-token");
      const byFlag = await request(5);
      const flag = await run(
        "/bin/sh",
        [
          "-c",
          `node bin/tpu-mcp.js approvals approve ${byFlag} --config "$CONFIG" --token "$(cat "$TOKEN_FILE")"`,
        ],
        { cwd: ROOT, env: shellEnv({ CONFIG: config, TOKEN_FILE: tokenFile }) },
      );
      expect(flag.stdout).toMatch(/^approved: /);
      const byEnv = await request(6);
      const env = await run(
        "/bin/sh",
        [
          "-c",
          `TPU_MCP_TOKEN="$(cat "$TOKEN_FILE")" node bin/tpu-mcp.js approvals approve ${byEnv} --config "$CONFIG"`,
        ],
        { cwd: ROOT, env: shellEnv({ CONFIG: config, TOKEN_FILE: tokenFile }) },
      );
      expect(env.stdout).toMatch(/^approved: /);
      // A token that is not the operator's is still refused.
      const wrong = await request(7);
      await expect(
        run(process.execPath, [CLI, "approvals", "approve", wrong, "--config", config], {
          cwd: ROOT,
          env: { ...process.env, TPU_MCP_TOKEN: server.token },
        }),
      ).rejects.toMatchObject({ stderr: expect.stringMatching(/approvals:grant|refused/) });
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
      expect(prompts[1]).toMatch(/run_benchmark on model mnist-cnn/);
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
