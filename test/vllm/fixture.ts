// What the vLLM suite shares: a catalog that serves the built-in tiny-gpt2 twice, from the same
// weights: "tiny-gpt2" on the worker's own PyTorch and "tiny-gpt2-vllm" on a vLLM engine, and the
// engine's settings (vLLM's environment from scripts/setup-vllm.sh).
import { cpSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ROOT } from "../helpers/server.js";

export const VLLM_PYTHON = join(ROOT, ".venv-vllm", "bin", "python");
export const HF = "tiny-gpt2";
export const VLLM = "tiny-gpt2-vllm";
export const CHAT = "tiny-gpt2-chat-vllm";

/**
 * Limits: max_new_tokens 190 with prompts of at most 64 tokens fills GPT-2's 256 positions. With
 * vLLM at one sequence at a time (--max-num-seqs 1), a request of CANCEL_PROMPTS prompts runs
 * long enough to cancel in the middle even when a status poll takes seconds (16 prompts, 3,040
 * tokens, ran to their end between two polls on a loaded machine).
 */
const LIMITS = { max_batch: 16, max_seq_len: 64, max_new_tokens: 190, max_text_chars: 2048 };
/** As many prompts as a call may carry (limits.max_texts, 64 by default). */
export const CANCEL_PROMPTS = 64;
const ENGINE_LIMITS = { ...LIMITS, max_batch: CANCEL_PROMPTS };
export const ENGINE = {
  python: VLLM_PYTHON,
  args: ["--max-num-seqs", "1"],
  start_timeout_s: 400,
};

/** A temp dir with catalog.json (and, with `chat`, a copy of tiny-gpt2 that has a chat template). */
export function writeCatalog(opts: { chat?: boolean } = {}): { dir: string; catalog: string } {
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-vllm-"));
  const builtin = JSON.parse(readFileSync(join(ROOT, "runtime/catalog.builtin.json"), "utf8"));
  const tiny = builtin.models.find((m: any) => m.id === HF);
  const models: any[] = [
    { ...tiny, limits: LIMITS },
    {
      ...tiny,
      id: VLLM,
      engine: "vllm",
      limits: ENGINE_LIMITS,
      description: "tiny-gpt2 on vLLM",
    },
  ];
  const roots = [join(ROOT, ".data", "models")];
  if (opts.chat) {
    // The same weights with a (minimal) chat template, so messages can be rendered.
    const chatDir = join(dir, "models", "tiny-gpt2-chat");
    cpSync(join(ROOT, ".data", "models", HF), chatDir, { recursive: true, dereference: true });
    const tc = JSON.parse(readFileSync(join(chatDir, "tokenizer_config.json"), "utf8"));
    tc.chat_template =
      "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}";
    writeFileSync(join(chatDir, "tokenizer_config.json"), JSON.stringify(tc));
    roots.push(join(dir, "models"));
    models.push({
      ...tiny,
      id: CHAT,
      engine: "vllm",
      limits: ENGINE_LIMITS,
      // Absolute: a relative path is resolved against the first root only.
      source: { path: chatDir },
    });
  }
  const catalog = join(dir, "catalog.json");
  writeFileSync(catalog, JSON.stringify({ model_roots: roots, models }, null, 2));
  return { dir, catalog };
}

/** `engine` of a model in get_runtime_status's `loaded`. */
export function engineOf(status: any, model = VLLM): any {
  return status.structuredContent.loaded.find((m: any) => m.model === model)?.engine;
}

/** vLLM's own count of requests it finished (any reason), from its /metrics. */
export function engineTotal(engine: any): number {
  const m = engine.engine_metrics;
  return Object.values(m.finished as Record<string, number>).reduce((a, b) => a + b, 0);
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
