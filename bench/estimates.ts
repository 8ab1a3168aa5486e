// How far the device-time estimate a call reserves against budgets (and that approvals show) is
// from what the gate then charges it. A corpus of real calls (every built-in model; check_model,
// load_model, run_inference forward and generate, run_benchmark; several batch sizes, sequence
// lengths and max_new_tokens; eager and compile) goes through a real server and CPU worker
// twice: first on a fresh data dir (no history: what a new deployment gets), then, after a
// restart, on the same data dir (warm: history from the first pass). Both numbers come from the
// server's own records: the estimate from the call's audit record, the actual from the budget
// ledger's charge (what the gate measured), never from a stopwatch of ours.
import Database from "better-sqlite3";
import { join } from "node:path";
import { writeConfig } from "../test/helpers/server.js";
import { PYTHON, ROOT, startStdio, tempDir, type McpServer } from "./lib/procs.js";
import { section, type SectionResult } from "./lib/report.js";
import { classOf } from "../policies/estimate.js";
import type { EstimateKind } from "../policies/tool_policy.js";
import { percentile } from "./lib/stats.js";

export interface EstimatesBenchOptions {
  say: (msg: string) => void;
}

export interface Case {
  tool: string;
  label: string;
  args: Record<string, unknown>;
}

export interface Measured {
  tool: string;
  label: string;
  estimate_s: number;
  actual_s: number;
  ratio: number;
  /** No call of its model and class was measured before it: priced without measured calls. */
  first_of_class?: boolean;
}

const KIND: Record<string, EstimateKind> = {
  check_model: "check",
  load_model: "load",
  run_inference: "inference",
  run_benchmark: "benchmark",
};

/**
 * Marks the calls of a pass that had no measured call of their class before them, from the
 * server's own record of each call's work (reports.db, one row per measured call, in order).
 */
function markFirsts(reportsDb: string, out: Measured[], seen: Set<string>, fromId: number): number {
  const db = new Database(reportsDb, { readonly: true, fileMustExist: true });
  try {
    const rows = db
      .prepare("SELECT id, model, kind, work FROM measured_calls WHERE id > ? ORDER BY id")
      .all(fromId) as { id: number; model: string; kind: EstimateKind; work: string }[];
    // One row per estimated call that succeeded, in the order they ran.
    if (rows.length === out.length && rows.every((r, i) => KIND[out[i].tool] === r.kind)) {
      rows.forEach((r, i) => {
        const key = `${r.model}|${classOf(r.kind, JSON.parse(r.work))}`;
        out[i].first_of_class = !seen.has(key);
        seen.add(key);
      });
    }
    return rows.at(-1)?.id ?? fromId;
  } finally {
    db.close();
  }
}

const SENTENCE = "The accelerator runs the model on a batch of sentences. ";
/** English-like text of about `chars` characters (the tokenizer's real ratio, not a worst case). */
function text(chars: number, i = 0): string {
  const s = `${i} ${SENTENCE.repeat(Math.ceil(chars / SENTENCE.length) + 1)}`;
  return s.slice(0, chars);
}
const texts = (n: number, chars: number) => Array.from({ length: n }, (_, i) => text(chars, i));
function images(batch: number) {
  const data = new Float32Array(batch * 784).map((_, i) => (i % 255) / 255);
  return [
    {
      dtype: "float32",
      shape: [batch, 1, 28, 28],
      data_b64: Buffer.from(data.buffer).toString("base64"),
    },
  ];
}

