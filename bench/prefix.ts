// Prefix reuse (issue 32): 8 callers at once, each a different question behind the same long
// system prompt, against one model twice in one server: its prefix cache on, and a twin with
// `prefix_cache.max_bytes: 0`. The cache was filled by one earlier call, as a repeated system
// prompt is in a session. Printed: time to first token (the worker's, from submission, queueing
// included) with reuse ÷ without (target ≤ 0.5×), whether every greedy answer is the same on both
// sides, the prompt tokens each reused, and the cache's hit rate and bytes from
// get_runtime_status.
import { readFileSync, writeFileSync } from "node:fs";
import type { McpServer } from "./lib/procs.js";
import { section, type SectionResult } from "./lib/report.js";
import { median } from "./lib/stats.js";

/** The twin of `model` without a prefix cache, as writePrefixCatalog adds it. */
export const noPrefix = (model: string) => `${model}-noprefix`;

/**
 * Adds to the bench catalog at `file`, for each model, a twin without a prefix cache, and lets
 * both take `maxSeqLen` prompt tokens (tiny-gpt2's catalog entry takes 128: too few for the
 * shared prompt).
 */
export function writePrefixCatalog(file: string, models: Record<string, number>): void {
  const cat = JSON.parse(readFileSync(file, "utf8"));
  for (const [id, maxSeqLen] of Object.entries(models)) {
    const base = cat.models.find((m: { id: string }) => m.id === id);
    base.limits = { ...base.limits, max_seq_len: maxSeqLen, max_text_chars: 16_384 };
    cat.models.push({
      ...base,
      id: noPrefix(id),
      description: `${base.description} (bench twin: no prefix cache)`,
      prefix_cache: { max_bytes: 0 },
    });
  }
  writeFileSync(file, JSON.stringify(cat, null, 2));
}

export interface PrefixBenchOptions {
  mcp: McpServer;
  /** model id -> words of its shared system prompt (about that many tokens or more). */
  models: Record<string, number>;
  callers: number;
  rounds: number;
  maxNewTokens: number;
  say: (msg: string) => void;
}

function systemPrompt(words: number): string {
  const vocab = [
    "the",
    "lab",
    "runs",
    "models",
    "on",
    "chips",
    "and",
    "keeps",
    "a",
    "careful",
    "log",
  ];
  return (
    "You are the operations assistant. " +
    Array.from({ length: words }, (_, i) => vocab[(i * 7) % vocab.length]).join(" ")
  );
}

interface Answer {
  text: string;
  ttftMs: number;
  cached: number;
  promptTokens: number;
  /** Per generated token: top-1 minus top-2 log-probability (how near a tie the choice was). */
  gaps: number[];
}

async function ask(mcp: McpServer, model: string, system: string, q: string, maxNew: number) {
  const r = await mcp.call("run_inference", {
    model,
    messages: [
      { role: "system", content: system },
      { role: "user", content: q },
    ],
    max_new_tokens: maxNew,
    logprobs: 2,
  });
  const g = r.generations[0];
  return {
    text: r.texts[0],
    ttftMs: Number(r.ttft_ms),
    cached: Number(g.prefix_cached_tokens ?? 0),
    promptTokens: g.usage.prompt_tokens,
    gaps: (g.logprobs ?? []).map(
      (t: any) => (t.top[0]?.logprob ?? 0) - (t.top[1]?.logprob ?? -Infinity),
    ),
  } satisfies Answer;
}

async function round(mcp: McpServer, model: string, system: string, qs: string[], maxNew: number) {
  return Promise.all(qs.map((q) => ask(mcp, model, system, q, maxNew)));
}

