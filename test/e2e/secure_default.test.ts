// Secure by default: a server with no config (what `npm start` serves, on a fresh data dir and
// a random 127.0.0.1 port) runs no benchmark until an operator approves it out of band (the CLI
// command the refusal names, or the console). An answer in the client never decides a default
// rule (issue 33): the agent may be the one answering its client's form, so in neither era and
// on neither transport is it asked, however willingly it would say yes.
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
  connectStdio,
  errorOf,
  startHttpServer,
  writeConfig,
  type HttpServerProc,
} from "../helpers/server.js";
import { call } from "./scenario.js";
import { callModern, connectModernHttp, connectModernStdio } from "../helpers/modern.js";

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
      expect(command).toBe(`node ${CLI} approvals approve ${id} --config '${config}'`);
      // Retrying before a decision does not run it either.
      const early = await call(agent.client, "run_benchmark", { ...BENCH, approval_id: id });
      expect(errorOf(early)?.code).toBe("approval_pending");
      expect(await benchmarksRun()).toBe(0);

      // The human pastes the command into a shell in a new empty folder, exactly as shown (the
      // embedded default's operator token; the config outside the clone, its path quoted).
      const elsewhere = mkdtempSync(join(dir, "paste-"));
      const decided = await run("/bin/sh", ["-c", command!], {
        cwd: elsewhere,
        env: shellEnv({ HOME: elsewhere }),
      });
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

  // The agent holds only the generated local token and answers "yes" to every form its client
  // is shown: under the default rules (assurance "token") nobody asks it, in either era.
  it("in band, 2025 era: a client that answers forms itself is never asked; approval_required names the console and the CLI", async () => {
    const agent = await connectHttp(server.url, server.token, {
      capabilities: { elicitation: { form: {} } },
    });
    const prompts: string[] = [];
    agent.client.setRequestHandler(ElicitRequestSchema, async (req) => {
      prompts.push(req.params.message);
      return { action: "accept", content: { approve: true } };
    });
    try {
      const before = await benchmarksRun();
      const r = await call(agent.client, "run_benchmark", { ...BENCH, iterations: 14 });
      expectOutOfBand(r);
      expect(prompts).toEqual([]);
      expect(await benchmarksRun()).toBe(before);
    } finally {
      await agent.close();
    }
  });

  it("in band, 2026-07-28 era: no input_required, no requestState to answer; approval_required instead", async () => {
    const agent = await connectModernHttp(server.url, server.token, {
      client: { capabilities: { elicitation: { form: {} } } } as any,
    });
    let asked = 0;
    agent.client.setRequestHandler("elicitation/create", async () => {
      asked++;
      return { action: "accept", content: { approve: true } } as any;
    });
    try {
      const before = await benchmarksRun();
      expectOutOfBand(
        await callModern(agent.client, "run_benchmark", { ...BENCH, iterations: 15 }),
      );
      expect(asked).toBe(0);
      expect(await benchmarksRun()).toBe(before);
      // Nothing in the trail is decided by an answer in the client.
      const trail = await cli(config, "audit", "tail", "-n", "1000", "--json");
      expect(trail.stdout).not.toMatch(/client-form:|elicitation:/);
    } finally {
      await agent.close();
    }
  });

  it("says nothing at start-up about answers in the client: no rule allows them", () => {
    expect(server.stderr()).not.toMatch(/whoever answers the client's form/);
  });
});

/** The default rules' answer to an agent that could have been asked: an operator decides. */
function expectOutOfBand(r: any) {
  const e = errorOf(r)!;
  expect(e?.code, JSON.stringify(r).slice(0, 400)).toBe("approval_required");
  expect(e.details.assurance).toBe("token");
  expect(e.details.request_state).toBeUndefined();
  expect(e.details.approve_command).toMatch(/^node \/\S+\/bin\/tpu-mcp\.js approvals approve apr_/);
  expect(e.details.console_url).toMatch(/\/console\/$/);
  expect(e.message).toMatch(/An answer in the client cannot decide this approval/);
}

describe("secure by default over stdio: the agent's own client is never asked", () => {
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-default-stdio-"));
  const config = join(dir, "config.json");
  writeFileSync(config, JSON.stringify({ data_dir: join(dir, "data") }));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it("2025 era: elicitation capable, answering yes itself; the call is not run", async () => {
    const agent = await connectStdio(config, { capabilities: { elicitation: { form: {} } } });
    let asked = 0;
    agent.client.setRequestHandler(ElicitRequestSchema, async () => {
      asked++;
      return { action: "accept", content: { approve: true } };
    });
    try {
      const r = await call(agent.client, "run_benchmark", BENCH);
      const e = errorOf(r)!;
      expect(e?.code, JSON.stringify(r).slice(0, 400)).toBe("approval_required");
      expect(e.details.approve_command).toMatch(/approvals approve apr_/);
      expect(asked).toBe(0);
    } finally {
      await agent.close();
    }
  });

  it("2026-07-28 era: answered approval_required, not input_required", async () => {
    const agent = await connectModernStdio(config, {
      client: { capabilities: { elicitation: { form: {} } } } as any,
    });
    let asked = 0;
    agent.client.setRequestHandler("elicitation/create", async () => {
      asked++;
      return { action: "accept", content: { approve: true } } as any;
    });
    try {
      const r = await callModern(agent.client, "run_benchmark", { ...BENCH, iterations: 3 });
      const e = errorOf(r)!;
      expect(e?.code, JSON.stringify(r).slice(0, 400)).toBe("approval_required");
      expect(asked).toBe(0);
      const trail = await cli(config, "audit", "tail", "-n", "1000", "--json");
      const rows = JSON.parse(trail.stdout);
      expect(
        rows.filter((a: any) => a.tool === "run_benchmark" && a.outcome === "executed"),
      ).toEqual([]);
      expect(rows.filter((a: any) => a.outcome === "approval_granted")).toEqual([]);
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