/** The corpus, in the order it runs: models are loaded before their calls, unloaded after. */
export function corpus(): Case[] {
  const c: Case[] = [];
  const add = (tool: string, label: string, args: Record<string, unknown>) =>
    c.push({ tool, label, args });
  const bench = { iterations: 5, warmup: 1 };

  // A tensor model: batch only.
  const m = "mnist-cnn";
  add("check_model", `${m} b1`, { model: m });
  add("check_model", `${m} b64`, { model: m, batch: 64 });
  add("load_model", `${m} eager`, { model: m });
  for (const b of [1, 16, 128])
    add("run_inference", `${m} b${b}`, { model: m, tensors: images(b) });
  add("run_benchmark", `${m} b1,8 eager`, { model: m, batch_sizes: [1, 8], ...bench });
  add("run_benchmark", `${m} b32 compile`, {
    model: m,
    batch_sizes: [32],
    modes: ["compile"],
    ...bench,
  });
  add("unload_model", `${m}`, { model: m });

  // An encoder: batch × sequence length (characters of text here, tokens in the benchmark).
  const e = "all-minilm-l6-v2";
  add("check_model", `${e} b1`, { model: e });
  add("check_model", `${e} b4 s64`, { model: e, batch: 4, seq_len: 64 });
  add("load_model", `${e} eager`, { model: e });
  add("run_inference", `${e} 1×40ch`, { model: e, texts: texts(1, 40) });
  add("run_inference", `${e} 8×40ch`, { model: e, texts: texts(8, 40) });
  add("run_inference", `${e} 8×800ch`, { model: e, texts: texts(8, 800) });
  add("run_inference", `${e} 32×200ch`, { model: e, texts: texts(32, 200) });
  add("run_benchmark", `${e} b1,4 s32,128`, {
    model: e,
    batch_sizes: [1, 4],
    seq_lens: [32, 128],
    ...bench,
  });
  add("unload_model", `${e}`, { model: e });

  // A causal LM: forward and generation, eager then compiled.
  const g = "tiny-gpt2";
  add("check_model", `${g} b1`, { model: g });
  add("check_model", `${g} b4 s64`, { model: g, batch: 4, seq_len: 64 });
  add("load_model", `${g} eager`, { model: g });
  add("run_inference", `${g} forward 1×40ch`, { model: g, texts: texts(1, 40) });
  add("run_inference", `${g} forward 8×200ch`, { model: g, texts: texts(8, 200) });
  for (const n of [4, 16, 64])
    add("run_inference", `${g} generate 1×40ch +${n}`, {
      model: g,
      texts: texts(1, 40),
      max_new_tokens: n,
    });
  add("run_inference", `${g} generate 4×200ch +16`, {
    model: g,
    texts: texts(4, 200),
    max_new_tokens: 16,
  });
  add("run_benchmark", `${g} forward b1,4 s32,128`, {
    model: g,
    batch_sizes: [1, 4],
    seq_lens: [32, 128],
    ...bench,
  });
  add("run_benchmark", `${g} generate b1,2 s32 +16`, {
    model: g,
    batch_sizes: [1, 2],
    seq_lens: [32],
    work: "generate",
    max_new_tokens: 16,
    iterations: 3,
    warmup: 1,
  });
  add("unload_model", `${g}`, { model: g });
  add("load_model", `${g} compile`, { model: g, mode: "compile" });
  // The first call of a shape on a compiled model compiles it; the second is steady state.
  add("run_inference", `${g} compiled forward 1×40ch (first)`, { model: g, texts: texts(1, 40) });
  add("run_inference", `${g} compiled forward 1×40ch (again)`, { model: g, texts: texts(1, 40) });
  add("run_benchmark", `${g} b1 s32 compile`, {
    model: g,
    batch_sizes: [1],
    seq_lens: [32],
    modes: ["compile"],
    ...bench,
  });
  add("unload_model", `${g}`, { model: g });
  return c;
}

/** The server's own records of a data dir: audit records (estimates) and budget charges. */
class Records {
  private readonly db: Database.Database;
  private auditSeq = 0;
  private chargeId = 0;
  constructor(file: string) {
    this.db = new Database(file, { readonly: true, fileMustExist: true });
    this.mark();
  }
  /** Everything recorded so far is before the next call. */
  mark(): void {
    this.auditSeq = (this.db.prepare("SELECT max(seq) AS n FROM audit_log").get() as any).n ?? 0;
    this.chargeId =
      (this.db.prepare("SELECT max(id) AS n FROM budget_charges").get() as any).n ?? 0;
  }
  /** The estimate of the call just made (its "executed" record) and what it was charged. */
  async last(tool: string): Promise<{ estimate_s: number; actual_s: number } | undefined> {
    const rec = (
      this.db
        .prepare("SELECT record FROM audit_log WHERE seq > ? ORDER BY seq")
        .all(this.auditSeq) as { record: string }[]
    )
      .map((r) => JSON.parse(r.record))
      .find((r) => r.tool === tool && r.outcome === "executed");
    const est = rec?.estimate?.device_seconds;
    if (typeof est !== "number") return undefined;
    // The ledger writes a turn's charges right after it (setImmediate): wait for the row.
    for (let i = 0; i < 100; i++) {
      const rows = this.db
        .prepare(
          "SELECT seconds FROM budget_charges WHERE id > ? AND tool = ? AND instr(principal, char(0)) = 0",
        )
        .all(this.chargeId, tool) as { seconds: number }[];
      if (rows.length > 0)
        return { estimate_s: est, actual_s: rows.reduce((a, r) => a + r.seconds, 0) };
      await new Promise((r) => setTimeout(r, 20));
    }
    return undefined;
  }
  close(): void {
    this.db.close();
  }
}

async function pass(
  config: string,
  dataDir: string,
  cases: Case[],
  say: (msg: string) => void,
): Promise<Measured[]> {
  const s: McpServer = await startStdio(config);
  const rec = new Records(join(dataDir, "policy.db"));
  const out: Measured[] = [];
  try {
    for (const c of cases) {
      rec.mark();
      const t0 = performance.now();
      await s.call(c.tool, c.args);
      const r = await rec.last(c.tool);
      say(
        `  ${c.tool} ${c.label}: ${((performance.now() - t0) / 1000).toFixed(2)} s` +
          (r ? ` (estimate ${r.estimate_s} s, charged ${r.actual_s.toFixed(3)} s)` : ""),
      );
      if (r) out.push({ tool: c.tool, label: c.label, ...r, ratio: r.actual_s / r.estimate_s });
    }
  } finally {
    rec.close();
    await s.close();
  }
  return out;
}

