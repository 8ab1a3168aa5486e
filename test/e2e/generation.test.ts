// Generation the way LLM users expect it, through the SDK's real client over stdio and over HTTP,
// with a real worker on the CPU (issue 24): chat through a model's chat template, a seed that
// repeats a sample, stop sequences, logprobs, streamed text equal to the answer, cancellation
// mid-stream that frees the slot, and bounds refused before anything reaches the worker.
import { readFileSync, writeFileSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import type { Client } from "@modelcontextprotocol/sdk/client/index.js";
import type { JSONRPCMessage } from "@modelcontextprotocol/sdk/types.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  ROOT,
  connectHttp,
  connectStdio,
  errorOf,
  startHttpServer,
  writeConfig,
  type HttpServerProc,
} from "../helpers/server.js";
import { progressOf, tapMessages } from "../helpers/progress.js";
import { call } from "./scenario.js";
import { scaled } from "../helpers/calibrate.js";

/** tiny-gpt2 allowed to decode long enough that a cancel lands mid-stream. */
const LONG = "tiny-gpt2-long";
const LONG_TOKENS = 200;

/** The built-in catalog (absolute model roots) plus the long-decoding twin of tiny-gpt2. */
function testCatalog(dir: string): string {
  const src = join(ROOT, "runtime", "catalog.builtin.json");
  const cat = JSON.parse(readFileSync(src, "utf8"));
  cat.model_roots = cat.model_roots.map((r: string) => resolve(dirname(src), r));
  const gpt2 = cat.models.find((m: { id: string }) => m.id === "tiny-gpt2");
  cat.models.push({
    ...gpt2,
    id: LONG,
    description: "tiny-gpt2, decoding up to 200 tokens (e2e cancellation)",
    limits: { ...gpt2.limits, max_seq_len: 32, max_new_tokens: LONG_TOKENS },
  });
  const file = join(dir, "catalog.json");
  writeFileSync(file, JSON.stringify(cat));
  return file;
}

const chat = [
  { role: "system", content: "You are terse." },
  { role: "user", content: "Say something." },
];

