// Structured output (issue 32): tokens/s of the same prompts with a response_format and without,
// side by side in one run on the real built-in instruction model through MCP (target: constrained
// at least 0.8x unconstrained), and the grammar compile time of each schema kind. Rounds
// interleave the two sides so that the shared machine's load falls on both alike; each side is
// `callers` concurrent callers (one decode batch), and a rate is its tokens over its wall time.
// Both sides decode SPEED_TOKENS tokens per answer (a PERSON answer is longer, so no constrained
// answer ends early and leaves its batch smaller): the ratio is the grammar's cost per token.
import {
  CHOICES,
  PATTERN,
  SMOLLM2,
  choiceMessages,
  personFormat,
  personMessages,
  regexMessages,
} from "../test/helpers/structured.js";
import type { McpServer } from "./lib/procs.js";
import { section, type SectionResult } from "./lib/report.js";

export interface StructuredBenchOptions {
  mcp: McpServer;
  callers: number;
  rounds: number;
  say: (msg: string) => void;
}

const SPEED_TOKENS = 32;

/** One side of a round: `callers` calls at once; (tokens, seconds, answers that ended early). */
async function side(mcp: McpServer, callers: number, round: number, constrained: boolean) {
  const t0 = performance.now();
  const rs = await Promise.all(
    [...Array(callers).keys()].map((i) =>
      mcp.call("run_inference", {
        model: SMOLLM2,
        messages: personMessages(round * callers + i),
        max_new_tokens: SPEED_TOKENS,
        ...(constrained ? { response_format: personFormat } : {}),
      }),
    ),
  );
  const seconds = (performance.now() - t0) / 1000;
  const gens = rs.map((r) => r.generations[0]);
  const tokens = gens.reduce((n: number, g: any) => n + g.usage.completion_tokens, 0);
  const ended = gens.filter((g: any) => g.finish_reason !== "length").length;
  return { tokens, seconds, ended };
}

export async function runStructured(o: StructuredBenchOptions): Promise<SectionResult> {
  const s = section("structured");
  await o.mcp.call("load_model", { model: SMOLLM2 }); // McpServer.call throws on a refusal
  const tally = {
    on: { tokens: 0, seconds: 0, ended: 0 },
    off: { tokens: 0, seconds: 0, ended: 0 },
  };
  await side(o.mcp, o.callers, 0, true); // warm: the grammar tokenizer is built on first use
  for (let round = 0; round < o.rounds; round++) {
    for (const key of round % 2 ? (["off", "on"] as const) : (["on", "off"] as const)) {
      const r = await side(o.mcp, o.callers, round, key === "on");
      tally[key].tokens += r.tokens;
      tally[key].seconds += r.seconds;
      tally[key].ended += r.ended;
    }
  }
  const rate = (t: { tokens: number; seconds: number }) => t.tokens / t.seconds;
  const ratio = rate(tally.on) / rate(tally.off);
  const n = o.callers * o.rounds;
  s.row(
    "tokens/s, JSON schema",
    rate(tally.on).toFixed(1),
    `${n} answers, ${SPEED_TOKENS} tokens each, ${tally.on.ended} ended early`,
  );
  s.row(
    "tokens/s, unconstrained",
    rate(tally.off).toFixed(1),
    `${n} answers, ${SPEED_TOKENS} tokens each, ${tally.off.ended} ended early`,
  );
  s.row("constrained ÷ unconstrained", `${ratio.toFixed(3)}x`, "target ≥ 0.8x");
  s.fig("tokens_per_s_ratio", ratio);
  // Compile time per schema kind, as the worker reports it (a grammar is compiled per call).
  const kinds: Array<[string, Record<string, unknown>, unknown]> = [
    ["json_schema (5 fields, nested)", { response_format: personFormat }, personMessages(0)],
    ["json_object", { response_format: { type: "json_object" } }, personMessages(0)],
    ["regex", { response_format: { type: "regex", pattern: PATTERN } }, regexMessages(0)],
    ["choice (3)", { response_format: { type: "choice", choices: CHOICES } }, choiceMessages(0)],
  ];
  for (const [name, extra, messages] of kinds) {
    const ms: number[] = [];
    for (let i = 0; i < 5; i++) {
      const r = await o.mcp.call("run_inference", {
        model: SMOLLM2,
        messages,
        max_new_tokens: 1,
        ...extra,
      });
      ms.push(r.grammar_compile_ms);
    }
    ms.sort((a, b) => a - b);
    const median = ms[2]!;
    s.row(`compile ms, ${name}`, median.toFixed(2), "median of 5");
    s.fig(`compile_ms.${name.split(" ")[0]}`, median);
  }
  return s.result();
}
