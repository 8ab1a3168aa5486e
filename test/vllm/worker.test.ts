// The vLLM engine inside the worker, through the worker's own wire (no server): the generation
// arguments of the shared contract (sampling with a seed, stop sequences, log-probabilities, chat
// messages, streaming and cancelling it), and greedy token ids equal to Hugging Face `generate`
// called directly on the same weights. Needs `npm run test:vllm` (.venv-vllm).
import { execFile } from "node:child_process";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ROOT } from "../helpers/server.js";
import { cpuRuntime } from "../runtime/helpers.js";
import { VllmEngineSchema, engineArgs } from "../../server/config/engines.js";
import { CANCEL_PROMPTS, CHAT, ENGINE, HF, writeCatalog } from "./fixture.js";
import { scaled } from "../helpers/calibrate.js";

const run = promisify(execFile);
const PROMPTS = ["The quick brown fox", "hello", "Systolic arrays multiply matrices.", "a b c"];

/** Greedy new token ids from transformers' generate, the prompt tokenized as the worker does. */
async function hfGenerate(prompts: string[], maxNew: number): Promise<number[][]> {
  const script = `
import json, sys, torch
from tokenizers import Tokenizer
from transformers import GPT2LMHeadModel
d = sys.argv[1]
tok = Tokenizer.from_file(d + "/tokenizer.json")
tok.no_padding()  # MiniLM's tokenizer.json pads to 128 and truncates; the worker turns both off
tok.no_truncation()
model = GPT2LMHeadModel.from_pretrained(d, dtype=torch.float32).eval()
out = []
for p in json.loads(sys.argv[2]):
    ids = torch.tensor([tok.encode(p, add_special_tokens=False).ids])
    with torch.no_grad():
        g = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                           max_new_tokens=int(sys.argv[3]), pad_token_id=0, eos_token_id=102)
    out.append(g[0, ids.shape[1]:].tolist())
print(json.dumps(out))
`;
  const { stdout } = await run(
    join(ROOT, ".venv/bin/python"),
    ["-c", script, join(ROOT, ".data/models", HF), JSON.stringify(prompts), String(maxNew)],
    {
      env: { ...process.env, HF_HUB_OFFLINE: "1", TRANSFORMERS_OFFLINE: "1" },
      timeout: scaled(120_000),
    },
  );
  return JSON.parse(stdout.trim().split("\n").pop()!);
}