describe.each(["stdio", "http"] as const)("generation over %s", (kind) => {
  let client: Client;
  let close: () => Promise<void>;
  let server: HttpServerProc | undefined;
  let seen: JSONRPCMessage[];

  beforeAll(async () => {
    const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-gen-"));
    const config = writeConfig(
      {
        runtime: {
          python: join(ROOT, ".venv/bin/python"),
          catalog: testCatalog(dir),
          device: "cpu",
        },
        policy: {
          limits: {
            rate_limit: { per_principal_per_minute: 6000 },
            // One generation at a time and none waiting: a slot still held is refused `busy`.
            per_tool_concurrency: { run_inference: 1 },
            queue_bound: { run_inference: 0 },
          },
        },
      },
      dir,
    );
    if (kind === "stdio") {
      const c = await connectStdio(config);
      client = c.client;
      close = c.close;
    } else {
      server = await startHttpServer(config);
      const c = await connectHttp(server.url, server.token);
      client = c.client;
      close = c.close;
    }
    seen = tapMessages(client);
    for (const model of ["tiny-chat", "tiny-gpt2", LONG]) {
      const r = await call(client, "load_model", { model });
      expect(r.isError, JSON.stringify(r)).toBeFalsy();
    }
  }, scaled(300_000));

  afterAll(async () => {
    await close?.();
    await server?.stop();
  });

  it("lists which generation models have a chat template, with their logprobs bound", async () => {
    const r = await call(client, "list_models", {});
    const byId = new Map(r.structuredContent.models.map((m: any) => [m.id, m]));
    expect(byId.get("tiny-gpt2")).toMatchObject({ limits: { max_logprobs: 5 } });
    expect((byId.get("all-minilm-l6-v2") as any).limits.max_logprobs).toBeUndefined();
    // Read by the worker's describe from the model files; never claimed by the server itself.
    expect(byId.get("tiny-chat")).toMatchObject({ chat_template: true });
    expect(byId.get("tiny-gpt2")).toMatchObject({ chat_template: false });
    expect((byId.get("all-minilm-l6-v2") as any).chat_template).toBeUndefined();
    expect(r.content[0].text).toMatch(/tiny-chat \(text-generation.*\[chat\]/);
  });

  it("chats with a model that has a chat template", async () => {
    const r = await call(client, "run_inference", {
      model: "tiny-chat",
      messages: chat,
      max_new_tokens: 12,
    });
    expect(r.isError, JSON.stringify(r)).toBeFalsy();
    const out = r.structuredContent;
    expect(out.items).toBe(1);
    expect(out.generations).toHaveLength(1);
    const g = out.generations[0];
    expect(["stop", "length"]).toContain(g.finish_reason);
    expect(g.text).toBe(out.texts[0]);
    // The template wraps the conversation: the prompt is longer than its words.
    expect(g.usage.prompt_tokens).toBeGreaterThan(6);
    expect(g.usage.completion_tokens).toBeGreaterThan(0);
    expect(g.usage.completion_tokens).toBeLessThanOrEqual(12);
    expect(out.ttft_ms).toBeGreaterThan(0);
    expect(out.tokens_per_s).toBeGreaterThan(0);
    // The agent's text marks the generated text as data.
    expect(r.content[0].text).toMatch(/generated \(model output, data only\)/);
  });

  it("refuses chat for a model without a chat template, saying so", async () => {
    const r = await call(client, "run_inference", { model: "tiny-gpt2", messages: chat });
    expect(r.isError).toBe(true);
    expect(errorOf(r)?.code).toBe("invalid_argument");
    // The server's own wording (the worker's starts "model 'tiny-gpt2' has no chat template"):
    // refused from describe's chat_template before the call reaches the worker.
    expect(errorOf(r)?.message).toMatch(/^messages: tiny-gpt2 has no chat template/);
  });

  it("repeats a sample with the same seed, and returns the seed it drew without one", async () => {
    const args = {
      model: "tiny-gpt2",
      texts: ["The weather today"],
      max_new_tokens: 24,
      temperature: 1.2,
      top_p: 0.95,
      top_k: 500,
    };
    const a = await call(client, "run_inference", { ...args, seed: 1234 });
    const b = await call(client, "run_inference", { ...args, seed: 1234 });
    const c = await call(client, "run_inference", { ...args, seed: 4321 });
    for (const r of [a, b, c]) expect(r.isError, JSON.stringify(r)).toBeFalsy();
    expect(a.structuredContent.seed).toBe(1234);
    expect(b.structuredContent.texts).toEqual(a.structuredContent.texts);
    expect(b.structuredContent.new_tokens).toEqual(a.structuredContent.new_tokens);
    // Sampling from a random model's ~30k-token vocabulary: another seed, another text.
    expect(c.structuredContent.texts).not.toEqual(a.structuredContent.texts);
    const drawn = await call(client, "run_inference", args);
    expect(drawn.isError, JSON.stringify(drawn)).toBeFalsy();
    const seed = drawn.structuredContent.seed;
    expect(Number.isInteger(seed)).toBe(true);
    const again = await call(client, "run_inference", { ...args, seed });
    expect(again.structuredContent.texts).toEqual(drawn.structuredContent.texts);
  });

  it("cuts the text before the first stop sequence", async () => {
    const base = { model: "tiny-gpt2", texts: ["Once upon a time"], max_new_tokens: 40 };
    const free = await call(client, "run_inference", base);
    expect(free.isError, JSON.stringify(free)).toBeFalsy();
    const text: string = free.structuredContent.texts[0];
    expect(free.structuredContent.generations[0].finish_reason).toBe("length");
    // A stop sequence taken from the middle of the greedy text: the same greedy run stops there.
    const mid = Math.floor(text.length / 2);
    const stop = text.slice(mid, mid + 3);
    expect(stop.length).toBe(3);
    const cut = await call(client, "run_inference", { ...base, stop: [stop, "\u0000never"] });
    expect(cut.isError, JSON.stringify(cut)).toBeFalsy();
    const g = cut.structuredContent.generations[0];
    expect(g.finish_reason).toBe("stop");
    expect(g.text).toBe(text.slice(0, text.indexOf(stop)));
    expect(g.text).not.toContain(stop);
  });

  it("returns bounded logprobs per generated token", async () => {
    const r = await call(client, "run_inference", {
      model: "tiny-gpt2",
      texts: ["Numbers:"],
      max_new_tokens: 6,
      logprobs: 3,
    });
    expect(r.isError, JSON.stringify(r)).toBeFalsy();
    const g = r.structuredContent.generations[0];
    expect(g.logprobs).toHaveLength(g.usage.completion_tokens);
    for (const t of g.logprobs) {
      expect(t.logprob).toBeLessThanOrEqual(0);
      expect(t.top).toHaveLength(3);
      // Greedy: the chosen token is the most likely one.
      expect(t.logprob).toBeCloseTo(Math.max(...t.top.map((x: any) => x.logprob)), 5);
    }
    const none = await call(client, "run_inference", {
      model: "tiny-gpt2",
      texts: ["Numbers:"],
      max_new_tokens: 6,
    });
    expect(none.structuredContent.generations[0].logprobs).toBeUndefined();
  });

  it("streams the text as progress messages whose concatenation is the answer", async () => {
    const heard: string[] = [];
    const before = seen.length;
    const r = (await client.callTool(
      {
        name: "run_inference",
        arguments: { model: "tiny-chat", messages: chat, max_new_tokens: 40, temperature: 0 },
      },
      undefined,
      { timeout: scaled(300_000), onprogress: (p) => heard.push(p.message ?? "") },
    )) as any;
    expect(r.isError, JSON.stringify(r)).toBeFalsy();
    const text = r.structuredContent.texts[0];
    expect(text.length).toBeGreaterThan(0);
    // What the server sent, in order, before its answer.
    const sent = progressOf(seen.slice(before));
    expect(sent.length).toBeGreaterThan(1);
    expect(sent.map((p) => p.message).join("")).toBe(text);
    // Progress counts tokens and only goes up.
    for (let i = 1; i < sent.length; i++)
      expect(sent[i].progress).toBeGreaterThan(sent[i - 1].progress);
    // The SDK's client hands notifications over a microtask after the answer when both arrive
    // in one read (typescript-sdk#2580), so its callback may miss the last pieces: what it
    // heard starts the text.
    expect(text.startsWith(heard.join(""))).toBe(true);
    // Without a progress token the same call streams nothing and answers the same text.
    const quiet = seen.length;
    const plain = await call(client, "run_inference", {
      model: "tiny-chat",
      messages: chat,
      max_new_tokens: 40,
    });
    expect(plain.structuredContent.texts[0]).toBe(text);
    expect(progressOf(seen.slice(quiet))).toEqual([]);
  });

  it("cancels mid-stream: the call ends, decoding stops, the slot is free", async () => {
    const args = { model: LONG, texts: ["Count:"], max_new_tokens: LONG_TOKENS };
    // The whole run, streamed, for comparison: greedy on a random model decodes to its length.
    const start = seen.length;
    const full = await call(client, "run_inference", args, { onprogress: () => {} });
    expect(full.isError, JSON.stringify(full)).toBeFalsy();
    expect(full.structuredContent.generations[0].finish_reason).toBe("length");
    const fullDeltas = progressOf(seen.slice(start)).length;
    expect(fullDeltas).toBeGreaterThan(LONG_TOKENS / 4);

    const abort = new AbortController();
    const before = seen.length;
    let deltas = 0;
    const pending = client.callTool({ name: "run_inference", arguments: args }, undefined, {
      timeout: scaled(300_000),
      signal: abort.signal,
      onprogress: () => {
        // Cancel as soon as text arrives: the rest of the 200 tokens must not be decoded.
        if (++deltas === 1) abort.abort("enough");
      },
    });
    await expect(pending).rejects.toThrow();
    // The worker answers the cancel at its next token; then the gate frees the slot.
    let status: any;
    for (let i = 0; i < 200; i++) {
      status = (await call(client, "get_runtime_status", {})).structuredContent;
      if (status.worker.in_flight === 0) break;
      await new Promise((r) => setTimeout(r, 25));
    }
    expect(status.worker.in_flight).toBe(0);
    // One slot and no queue: a slot still held would answer `busy`.
    const next = await call(client, "run_inference", { ...args, max_new_tokens: 4 });
    expect(next.isError, JSON.stringify(next)).toBeFalsy();
    // Deltas the server sent for the cancelled call (the SDK stops passing them on): far fewer
    // than the full decode's.
    const streamed = progressOf(seen.slice(before)).length;
    expect(streamed).toBeLessThan(fullDeltas / 2);
  });

  it("refuses out-of-bounds arguments with a clear error before the worker", async () => {
    // The server's own wording (the worker words its refusals `args.<field> must be ...`).
    const cases: [Record<string, unknown>, RegExp][] = [
      [{ temperature: 3 }, /^temperature: /],
      [{ top_p: 0 }, /^top_p: /],
      [{ top_k: 5000 }, /^top_k: /],
      [{ seed: -1 }, /^seed: /],
      [{ stop: ["a", "b", "c", "d", "e"] }, /^stop: /],
      [{ logprobs: 6 }, /^logprobs: /],
      [{ max_new_tokens: 65 }, /^max_new_tokens: /],
      [{ messages: chat }, /^messages: give texts or messages, not both/],
    ];
    for (const [extra, want] of cases) {
      const r = await call(client, "run_inference", {
        model: "tiny-gpt2",
        texts: ["x"],
        ...extra,
      });
      expect(errorOf(r)?.code, JSON.stringify(extra)).toBe("invalid_argument");
      expect(errorOf(r)?.message, JSON.stringify(extra)).toMatch(want);
    }
    // Chat arguments for a model that does not generate.
    const emb = await call(client, "run_inference", { model: "all-minilm-l6-v2", messages: chat });
    expect(errorOf(emb)?.message).toMatch(/^messages: only text-generation models take it/);
  });
});
