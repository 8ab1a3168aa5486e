// run_inference's generation surface without a worker: every bound refused before the gate with a
// message naming the field, the arguments reaching the worker under the contract's names, the
// stream flag set exactly when the caller sent a progress token, and worker deltas forwarded as
// progress messages in the order they came. The real worker: test/e2e/generation.test.ts.
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { parseCatalog, readCatalog } from "../../runtime/catalog.js";
import type { CallOptions } from "../../runtime/types.js";
import { buildTools } from "../../tools/registry.js";
import { prefixKey } from "../../tools/support/generation.js";
import type { ToolContext, ToolDefinition, ToolEnv } from "../../tools/types.js";
import { ROOT } from "../helpers/server.js";

const builtin = readCatalog(join(ROOT, "runtime/catalog.builtin.json"));
const gpt2 = builtin.models.find((m) => m.id === "tiny-gpt2")!;
// A second generation model with a lower logprobs bound, beside the built-in ones.
const catalog = parseCatalog({
  ...builtin,
  models: [
    ...builtin.models,
    { ...gpt2, id: "tiny-gpt2-lp1", limits: { ...gpt2.limits, max_logprobs: 1 } },
  ],
});
const env: ToolEnv = {
  catalog,
  limits: {
    max_texts: 64,
    inline_max_elements: 4096,
    max_tensor_elements: 1 << 20,
    benchmark: { max_configs: 64, max_iterations: 10_000, max_duration_s: 600, max_warmup: 100 },
  },
};
const tools = buildTools(env);
const infer = tools.find((t) => t.name === "run_inference")! as ToolDefinition<any, any>;
const bench = tools.find((t) => t.name === "run_benchmark")! as ToolDefinition<any, any>;

/** Schema, then every per-model check: what dispatch runs before the gate. */
/** Dispatch awaits a tool's validate (run_benchmark's is asynchronous): so does this check. */
async function check(
  tool: ToolDefinition<any, any>,
  args: Record<string, unknown>,
): Promise<string | null> {
  const parsed = tool.input.safeParse(args);
  if (!parsed.success)
    return parsed.error.issues.map((i: { path: PropertyKey[] }) => i.path.join(".")).join(",");
  try {
    await tool.validate?.(parsed.data, {} as any);
    return null;
  } catch (e) {
    return (e as Error).message;
  }
}

describe("run_inference generation arguments: refused before the gate", () => {
  const ok = { model: "tiny-gpt2", texts: ["hello"] };
  it.each([
    [{ temperature: 2.5 }, /temperature/],
    [{ temperature: -0.1 }, /temperature/],
    [{ top_p: 0 }, /top_p/],
    [{ top_p: 1.01 }, /top_p/],
    [{ top_k: 1001 }, /top_k/],
    [{ top_k: 1.5 }, /top_k/],
    [{ seed: 2 ** 31 }, /seed/],
    [{ seed: -1 }, /seed/],
    [{ stop: ["a", "b", "c", "d", "e"] }, /stop/],
    [{ stop: [""] }, /stop\.0/],
    [{ stop: ["x".repeat(65)] }, /stop\.0/],
    [{ logprobs: 6 }, /logprobs/],
    [{ max_new_tokens: 65 }, /max_new_tokens/],
  ])("%j", async (extra, want) => {
    expect(await check(infer, { ...ok, ...extra })).toMatch(want);
  });

  it("accepts every parameter at its bounds", async () => {
    expect(
      await check(infer, {
        ...ok,
        temperature: 2,
        top_p: 1,
        top_k: 1000,
        seed: 2 ** 31 - 1,
        stop: ["a", "b", "c", "x".repeat(64)],
        logprobs: 5,
        max_new_tokens: 64,
      }),
    ).toBeNull();
  });

  it("applies a catalog entry's own logprobs bound", async () => {
    expect(await check(infer, { model: "tiny-gpt2-lp1", texts: ["a"], logprobs: 1 })).toBeNull();
    expect(await check(infer, { model: "tiny-gpt2-lp1", texts: ["a"], logprobs: 2 })).toBe(
      "logprobs: tiny-gpt2-lp1 allows at most 1",
    );
  });

  it("takes texts or messages, not both, and messages only for generation models", async () => {
    const messages = [{ role: "user", content: "hi" }];
    expect(await check(infer, { model: "tiny-gpt2", messages })).toBeNull();
    expect(await check(infer, { model: "tiny-gpt2", texts: ["a"], messages })).toMatch(
      /texts or messages, not both/,
    );
    expect(await check(infer, { model: "all-minilm-l6-v2", messages })).toMatch(
      /^messages: only text-generation models take it/,
    );
    expect(await check(infer, { model: "all-minilm-l6-v2", texts: ["a"], seed: 1 })).toMatch(
      /^seed: only text-generation models/,
    );
    expect(
      await check(infer, { model: "tiny-gpt2", messages: [{ role: "robot", content: "x" }] }),
    ).toBe("messages.0.role");
    // A tool result must name the call it answers (tool calls, issue 46).
    expect(
      await check(infer, { model: "tiny-gpt2", messages: [{ role: "tool", content: "x" }] }),
    ).toMatch(
      /^messages\.0: a tool message, and only one, names the call it answers by tool_call_id/,
    );
    const long = [
      { role: "user", content: "x".repeat(1500) },
      { role: "assistant", content: "y".repeat(1500) },
    ];
    expect(await check(infer, { model: "tiny-gpt2", messages: long })).toMatch(
      /^messages: tiny-gpt2 takes at most 2048 characters of content per conversation, got 3000/,
    );
  });

  it("run_benchmark samples only generate work", async () => {
    const b = { model: "tiny-gpt2", work: "generate", temperature: 0.7, seed: 3 };
    expect(await check(bench, b)).toBeNull();
    expect(await check(bench, { ...b, work: "forward" })).toMatch(
      /^temperature: only work "generate"/,
    );
    expect(await check(bench, { ...b, temperature: 3 })).toBe("temperature");
  });
});