describe("the vLLM engine in the worker: the generation contract", () => {
  const { catalog } = writeCatalog({ chat: true });
  const rt = cpuRuntime({
    catalogPath: catalog,
    extraArgs: ["--threads", "1", ...engineArgs({ vllm: VllmEngineSchema.parse(ENGINE) })],
    requestTimeoutMs: 600_000,
  });
  const infer = (args: Record<string, unknown>, opts = {}) =>
    rt.call<any>("infer", { model: CHAT, ...args }, opts).then((r) => r.result);
  const engine = async () =>
    (await rt.call<any>("status", {})).result.loaded.find((m: any) => m.model === CHAT).engine;

  beforeAll(async () => {
    await rt.call("load", { model: CHAT }, { timeoutMs: 600_000 });
  }, scaled(600_000));
  afterAll(async () => {
    await rt.close();
  });

  it("greedy token ids equal transformers' generate on the same weights (float32)", async () => {
    const [got, want] = await Promise.all([
      infer({ texts: PROMPTS, max_new_tokens: 24 }),
      hfGenerate(PROMPTS, 24),
    ]);
    expect(got.token_ids).toEqual(want);
    expect(got.new_tokens).toEqual(want.map((w) => w.length));
    for (const g of got.generations) {
      expect(g.finish_reason).toBe("length");
      expect(g.usage.completion_tokens).toBe(24);
    }
    expect(got.engine).toBe("vllm");
    expect(got.ttft_ms).toBeGreaterThan(0);
    expect(got.tokens_per_s).toBeGreaterThan(0);
  });

  it("samples reproducibly with a seed, differently with another, and returns a seed it picked", async () => {
    const args = { texts: ["hello"], max_new_tokens: 16, temperature: 1.5, top_k: 50 };
    const a = await infer({ ...args, seed: 7 });
    const b = await infer({ ...args, seed: 7 });
    const c = await infer({ ...args, seed: 8 });
    expect(a.token_ids).toEqual(b.token_ids);
    expect(a.seed).toBe(7);
    expect(c.token_ids).not.toEqual(a.token_ids);
    const picked = await infer(args);
    expect(Number.isInteger(picked.seed)).toBe(true);
    expect((await infer({ ...args, seed: picked.seed })).token_ids).toEqual(picked.token_ids);
  });

  it("cuts the text before the first stop sequence and says finish_reason stop", async () => {
    const full = (await infer({ texts: ["The quick brown fox"], max_new_tokens: 24 })).texts[0];
    const stop = full.slice(Math.floor(full.length / 2), Math.floor(full.length / 2) + 3);
    const cut = await infer({ texts: ["The quick brown fox"], max_new_tokens: 24, stop: [stop] });
    expect(cut.texts[0]).toBe(full.slice(0, full.indexOf(stop)));
    expect(cut.generations[0].finish_reason).toBe("stop");
  });

  it("returns bounded log-probabilities: the chosen token and its top alternatives", async () => {
    const r = await infer({ texts: ["hello"], max_new_tokens: 6, logprobs: 3 });
    const lp = r.generations[0].logprobs;
    expect(lp).toHaveLength(6);
    for (const t of lp) {
      expect(t.top).toHaveLength(3);
      expect(t.logprob).toBeLessThanOrEqual(0);
      expect(t.logprob).toBeLessThanOrEqual(t.top[0].logprob + 1e-5);
    }
    await expect(infer({ texts: ["hello"], logprobs: 6 })).rejects.toMatchObject({
      code: "invalid_argument",
    });
  });

  it("renders messages with the model's chat template, as the same prompt given as text", async () => {
    const messages = [
      { role: "system", content: "Be brief." },
      { role: "user", content: "Name a TPU." },
    ];
    const chat = await infer({ messages, max_new_tokens: 12 });
    const rendered = "system: Be brief.\nuser: Name a TPU.\nassistant:";
    const text = await infer({ texts: [rendered], max_new_tokens: 12 });
    expect(chat.token_ids).toEqual(text.token_ids);
    expect(chat.generations[0].usage.prompt_tokens).toBe(text.generations[0].usage.prompt_tokens);
    await expect(infer({ messages, texts: ["x"] })).rejects.toMatchObject({
      code: "invalid_argument",
    });
  });

  it("streams the text as progress messages, in order, adding up to the answer", async () => {
    const deltas: string[] = [];
    const r = await infer(
      { texts: ["hello"], max_new_tokens: 24, stream: true },
      { onProgress: (p: any) => deltas.push(p.message) },
    );
    expect(deltas.length).toBeGreaterThan(1);
    expect(deltas.join("")).toBe(r.texts[0]);
  });

  it("a cancel in the middle of a stream stops the request in vLLM", async () => {
    const before = await engine();
    const ac = new AbortController();
    const deltas: string[] = [];
    const running = infer(
      {
        texts: Array.from({ length: CANCEL_PROMPTS }, (_, i) => `p${i}`),
        max_new_tokens: 190,
        stream: true,
      },
      {
        signal: ac.signal,
        onProgress: (p: any) => {
          deltas.push(p.message);
          ac.abort();
        },
      },
    );
    await expect(running).rejects.toMatchObject({ code: "cancelled" });
    expect(deltas.length).toBeGreaterThan(0);
    // The worker closed the stream and aborted the request's prompts in vLLM by id, and vLLM
    // took the abort (it has the endpoint). The closed socket alone is not enough: a disconnect
    // that reaches vLLM while it waits for the socket to drain (a reader that fell behind) leaves
    // every prompt running to its last token. That wait cannot be forced here without racing the
    // tokens vLLM makes meanwhile, so the abort itself is what this checks, with vLLM's counters.
    const idle = (e: any) =>
      e.in_flight === 0 && e.engine_metrics.running + e.engine_metrics.waiting === 0;
    let e = await engine();
    for (let i = 0; i < 100 && !idle(e); i++) {
      await new Promise((r) => setTimeout(r, 100));
      e = await engine();
    }
    expect(idle(e), JSON.stringify(e)).toBe(true);
    expect(e.aborts - before.aborts).toBe(1);
    expect(e.abort_refused).toBe(before.abort_refused);
    // CANCEL_PROMPTS x 190 tokens were asked for, one sequence at a time: stopped long before.
    expect(
      e.engine_metrics.generation_tokens - before.engine_metrics.generation_tokens,
    ).toBeLessThan((CANCEL_PROMPTS * 190) / 2);
  });
});
