// Approval through MCP form elicitation, where the operator opted in (a rule of "assurance":
// "client_form", for a desktop host whose user answers the host's own dialog) and the client
// supports it: only an explicit accept runs the call, recorded as decided by whoever answered the
// client's form, and the start-up banner says what such a rule is worth.
import { ElicitRequestSchema } from "@modelcontextprotocol/sdk/types.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { cli, connectStdio, errorOf, writeConfig } from "../helpers/server.js";
import { call } from "./scenario.js";

describe("approval by elicitation", () => {
  let conn: Awaited<ReturnType<typeof connectStdio>>;
  let answer: { action: "accept" | "decline" | "cancel"; content?: Record<string, unknown> };
  const prompts: any[] = [];
  beforeAll(async () => {
    const config = writeConfig({
      policy: {
        // The desktop host's opt-in: its user answers the host's own dialog.
        approvals: { rules: [{ tool: "load_model", assurance: "client_form" }], elicitation: true },
        limits: { rate_limit: { per_principal_per_minute: 6000 } },
      },
    });
    conn = await connectStdio(config, { capabilities: { elicitation: { form: {} } } });
    conn.transport.stderr?.on("data", (d) => (banner += d.toString()));
    conn.client.setRequestHandler(ElicitRequestSchema, async (req) => {
      prompts.push(req.params);
      return answer;
    });
  });
  let banner = "";
  afterAll(async () => {
    await conn?.close();
  });

  it("says at start-up who approves such a rule: whoever answers the client's form", async () => {
    // The banner is written before the first call is answered.
    expect((await call(conn.client, "list_models", {})).isError).toBeFalsy();
    await expect
      .poll(() => banner)
      .toMatch(
        /client_form rule\(s\) \(load_model\): approved by whoever answers the client's form — an agent that answers its own client's prompts approves its own calls/,
      );
  });

  it("runs the call when the user accepts, showing the tool, arguments and estimate", async () => {
    answer = { action: "accept", content: { approve: true } };
    const r = await call(conn.client, "load_model", { model: "mnist-cnn" });
    expect(r.isError, JSON.stringify(r)).toBeFalsy();
    const p = prompts.at(-1);
    expect(p.message).toMatch(/load_model on model mnist-cnn/);
    expect(JSON.stringify(p.requestedSchema)).toMatch(/mnist-cnn/);
    await call(conn.client, "unload_model", { model: "mnist-cnn" });
  });

  it("does not run it when the user declines, cancels, or accepts without ticking approve", async () => {
    for (const a of [
      { action: "decline" as const },
      { action: "cancel" as const },
      { action: "accept" as const, content: { approve: false } },
    ]) {
      answer = a;
      const r = await call(conn.client, "load_model", { model: "mnist-cnn" });
      expect(errorOf(r)?.code, JSON.stringify(a)).toBe("approval_declined");
    }
    const st = await call(conn.client, "get_runtime_status", {});
    expect(st.structuredContent.loaded.map((m: any) => m.model)).not.toContain("mnist-cnn");
  });
});

describe("approval by elicitation, when the person is slower than the client", () => {
  let conn: Awaited<ReturnType<typeof connectStdio>>;
  let config: string;
  let onPrompt: (message: string) => Promise<{ action: "accept"; content: { approve: true } }>;
  beforeAll(async () => {
    config = writeConfig({
      policy: {
        approvals: {
          rules: [{ tool: "load_model", assurance: "client_form" }],
          elicitation: true,
          elicitation_timeout_s: 3,
        },
        limits: { rate_limit: { per_principal_per_minute: 6000 } },
      },
    });
    conn = await connectStdio(config, { capabilities: { elicitation: { form: {} } } });
    conn.client.setRequestHandler(ElicitRequestSchema, (req) => onPrompt(req.params.message));
    // The worker up and the model's facts known: the prompt comes well within the short timeout.
    expect((await call(conn.client, "check_model", { model: "mnist-cnn" })).isError).toBeFalsy();
  });
  afterAll(async () => {
    await conn?.close();
  });

  const status = async (id: string) => {
    const r = await cli(config, "approvals", "show", id, "--json");
    expect(r.code, r.stderr).toBe(0);
    return JSON.parse(r.stdout);
  };

  it("records an answer given after the client's request timed out; the retry with the approval id runs", async () => {
    let timedOut!: () => void;
    const clientGaveUp = new Promise<void>((r) => (timedOut = r));
    let promptMessage = "";
    // The person answers only once the client has stopped waiting for the call.
    onPrompt = async (message) => {
      promptMessage = message;
      await clientGaveUp;
      return { action: "accept", content: { approve: true } };
    };
    const args = { model: "mnist-cnn", dtype: "float16" };
    // The client's own short timeout is what this is about: a literal, never scaled (scaled, the
    // server's wait for the person ended first and the call was answered).
    await expect(call(conn.client, "load_model", args, { timeout: 2000 })).rejects.toThrow(
      /timed out/i,
    );
    timedOut();
    expect(promptMessage, "the prompt came before the client gave up").toMatch(/approval apr_/);
    const id = /approval (apr_[0-9a-f]{32})/.exec(promptMessage)![1];
    // The answer reaches the server after the call has ended; it is recorded on the approval.
    for (let i = 0; i < 50 && (await status(id)).status === "pending"; i++);
    expect(await status(id)).toMatchObject({
      status: "approved",
      decided_by: "client-form:local-user",
    });
    // The agent's retry without the id is told it, without asking the person again.
    const again = await call(conn.client, "load_model", args);
    expect(errorOf(again)).toMatchObject({
      code: "approval_required",
      details: { approval_id: id, status: "approved" },
    });
    const ok = await call(conn.client, "load_model", { ...args, approval_id: id });
    expect(ok.isError, JSON.stringify(ok)).toBeFalsy();
    expect((await status(id)).status).toBe("used");
    await call(conn.client, "unload_model", { model: "mnist-cnn" });
  });

  it("answers approval_required (not approval_declined) when nobody answers in time; an operator can still approve", async () => {
    onPrompt = () => new Promise(() => {}); // nobody at the desk
    const args = { model: "mnist-cnn", dtype: "bfloat16" };
    const r = await call(conn.client, "load_model", args);
    const e = errorOf(r)!;
    expect(e.code).toBe("approval_required");
    expect(e.details.prompt).toBe("unanswered");
    expect(e.message).toMatch(/Nobody answered .* within 3 s/);
    const id = e.details.approval_id;
    expect((await status(id)).status).toBe("pending");
    const approved = await cli(config, "approvals", "approve", id);
    expect(approved.code, approved.stderr).toBe(0);
    const ok = await call(conn.client, "load_model", { ...args, approval_id: id });
    expect(ok.isError, JSON.stringify(ok)).toBeFalsy();
    await call(conn.client, "unload_model", { model: "mnist-cnn" });
  });
});
