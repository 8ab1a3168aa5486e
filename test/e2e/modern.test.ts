// The 2026-07-28 era end to end, with the official SDK v2 client pinned to that revision (and in
// its `auto` negotiation) over HTTP and stdio: every tool through the same dispatch and gate as
// the 2025 era, progress and cancellation on the request's own stream, jobs bound to their
// principal, MCP Apps through the extension, approval in band (input_required + a sealed
// requestState) and out of band, and the hostile cases the stateless era opens: forged,
// replayed, other-principal and other-call states, contradicting headers, a missing version.
import { createHash } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  callModern,
  connectModernHttp,
  connectModernStdio,
  MODERN,
  type SentRequest,
} from "../helpers/modern.js";
import {
  cli,
  DEMO_POLICY,
  DEMO_TOKENS,
  errorOf,
  startHttpServer,
  writeConfig,
  type HttpServerProc,
} from "../helpers/server.js";
import { BAD_INPUTS, coreJourney } from "./scenario.js";
import { scaled } from "../helpers/calibrate.js";

const AGENT2 = "demo-agent2-token";
const sha = (t: string) => createHash("sha256").update(t).digest("hex");
const agent = DEMO_POLICY.tokens.find((t: any) => t.id === "agent");
/** The demo policy plus a second agent, so that one agent can try another's state and jobs. */
function policy(approvals: Record<string, unknown>) {
  return {
    ...DEMO_POLICY,
    tokens: [...DEMO_POLICY.tokens, { ...agent, id: "agent2", token_sha256: sha(AGENT2) }],
    limits: { ...DEMO_POLICY.limits, rate_limit: { per_principal_per_minute: 6000 } },
    approvals,
  };
}
const UI_CAPS = {
  extensions: { "io.modelcontextprotocol/ui": { mimeTypes: ["text/html;profile=mcp-app"] } },
};
const ELICIT_CAPS = { capabilities: { elicitation: { form: {} } } };

async function auditTail(config: string) {
  return (await cli(config, "audit", "tail", "-n", "200")).stdout;
}

