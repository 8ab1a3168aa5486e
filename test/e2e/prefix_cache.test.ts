// Prefix reuse over MCP (issue 32): two calls that share a long prompt prefix, from one
// principal, reuse its keys and values on the second (`prefix_cached_tokens > 0`) and answer the
// same; another principal gets nothing from that cache by default (a shared cache is a timing
// side channel), and with `inference.prefix_cache_shared` it does. Real clients of both eras over
// HTTP, a real worker on the CPU.
import { createHash } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  DEMO_POLICY,
  DEMO_TOKENS,
  connectHttp,
  startHttpServer,
  writeConfig,
  type HttpServerProc,
} from "../helpers/server.js";
import { connectModernHttp } from "../helpers/modern.js";
import { call, type Client } from "./scenario.js";

const AGENT2 = "prefix-cache-second-agent-token";
const sha = (t: string) => createHash("sha256").update(t).digest("hex");
const agent = DEMO_POLICY.tokens.find((t: any) => t.id === "agent");

// About 100 tokens of tiny-chat's tokenizer: six blocks of 16 behind the question.
const SYSTEM =
  "You are the operations assistant of a small lab. Answer in one sentence, name no people, " +
  "and say when you do not know. The lab runs models on accelerators and keeps a log. ";

function messages(question: string, era: string) {
  return [
    // One system prompt per era: agent2's own partition holds the other era's.
    { role: "system", content: `(${era}) ${SYSTEM}` },
    { role: "user", content: question },
  ];
}

async function chat(client: Client, question: string, era = "shared") {
  const r = await call(client, "run_inference", {
    model: "tiny-chat",
    messages: messages(question, era),
    max_new_tokens: 12,
  });
  expect(r.isError, JSON.stringify(r)).toBeFalsy();
  return r.structuredContent;
}

function config(shared: boolean) {
  return writeConfig({
    inference: { prefix_cache_shared: shared },
    policy: {
      ...DEMO_POLICY,
      tokens: [...DEMO_POLICY.tokens, { ...agent, id: "agent2", token_sha256: sha(AGENT2) }],
      limits: { ...DEMO_POLICY.limits, rate_limit: { per_principal_per_minute: 6000 } },
      approvals: { rules: [] },
    },
  });
}

describe("prefix reuse over MCP, one cache partition per principal (the default)", () => {
  let srv: HttpServerProc;
  beforeAll(async () => {
    srv = await startHttpServer(config(false));
    const c = await connectHttp(srv.url, DEMO_TOKENS.agent);
    const loaded = await call(c.client, "load_model", { model: "tiny-chat" });
    await c.close();
    expect(loaded.isError, JSON.stringify(loaded)).toBeFalsy();
  });
  afterAll(async () => srv?.stop());

  it.each(["legacy", "modern"] as const)(
    "%s era: the second call reuses the prefix and answers the same; another principal gets 0",
    async (era) => {
      const connect = (token: string) =>
        era === "modern" ? connectModernHttp(srv.url, token) : connectHttp(srv.url, token);
      const a = await connect(DEMO_TOKENS.agent);
      const b = await connect(AGENT2);
      try {
        const question = `Which log is the newest (${era})?`;
        const first = await chat(a.client, question, era);
        const second = await chat(a.client, question, era);
        const reused = second.generations[0].prefix_cached_tokens;
        expect(first.generations[0].prefix_cached_tokens).toBe(0);
        expect(reused).toBeGreaterThan(0);
        expect(reused).toBeLessThan(second.generations[0].usage.prompt_tokens);
        expect(second.texts).toEqual(first.texts);

        const other = await chat(b.client, question, era);
        expect(other.generations[0].prefix_cached_tokens).toBe(0);
        expect(other.texts).toEqual(first.texts);

        const status = await call(a.client, "get_runtime_status", {});
        const row = status.structuredContent.loaded.find((m: any) => m.model === "tiny-chat");
        expect(row.prefix_cache).toMatchObject({ enabled: true });
        expect(row.prefix_cache.hit_rate).toBeGreaterThan(0);
        expect(row.prefix_cache.bytes).toBeGreaterThan(0);
        expect(row.prefix_cache.bytes).toBeLessThanOrEqual(row.prefix_cache.max_bytes);
        expect(status.content[0].text).toMatch(/prefix cache \d+% hits/);
      } finally {
        await a.close();
        await b.close();
      }
    },
  );
});

describe("prefix reuse with inference.prefix_cache_shared: one partition for everyone", () => {
  let srv: HttpServerProc;
  beforeAll(async () => {
    srv = await startHttpServer(config(true));
  });
  afterAll(async () => srv?.stop());

  it("another principal's call reuses the prefix", async () => {
    const a = await connectHttp(srv.url, DEMO_TOKENS.agent);
    const b = await connectHttp(srv.url, AGENT2);
    try {
      const loaded = await call(a.client, "load_model", { model: "tiny-chat" });
      expect(loaded.isError, JSON.stringify(loaded)).toBeFalsy();
      const first = await chat(a.client, "Where is the log kept?");
      const other = await chat(b.client, "Where is the log kept?");
      expect(other.generations[0].prefix_cached_tokens).toBeGreaterThan(0);
      expect(other.texts).toEqual(first.texts);
    } finally {
      await a.close();
      await b.close();
    }
  });
});