export interface Spread {
  n: number;
  p10: number;
  p50: number;
  p90: number;
}
export function spread(ratios: readonly number[]): Spread {
  return {
    n: ratios.length,
    p10: percentile(ratios, 10),
    p50: percentile(ratios, 50),
    p90: percentile(ratios, 90),
  };
}

/**
 * p90 "within 2×" and p50 "within 0.7–1.4×" judge the error either way: the ratio's distance
 * from 1 on a log scale, so 0.5 (estimate twice too high) counts like 2 (twice too low).
 */
export function errorFactor(ratio: number): number {
  return ratio >= 1 ? ratio : 1 / ratio;
}

export async function runEstimates(opts: EstimatesBenchOptions): Promise<SectionResult> {
  const sec = section("estimates");
  const dir = tempDir();
  const dataDir = join(dir, "data");
  const config = writeConfig(
    {
      data_dir: dataDir,
      log_level: "warn",
      runtime: {
        python: PYTHON,
        catalog: join(ROOT, "runtime", "catalog.builtin.json"),
        device: "cpu",
      },
      policy: {
        limits: {
          rate_limit: { per_principal_per_minute: 100_000_000 },
          // Charged, never refused: the figures need every call to run.
          budget: {
            device_seconds_per_window: 1e9,
            read_device_seconds_per_window: 1e9,
            window_s: 3600,
          },
        },
      },
    },
    dir,
  );
  const cases = corpus();
  opts.say(`estimates: fresh data dir (no history), ${cases.length} calls…`);
  const fresh = await pass(config, dataDir, cases, opts.say);
  const seen = new Set<string>();
  const reportsDb = join(dataDir, "reports.db");
  const lastId = markFirsts(reportsDb, fresh, seen, 0);
  opts.say("estimates: same data dir after a restart (history from the first pass)…");
  const warm = await pass(config, dataDir, cases, opts.say);
  markFirsts(reportsDb, warm, seen, lastId);
  const firsts = fresh.filter((m) => m.first_of_class);

  const fmt = (x: number) => (Number.isFinite(x) ? `${x.toFixed(2)}×` : "n/a");
  const show = (p: Spread) => `p10 ${fmt(p.p10)} p50 ${fmt(p.p50)} p90 ${fmt(p.p90)}`;
  const tools = [...new Set(cases.map((c) => c.tool))].filter((t) =>
    fresh.some((m) => m.tool === t),
  );
  for (const [name, runs] of [
    ["fresh", fresh],
    ["no_history", firsts],
    ["warm", warm],
  ] as const) {
    if (runs.length === 0) continue;
    const all = spread(runs.map((r) => r.ratio));
    const err = spread(runs.map((r) => errorFactor(r.ratio)));
    sec.fig(`${name}.p10`, all.p10);
    sec.fig(`${name}.p50`, all.p50);
    sec.fig(`${name}.p90`, all.p90);
    sec.fig(`${name}.error_p50`, err.p50);
    sec.fig(`${name}.error_p90`, err.p90);
    sec.row(
      `${name}: all ${all.n} calls, actual/estimate`,
      fmt(all.p50),
      `${show(all)}; error factor p50 ${fmt(err.p50)} p90 ${fmt(err.p90)}`,
    );
    for (const t of tools) {
      const p = spread(runs.filter((r) => r.tool === t).map((r) => r.ratio));
      if (p.n === 0) continue;
      sec.fig(`${name}.${t}.p50`, p.p50);
      sec.row(`${name}: ${t} (${p.n})`, fmt(p.p50), show(p));
    }
  }
  // The floor: the same call twice on this host (warm actual / fresh actual). No estimate from
  // one earlier measurement can be surer than the host is steady.
  const repeat = spread(
    fresh.flatMap((f) => {
      const w = warm.find((x) => x.tool === f.tool && x.label === f.label);
      return w ? [w.actual_s / f.actual_s] : [];
    }),
  );
  sec.fig("repeat.p10", repeat.p10);
  sec.fig("repeat.p50", repeat.p50);
  sec.fig("repeat.p90", repeat.p90);
  sec.row(`repeat: warm actual / fresh actual (${repeat.n})`, fmt(repeat.p50), show(repeat));
  for (const f of fresh) {
    const w = warm.find((x) => x.tool === f.tool && x.label === f.label);
    sec.row(
      `${f.tool} ${f.label}${f.first_of_class ? " *" : ""}`,
      `${fmt(f.ratio)} → ${w ? fmt(w.ratio) : "n/a"}`,
      `fresh ${f.actual_s.toFixed(3)} s / ${f.estimate_s} s; warm ${w ? `${w.actual_s.toFixed(3)} s / ${w.estimate_s} s` : "n/a"}`,
    );
  }
  sec.note(
    "estimates: ratio = device-seconds the gate charged (budget ledger) / the estimate it reserved (audit record); fresh = new data dir (each call may learn from the calls before it in the pass); no_history = the fresh calls no call of their model and class preceded (marked *), priced by the device model; warm = same data dir after a restart, history from the fresh pass; repeat = the same call's charge in the warm pass over the fresh one (the host's own noise); error factor = max(r, 1/r)",
  );
  return { ...sec.result(), data: { fresh, warm } };
}