describe("2026-07-28 over HTTP", () => {
  let srv: HttpServerProc;
  let config: string;
  beforeAll(async () => {
    config = writeConfig({ policy: policy({ rules: [] }) });
    srv = await startHttpServer(config);
  });
  afterAll(async () => srv?.stop());

  it("a pinned client lands in the modern era and runs the whole journey", async () => {
    const c = await connectModernHttp(srv.url, DEMO_TOKENS.agent);
    try {
      expect(c.client.getProtocolEra()).toBe("modern");
      await coreJourney(c.client);
    } finally {
      await c.close();
    }
  });

  it("the default negotiation of the v2 client stays in the 2025 era; `auto` finds the modern one", async () => {
    const plain = await connectModernHttp(srv.url, DEMO_TOKENS.agent, { mode: "default" });
    expect(plain.client.getProtocolEra()).toBe("legacy");
    await coreJourney(plain.client);
    await plain.close();
    const auto = await connectModernHttp(srv.url, DEMO_TOKENS.agent, { mode: "auto" });
    expect(auto.client.getProtocolEra()).toBe("modern");
    await auto.close();
  });

  it("refuses every bad input with its code while it keeps serving", async () => {
    const c = await connectModernHttp(srv.url, DEMO_TOKENS.agent);
    try {
      for (const [tool, args, code] of BAD_INPUTS) {
        const r = await callModern(c.client, tool, args as Record<string, unknown>);
        expect(errorOf(r)?.code, `${tool} ${JSON.stringify(args).slice(0, 80)}`).toBe(code);
      }
    } finally {
      await c.close();
    }
  });

  it("streams progress on the request's stream, and closing it cancels the work", async () => {
    const c = await connectModernHttp(srv.url, DEMO_TOKENS.agent);
    try {
      const seen: number[] = [];
      const ok = await callModern(
        c.client,
        "run_benchmark",
        { model: "mnist-cnn", batch_sizes: [1, 2], iterations: 3, warmup: 1 },
        { onprogress: (p: { progress: number }) => seen.push(p.progress) },
      );
      expect(ok.isError, JSON.stringify(ok).slice(0, 300)).toBeFalsy();
      expect(seen.length).toBeGreaterThan(0);

      const ctrl = new AbortController();
      const started = new Promise<void>((resolve) => {
        void callModern(
          c.client,
          "run_benchmark",
          { model: "tiny-gpt2", batch_sizes: [1, 2, 4, 8], iterations: 10000, warmup: 1 },
          { signal: ctrl.signal, onprogress: () => resolve() },
        ).catch(() => {});
      });
      await started;
      ctrl.abort();
      // The device is free again: the cancelled benchmark does not hold its slot.
      const next = await callModern(c.client, "check_model", { model: "mnist-cnn" });
      expect(next.isError, JSON.stringify(next).slice(0, 300)).toBeFalsy();
      await expect.poll(() => auditTail(config), { timeout: scaled(30_000) }).toMatch(/cancelled/);
    } finally {
      await c.close();
    }
  });

  it("a job belongs to the principal that started it, not to whoever holds its id", async () => {
    const a = await connectModernHttp(srv.url, DEMO_TOKENS.agent);
    const b = await connectModernHttp(srv.url, AGENT2);
    try {
      const started = await callModern(a.client, "run_benchmark", {
        model: "mnist-cnn",
        batch_sizes: [1],
        iterations: 3,
        wait: false,
      });
      const jobId = started.structuredContent.job_id;
      expect(jobId).toMatch(/^job_/);
      expect(errorOf(await callModern(b.client, "get_job", { job_id: jobId }))?.code).toBe(
        "job_not_found",
      );
      expect(errorOf(await callModern(b.client, "cancel_job", { job_id: jobId }))?.code).toBe(
        "job_not_found",
      );
      // Both refusals are in the audit trail, under the principal that tried.
      const tail = await auditTail(config);
      expect(tail).toMatch(/agent2 get_job .*job_not_found/);
      expect(tail).toMatch(/agent2 cancel_job .*job_not_found/);
      await expect
        .poll(
          async () =>
            (await callModern(a.client, "get_job", { job_id: jobId })).structuredContent.status,
          { timeout: scaled(60_000) },
        )
        .toBe("succeeded");
    } finally {
      await a.close();
      await b.close();
    }
  });

  it("advertises MCP Apps under extensions and lists the views for a client that has them", async () => {
    const c = await connectModernHttp(srv.url, DEMO_TOKENS.agent, {
      client: { capabilities: UI_CAPS } as any,
    });
    try {
      expect(c.client.getServerCapabilities()?.extensions).toHaveProperty(
        "io.modelcontextprotocol/ui",
      );
      const tools = await c.client.listTools();
      const bench = tools.tools.find((t) => t.name === "run_benchmark")!;
      expect((bench._meta as any)?.ui?.resourceUri).toMatch(/^ui:\/\//);
      const views = await c.client.listResources();
      expect(views.resources.map((r) => r.uri)).toContain((bench._meta as any).ui.resourceUri);
    } finally {
      await c.close();
    }
  });

  it("marks the per-principal tools/list private, in a fixed order", async () => {
    const raw = await fetch(srv.url, {
      method: "POST",
      headers: {
        authorization: `Bearer ${DEMO_TOKENS.reader}`,
        "content-type": "application/json",
        accept: "application/json, text/event-stream",
        "mcp-protocol-version": MODERN,
        "mcp-method": "tools/list",
      },
      body: JSON.stringify({
        jsonrpc: "2.0",
        id: 1,
        method: "tools/list",
        params: {
          _meta: {
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": {},
          },
        },
      }),
    });
    const text = await raw.text();
    const msg = JSON.parse(text.startsWith("{") ? text : /data: (.*)/.exec(text)![1]);
    expect(msg.result.cacheScope).toBe("private");
    // The reader sees only what it may call.
    expect(msg.result.tools.map((t: any) => t.name)).toEqual([
      "get_runtime_status",
      "list_models",
      "check_model",
    ]);
  });
});

describe("2026-07-28 approvals and hostile retries (HTTP)", () => {
  let srv: HttpServerProc;
  let config: string;
  beforeAll(async () => {
    config = writeConfig({
      // The opt-in: an answer in the client decides this rule (whoever answers the form).
      policy: policy({
        rules: [{ tool: "load_model", assurance: "client_form" }],
        elicitation: true,
        elicitation_timeout_s: 120,
      }),
    });
    srv = await startHttpServer(config);
  });
  afterAll(async () => srv?.stop());

  /** A client that answers the approval form with `answer`, recording what it sends. */
  async function asker(token: string, answer: Record<string, unknown>, sent?: SentRequest[]) {
    const c = await connectModernHttp(srv.url, token, { client: ELICIT_CAPS as any, sent });
    const prompts: any[] = [];
    c.client.setRequestHandler("elicitation/create", async (req: any) => {
      prompts.push(req.params);
      return answer as any;
    });
    return { ...c, prompts };
  }

  /** Re-sends a recorded request, optionally altered, with a token; the JSON-RPC answer. */
  async function resend(r: SentRequest, token: string, alter?: (body: any) => void) {
    const body = structuredClone(r.body);
    body.id = 9000 + Math.floor(Math.random() * 1000);
    alter?.(body);
    const res = await fetch(srv.url, {
      method: "POST",
      headers: { ...r.headers, authorization: `Bearer ${token}` },
      body: JSON.stringify(body),
    });
    const text = await res.text();
    return JSON.parse(text.startsWith("{") ? text : /data: (.*)/.exec(text)![1]);
  }

  let retry: SentRequest;

  it("asks in band with input_required and runs the call once the user accepts", async () => {
    const sent: SentRequest[] = [];
    const c = await asker(
      DEMO_TOKENS.agent,
      { action: "accept", content: { approve: true } },
      sent,
    );
    try {
      const r = await callModern(c.client, "load_model", { model: "mnist-cnn" });
      expect(r.isError, JSON.stringify(r).slice(0, 400)).toBeFalsy();
      expect(c.prompts).toHaveLength(1);
      expect(c.prompts[0].message).toMatch(/load_model/);
      expect(JSON.stringify(c.prompts[0].requestedSchema)).toMatch(/mnist-cnn/);
      retry = sent.find((s) => s.body?.params?.requestState !== undefined)!;
      expect(retry, "the client retried with the requestState").toBeDefined();
      await callModern(c.client, "unload_model", { model: "mnist-cnn" });
      const tail = await auditTail(config);
      expect(tail).toMatch(/approval_requested \(input_required\)/);
      expect(tail).toMatch(/approval_granted — accepted in the client/);
    } finally {
      await c.close();
    }
  });

  it("does not run it when the user declines", async () => {
    const c = await asker(DEMO_TOKENS.agent, { action: "decline" });
    try {
      const r = await callModern(c.client, "load_model", { model: "mnist-cnn" });
      expect(errorOf(r)?.code).toBe("approval_declined");
    } finally {
      await c.close();
    }
  });

  it("refuses a replayed state: each answer decides its approval once", async () => {
    const r = await resend(retry, DEMO_TOKENS.agent);
    expect(r.result?.isError, JSON.stringify(r).slice(0, 400)).toBe(true);
    expect(errorOf(r.result)?.code).toBe("invalid_request_state");
    expect(errorOf(r.result)?.details?.why).toBe("replayed");
  });

  it("refuses a forged state (altered payload or MAC)", async () => {
    const r = await resend(retry, DEMO_TOKENS.agent, (b) => {
      const [v, body, mac] = String(b.params.requestState).split(".");
      const payload = JSON.parse(Buffer.from(body, "base64url").toString("utf8"));
      payload.a = "apr_forged";
      b.params.requestState = `${v}.${Buffer.from(JSON.stringify(payload)).toString("base64url")}.${mac}`;
    });
    expect(errorOf(r.result)?.code).toBe("invalid_request_state");
    expect(errorOf(r.result)?.details?.why).toBe("mac");
    const junk = await resend(retry, DEMO_TOKENS.agent, (b) => (b.params.requestState = "x"));
    expect(errorOf(junk.result)?.details?.why).toBe("malformed");
  });

  it("refuses a state used by another principal, and one carried to other arguments", async () => {
    const other = await resend(retry, AGENT2);
    expect(errorOf(other.result)?.code).toBe("invalid_request_state");
    expect(errorOf(other.result)?.details?.why).toBe("principal");
    const moved = await resend(retry, DEMO_TOKENS.agent, (b) => {
      b.params.arguments = { ...b.params.arguments, dtype: "bfloat16" };
    });
    expect(errorOf(moved.result)?.details?.why).toBe("call");
    const tail = await auditTail(config);
    expect(tail).toMatch(/invalid_request_state/);
  });

  it("refuses contradicting Mcp-Method / Mcp-Name headers and a missing protocol version, audited", async () => {
    const base = { ...retry, headers: { ...retry.headers } };
    const m = await fetch(srv.url, {
      method: "POST",
      headers: {
        ...base.headers,
        authorization: `Bearer ${DEMO_TOKENS.agent}`,
        "mcp-method": "tools/list",
      },
      body: JSON.stringify({ ...retry.body, id: 77 }),
    });
    expect(m.status).toBe(400);
    expect((await m.json()).error.code).toBe(-32020);
    const n = await fetch(srv.url, {
      method: "POST",
      headers: {
        ...base.headers,
        authorization: `Bearer ${DEMO_TOKENS.agent}`,
        "mcp-name": "unload_model",
      },
      body: JSON.stringify({ ...retry.body, id: 78 }),
    });
    expect(n.status).toBe(400);
    expect((await n.json()).error.message).toMatch(/Mcp-Name/);
    // For resources/read, Mcp-Name names the URI: another one is refused, the same one is read.
    const read = (name: string, id: number) =>
      fetch(srv.url, {
        method: "POST",
        headers: {
          ...base.headers,
          authorization: `Bearer ${DEMO_TOKENS.agent}`,
          "mcp-method": "resources/read",
          "mcp-name": name,
        },
        body: JSON.stringify({
          jsonrpc: "2.0",
          id,
          method: "resources/read",
          params: { uri: "ui://tpu-mcp/benchmark-view.html", _meta: retry.body.params._meta },
        }),
      });
    const wrongUri = await read("ui://tpu-mcp/other.html", 80);
    expect(wrongUri.status).toBe(400);
    expect((await wrongUri.json()).error.message).toMatch(
      /Mcp-Name header "ui:\/\/tpu-mcp\/other.html" does not match the body's "ui:\/\/tpu-mcp\/benchmark-view.html"/,
    );
    const sameUri = await read("ui://tpu-mcp/benchmark-view.html", 81);
    expect(sameUri.status, await sameUri.clone().text()).toBe(200);
    const body = structuredClone(retry.body);
    delete body.params._meta["io.modelcontextprotocol/protocolVersion"];
    const v = await fetch(srv.url, {
      method: "POST",
      headers: { ...base.headers, authorization: `Bearer ${DEMO_TOKENS.agent}` },
      body: JSON.stringify({ ...body, id: 79 }),
    });
    expect(v.status).toBe(400);
    expect((await v.json()).error.message).toMatch(/protocol version/);
    const tail = await auditTail(config);
    expect(tail).toMatch(/invalid_request.*Mcp-Method/);
    expect(tail).toMatch(/invalid_request.*Mcp-Name header.*other\.html/);
    expect(tail).toMatch(/invalid_request.*protocol version/);
  });

  it("approves out of band (CLI) for a client that cannot show a form, then runs with approval_id", async () => {
    const c = await connectModernHttp(srv.url, DEMO_TOKENS.agent);
    try {
      const first = await callModern(c.client, "load_model", { model: "mnist-cnn" });
      expect(errorOf(first)?.code).toBe("approval_required");
      const id = errorOf(first)!.details.approval_id;
      const ok = await cli(config, "approvals", "approve", id, "--token", DEMO_TOKENS.operator);
      expect(ok.code, ok.stderr).toBe(0);
      const run = await callModern(c.client, "load_model", { model: "mnist-cnn", approval_id: id });
      expect(run.isError, JSON.stringify(run).slice(0, 300)).toBeFalsy();
      await callModern(c.client, "unload_model", { model: "mnist-cnn" });
    } finally {
      await c.close();
    }
  });
});

describe("2026-07-28 over stdio", () => {
  it(
    "pins the connection's era, runs the journey and asks in band",
    { timeout: scaled(300_000) },
    async () => {
      const config = writeConfig({
        policy: {
          ...policy({
            rules: [{ tool: "check_model", assurance: "client_form" }],
            elicitation: true,
          }),
        },
      });
      const c = await connectModernStdio(config, { client: ELICIT_CAPS as any });
      try {
        expect(c.client.getProtocolEra()).toBe("modern");
        let asked = 0;
        c.client.setRequestHandler("elicitation/create", async () => {
          asked++;
          return { action: "accept", content: { approve: true } } as any;
        });
        await coreJourney(c.client);
        const r = await callModern(c.client, "check_model", { model: "mnist-cnn" });
        expect(r.isError, JSON.stringify(r).slice(0, 300)).toBeFalsy();
        expect(asked).toBe(1);
      } finally {
        await c.close();
      }
    },
  );
});

describe("2026-07-28 soft deadline", () => {
  let srv: HttpServerProc;
  beforeAll(async () => {
    const config = writeConfig({
      policy: { ...policy({ rules: [] }), limits: { ...policy({}).limits, soft_deadline_s: 3 } },
    });
    srv = await startHttpServer(config);
  });
  afterAll(async () => srv?.stop());

  it("hands a call that outlives the soft deadline over to a job, which get_job follows", async () => {
    const c = await connectModernHttp(srv.url, DEMO_TOKENS.agent);
    try {
      const r = await callModern(c.client, "run_benchmark", {
        model: "mnist-cnn",
        duration_s: 6,
        warmup: 0,
      });
      expect(r.isError, JSON.stringify(r).slice(0, 300)).toBeFalsy();
      const jobId = r.structuredContent.job_id;
      expect(jobId).toMatch(/^job_/);
      await expect
        .poll(
          async () =>
            (await callModern(c.client, "get_job", { job_id: jobId })).structuredContent.status,
          { timeout: scaled(60_000), interval: 500 },
        )
        .toBe("succeeded");
    } finally {
      await c.close();
    }
  });
});