/** A runtime that records the worker call and plays `deltas` as worker progress messages. */
function fakeContext(progressRequested: boolean, deltas: string[]) {
  const sent: { args: Record<string, unknown>; opts: CallOptions }[] = [];
  const progress: { progress: number; message?: string }[] = [];
  const runtime = {
    async call(_op: string, args: Record<string, unknown>, opts: CallOptions = {}) {
      sent.push({ args, opts });
      deltas.forEach((d, i) => opts.onProgress?.({ progress: i + 1, total: 8, message: d }));
      const text = deltas.join("");
      return {
        result: {
          task: "text-generation",
          texts: [text],
          new_tokens: [deltas.length],
          generations: [
            {
              text,
              finish_reason: "length",
              usage: { prompt_tokens: 2, completion_tokens: deltas.length },
            },
          ],
          seed: args.seed ?? 123,
          ttft_ms: 1,
          tokens_per_s: 100,
        },
        tensors: [],
      };
    },
  };
  const ctx = {
    runtime,
    principal: { id: "agent" },
    facts: { get: async () => ({ chat_template: true }) },
    signal: new AbortController().signal,
    progress: (p: number, _t?: number, message?: string) => progress.push({ progress: p, message }),
    ...(progressRequested ? { progressRequested: true } : {}),
  } as unknown as ToolContext;
  return { ctx, sent, progress };
}

describe("run_inference → worker", () => {
  const deltas = ["Hel", "lo", ", ", "wor", "ld"];

  it("streams the worker's deltas in order when the caller sent a progress token", async () => {
    const { ctx, sent, progress } = fakeContext(true, deltas);
    const args = infer.input.parse({ model: "tiny-gpt2", texts: ["x"], max_new_tokens: 8 });
    const out = await infer.handler(args, ctx);
    expect(sent[0].args.stream).toBe(true);
    expect(progress.map((p) => p.message)).toEqual(deltas);
    expect(progress.map((p) => p.progress)).toEqual([1, 2, 3, 4, 5]);
    expect(progress.map((p) => p.message).join("")).toBe(out.texts[0]);
  });

  it("does not stream without a progress token, nor for several texts", async () => {
    for (const [wanted, texts] of [
      [false, ["x"]],
      [true, ["x", "y"]],
    ] as const) {
      const { ctx, sent, progress } = fakeContext(wanted, deltas);
      await infer.handler(infer.input.parse({ model: "tiny-gpt2", texts }), ctx);
      expect(sent[0].args.stream).toBeUndefined();
      expect(sent[0].opts.onProgress).toBeUndefined();
      expect(progress).toEqual([]);
    }
  });

  it("passes every generation argument under the contract's names, and the answer back", async () => {
    const { ctx, sent } = fakeContext(false, ["a"]);
    const given = {
      model: "tiny-gpt2",
      messages: [{ role: "user", content: "hi" }],
      max_new_tokens: 8,
      temperature: 0.8,
      top_p: 0.9,
      top_k: 40,
      seed: 42,
      stop: ["\n"],
      logprobs: 2,
    };
    const out = await infer.handler(infer.input.parse(given), ctx);
    const { model: _m, ...rest } = given;
    // The worker gets the caller's prefix cache partition: a hash of the principal, not its id.
    expect(sent[0].args).toEqual({
      model: "tiny-gpt2",
      ...rest,
      prefix_key: prefixKey("agent", false),
    });
    expect(sent[0].args.prefix_key).toMatch(/^[0-9a-f]{32}$/);
    expect(prefixKey("agent2", false)).not.toBe(sent[0].args.prefix_key);
    expect(prefixKey("agent", true)).toBe(prefixKey("agent2", true));
    expect(out).toMatchObject({ seed: 42, items: 1, generations: [{ finish_reason: "length" }] });
    expect(infer.output.safeParse(out).success).toBe(true);
    expect(infer.render(out)).toMatch(/1 new tokens, finish length, 100\.0 tokens\/s, seed 42/);
  });

  it("refuses messages for a model the worker says has no chat template, before the call", async () => {
    const { ctx, sent } = fakeContext(false, ["a"]);
    (ctx as any).facts = { get: async () => ({ chat_template: false }) };
    const args = infer.input.parse({
      model: "tiny-gpt2",
      messages: [{ role: "user", content: "hi" }],
    });
    await expect(infer.handler(args, ctx)).rejects.toMatchObject({
      code: "invalid_argument",
      message: expect.stringMatching(/^messages: tiny-gpt2 has no chat template/),
    });
    expect(sent).toEqual([]);
  });
});
