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
}

async function ask(mcp: McpServer, model: string, system: string, q: string, maxNew: number) {
  const r = await mcp.call("run_inference", {
    model,
    messages: [
      { role: "system", content: system },
      { role: "user", content: q },
    ],
    max_new_tokens: maxNew,
  });
  return {
    text: r.texts[0],
    ttftMs: Number(r.ttft_ms),
    cached: Number(r.generations[0].prefix_cached_tokens ?? 0),
    promptTokens: r.generations[0].usage.prompt_tokens,
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
    const same = reuse.every((a, i) => a.text === plain[i].text);
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
      `${model}: greedy outputs identical with and without reuse`,
      same ? "yes" : "NO",
      `${reuse.length} answers of ${o.maxNewTokens} tokens`,
    );
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