export async function runPrefix(o: PrefixBenchOptions): Promise<SectionResult> {
  const s = section("prefix");
  for (const [model, words] of Object.entries(o.models)) {
    const key = model.replace(/[^a-z0-9]+/g, "_");
    o.say(`  ${model}: loading it and its twin without a prefix cache…`);
    for (const m of [model, noPrefix(model)]) await o.mcp.call("load_model", { model: m });
    const system = systemPrompt(words);
    // One call each first: it fills the cache on one side (and pays any first-call cost on both).
    const warm = await ask(o.mcp, model, system, "Are you there?", 1);
    await ask(o.mcp, noPrefix(model), system, "Are you there?", 1);
    const reuse: Answer[] = [];
    const plain: Answer[] = [];
    for (let r = 0; r < o.rounds; r++) {
      const qs = Array.from(
        { length: o.callers },
        (_, i) => `Question ${r}.${i}: which log is ${["newest", "oldest", "longest"][i % 3]}?`,
      );
      // Alternating sides, so the host's load drifts over both alike.
      plain.push(...(await round(o.mcp, noPrefix(model), system, qs, o.maxNewTokens)));
      reuse.push(...(await round(o.mcp, model, system, qs, o.maxNewTokens)));
    }
    // Identity, one caller at a time (the same company on both sides): every answer must match.
    const qs0 = Array.from({ length: o.callers }, (_, i) => `Alone ${i}: which log is newest?`);
    let sameAlone = true;
    for (const q of qs0) {
      const [x, y] = [
        await ask(o.mcp, model, system, q, o.maxNewTokens),
        await ask(o.mcp, noPrefix(model), system, q, o.maxNewTokens),
      ];
      sameAlone &&= x.text === y.text;
    }
    // At 8 callers the two sides batch differently (a prompt behind a cached prefix is prefilled
    // alone, the others in groups of 4), so float32 rounding differs; where an answer differs,
    // the nearest tie on its plain side's tokens says whether rounding can explain it.
    const differ = reuse.filter((a, i) => a.text !== plain[i].text).map((_, i) => i);
    const tie = Math.min(
      ...reuse.flatMap((a, i) => (a.text !== plain[i].text ? plain[i].gaps : [])),
    );
    const same = sameAlone;
    const ratio = median(reuse.map((a) => a.ttftMs)) / median(plain.map((a) => a.ttftMs));
    const status = await o.mcp.call("get_runtime_status", {});
    const pc = status.loaded.find((m: any) => m.model === model)?.prefix_cache ?? {};
    const tokens = warm.promptTokens;
    s.row(
      `${model}: TTFT with reuse / without, ${o.callers} callers`,
      `${ratio.toFixed(3)}×`,
      `p50 ${median(reuse.map((a) => a.ttftMs)).toFixed(1)} ms vs ${median(plain.map((a) => a.ttftMs)).toFixed(1)} ms; ` +
        `${tokens}-token prompts, ${median(reuse.map((a) => a.cached))} reused each; ${o.rounds} rounds (target ≤ 0.5×)`,
    );
    s.row(
      `${model}: greedy outputs identical with and without reuse, one caller at a time`,
      same ? "yes" : "NO",
      `${qs0.length} answers of ${o.maxNewTokens} tokens`,
    );
    s.row(
      `${model}: of the ${reuse.length} answers at ${o.callers} callers, differing`,
      String(differ.length),
      differ.length
        ? `nearest top-1/top-2 tie among their tokens: ${tie.toFixed(5)} (float32 rounding of a different batching)`
        : "none",
    );
    s.fig(`${key}.concurrent_differing`, differ.length);
    s.row(
      `${model}: prefix cache`,
      `${((pc.hit_rate ?? 0) * 100).toFixed(0)}% hits`,
      `${((pc.bytes ?? 0) / 2 ** 20).toFixed(2)} MiB in ${pc.blocks ?? 0} blocks of ${pc.block_tokens ?? "?"} tokens; token hit rate ${pc.token_hit_rate ?? "n/a"}`,
    );
    s.fig(`${key}.ttft_ratio`, ratio);
    s.fig(`${key}.identical`, same ? 1 : 0);
    s.fig(`${key}.prompt_tokens`, tokens);
    s.fig(`${key}.hit_rate`, pc.hit_rate ?? 0);
    s.fig(`${key}.bytes`, pc.bytes ?? 0);
    for (const m of [model, noPrefix(model)]) await o.mcp.call("unload_model", { model: m });
  }
  return s.result();
}
