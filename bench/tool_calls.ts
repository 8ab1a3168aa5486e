// Tool calls from the built-in model (issue 46): every request of the function-calling set
// written for the tests (bench/data/tool_calls.jsonl, five functions, one expected call each;
// test/helpers/tool_calls.ts) asked of SmolLM2 with all five functions and tool_choice
// `required`, at max_new_tokens 96, `callers` at a time. With the grammar, through MCP: the
// share of calls that parse and validate against their function's schema (target 100 %) and the
// accuracy (the expected function with every expected argument). Without it: the same requests
// to a worker of the same checkout with `tool_grammar: false` (a worker argument the server never
// sends), the same prompt, its text read by the same reader without the grammar's say.
import { join } from "node:path";
import { WorkerRuntime } from "../runtime/client.js";
import { workerThreads } from "../server/app/build_runtime.js";
import { SMOLLM2, inWaves } from "../test/helpers/structured.js";
import {
  TOOLS,
  callAccurate,
  callValid,
  toolMessages,
  toolRequests,
  type ToolRequest,
} from "../test/helpers/tool_calls.js";
import { readToolCalls } from "../tools/support/tool_calls.js";
import { quietLogger } from "./concurrency.js";
import { PYTHON, ROOT, type McpServer } from "./lib/procs.js";
import { section, type SectionResult } from "./lib/report.js";

export interface ToolCallsOptions {
  mcp: McpServer;
  callers: number;
  limit?: number;
  say: (msg: string) => void;
}

const MAX_NEW_TOKENS = 96;
const ASK = { tools: TOOLS, tool_choice: "required", max_new_tokens: MAX_NEW_TOKENS };

interface Scored {
  answers: number;
  calls: number;
  valid: number;
  accurate: number;
}

function score(rows: { req: ToolRequest; calls: { name: string; arguments: unknown }[] }[]) {
  const s: Scored = { answers: rows.length, calls: 0, valid: 0, accurate: 0 };
  for (const { req, calls } of rows) {
    s.calls += calls.length;
    s.valid += calls.filter((c) => callValid(c)).length;
    // Accurate: its first call is the expected one.
    if (calls[0] && callValid(calls[0]) && callAccurate(calls[0], req.expected)) s.accurate++;
  }
  return s;
}

/** The unconstrained side: a worker of this checkout, the same prompts without the grammar. */
async function ungrammared(reqs: ToolRequest[], callers: number) {
  const rt = new WorkerRuntime({
    repoRoot: ROOT,
    pythonPath: PYTHON,
    catalogPath: join(ROOT, "runtime", "catalog.builtin.json"),
    device: "cpu",
    extraArgs: ["--threads", String(workerThreads(0))],
    logger: quietLogger,
  });
  await rt.start();
  try {
    await rt.call("load", { model: SMOLLM2 });
    return await inWaves(reqs.length, callers, async (i) => {
      const req = reqs[i]!;
      const { result } = await rt.call<{ generations: { text: string }[] }>("infer", {
        model: SMOLLM2,
        messages: toolMessages(req),
        ...ASK,
        tool_grammar: false,
      });
      const read = readToolCalls(result.generations[0]!.text, TOOLS);
      return { req, calls: read?.calls ?? [] };
    });
  } finally {
    await rt.close();
  }
}

export async function runToolCalls(o: ToolCallsOptions): Promise<SectionResult> {
  const s = section("tool_calls");
  const reqs = toolRequests().slice(0, o.limit);
  await o.mcp.call("load_model", { model: SMOLLM2 });
  const constrained = score(
    await inWaves(reqs.length, o.callers, async (i) => {
      const req = reqs[i]!;
      const r = await o.mcp.call("run_inference", {
        model: SMOLLM2,
        messages: toolMessages(req),
        ...ASK,
      });
      return { req, calls: r.generations[0].tool_calls ?? [] };
    }),
  );
  const free = score(await ungrammared(reqs, o.callers));
  const pct = (n: number, d: number) => (d ? `${((n / d) * 100).toFixed(1)} %` : "–");
  for (const [name, x] of [
    ["grammar", constrained],
    ["no grammar", free],
  ] as const) {
    s.row(
      `${name}: calls that parse and validate`,
      pct(x.valid, x.calls),
      `${x.valid} of ${x.calls} calls in ${x.answers} answers` +
        (name === "grammar" ? "; target 100 %" : ""),
    );
    s.row(
      `${name}: accuracy (function and arguments)`,
      pct(x.accurate, x.answers),
      `${x.accurate} of ${x.answers} requests`,
    );
  }
  s.fig("valid_rate", constrained.calls ? constrained.valid / constrained.calls : 0);
  s.fig("accuracy", constrained.accurate / constrained.answers);
  s.fig("valid_rate_no_grammar", free.calls ? free.valid / free.calls : 0);
  s.fig("accuracy_no_grammar", free.accurate / free.answers);
  o.say(
    `tool_calls: grammar ${constrained.valid}/${constrained.calls} valid, ${constrained.accurate}/${reqs.length} accurate; ` +
      `no grammar ${free.valid}/${free.calls} valid, ${free.accurate}/${reqs.length} accurate`,
  );
  return s.result();
}
