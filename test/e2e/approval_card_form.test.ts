// The approval card inside the host's form (SEP-3118, app-rendered elicitation, draft): a client
// that declares form elicitation and `elicitation` inside the MCP Apps extension gets the approval
// form with `_meta.ui.resourceUri` naming the approval card, in both eras (a pushed
// elicitation/create in 2025-11-25, the form inside input_required in 2026-07-28); the form
// itself is unchanged, so a host that cannot run the card still shows it. A client with the
// extension but not its elicitation, or with neither, gets today's form without `_meta`.
import { ElicitRequestSchema } from "@modelcontextprotocol/sdk/types.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { callModern, connectModernHttp } from "../helpers/modern.js";
import {
  DEMO_POLICY,
  DEMO_TOKENS,
  connectStdio,
  startHttpServer,
  writeConfig,
  type HttpServerProc,
} from "../helpers/server.js";
import { call } from "./scenario.js";

const UI = "io.modelcontextprotocol/ui";
const MIME = "text/html;profile=mcp-app";
const CARD = "ui://tpu-mcp/approval-card.html";
const FORM = { elicitation: { form: {} } };
/** Three clients: the card in the form, the extension without it, no extension at all. */
const CLIENTS = {
  renders: { ...FORM, extensions: { [UI]: { mimeTypes: [MIME], elicitation: {} } } },
  appsOnly: { ...FORM, extensions: { [UI]: { mimeTypes: [MIME] } } },
  plain: FORM,
} as const;

const POLICY = {
  ...DEMO_POLICY,
  limits: { ...DEMO_POLICY.limits, rate_limit: { per_principal_per_minute: 6000 } },
  approvals: {
    rules: [{ tool: "load_model", assurance: "client_form" }],
    elicitation: true,
    elicitation_timeout_s: 120,
  },
};
/** Declined: the form is what is tested, and nothing loads. */
const DECLINE = { action: "decline" } as const;

describe("the approval card in the form, 2025-11-25 (stdio, pushed elicitation)", () => {
  const config = writeConfig({ policy: POLICY });

  async function formOf(caps: Record<string, unknown>) {
    const conn = await connectStdio(config, { capabilities: caps as any });
    const prompts: any[] = [];
    conn.client.setRequestHandler(ElicitRequestSchema, async (req) => {
      prompts.push(req.params);
      return DECLINE;
    });
    try {
      const r = await call(conn.client, "load_model", { model: "mnist-cnn" });
      expect(r.isError).toBe(true);
      expect(prompts).toHaveLength(1);
      return { prompt: prompts[0], server: conn.client.getServerCapabilities() as any };
    } finally {
      await conn.close();
    }
  }

  it("names the approval card on the form for a client that renders app forms", async () => {
    const { prompt, server } = await formOf(CLIENTS.renders);
    expect(server.extensions[UI]).toEqual({ elicitation: {} });
    expect(prompt._meta?.ui).toEqual({ resourceUri: CARD });
    // The native form is complete beside it: the fallback of a host that cannot run the card.
    expect(prompt.mode).toBe("form");
    expect(prompt.message).toMatch(/load_model on model mnist-cnn/);
    expect(JSON.stringify(prompt.requestedSchema)).toMatch(/approve/);
  });

  it("keeps today's form for a client with the extension but not its elicitation, or neither", async () => {
    for (const caps of [CLIENTS.appsOnly, CLIENTS.plain]) {
      const { prompt } = await formOf(caps);
      expect(prompt._meta?.ui, JSON.stringify(caps)).toBeUndefined();
      expect(prompt.message).toMatch(/load_model on model mnist-cnn/);
    }
  });
});

describe("the approval card in the form, 2026-07-28 (HTTP, input_required)", () => {
  let srv: HttpServerProc;
  beforeAll(async () => {
    srv = await startHttpServer(writeConfig({ policy: POLICY }));
  });
  afterAll(async () => srv?.stop());

  async function formOf(caps: Record<string, unknown>) {
    const c = await connectModernHttp(srv.url, DEMO_TOKENS.agent, {
      client: { capabilities: caps } as any,
    });
    const prompts: any[] = [];
    c.client.setRequestHandler("elicitation/create", async (req: any) => {
      prompts.push(req.params);
      return DECLINE as any;
    });
    try {
      const r = await callModern(c.client, "load_model", { model: "mnist-cnn" });
      expect(r.isError).toBe(true);
      expect(prompts).toHaveLength(1);
      return prompts[0];
    } finally {
      await c.close();
    }
  }

  it("names the approval card on the form inside input_required", async () => {
    const prompt = await formOf(CLIENTS.renders);
    expect(prompt._meta?.ui).toEqual({ resourceUri: CARD });
    expect(prompt.message).toMatch(/load_model/);
    expect(JSON.stringify(prompt.requestedSchema)).toMatch(/mnist-cnn/);
  });

  it("keeps today's form for the other clients", async () => {
    for (const caps of [CLIENTS.appsOnly, CLIENTS.plain]) {
      const prompt = await formOf(caps);
      expect(prompt._meta?.ui, JSON.stringify(caps)).toBeUndefined();
      expect(JSON.stringify(prompt.requestedSchema)).toMatch(/mnist-cnn/);
    }
  });
});
