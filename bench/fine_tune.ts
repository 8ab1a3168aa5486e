// One training path on real text, measured through MCP (issue 47): run_benchmark work
// "fine_tune" of one catalog model on the built-in dataset, float32 and bfloat16 autocast
// trained in lockstep from the same weights on the same batches, with both held-out curves,
// tokens/s and the drift side by side. The detailed result goes to bench/results/fine_tune.json.
import { loadavg } from "node:os";
import { startStdio } from "./lib/procs.js";
import { section, writeRunDetail, type SectionResult } from "./lib/report.js";

export interface FineTuneBenchOptions {
  config: string;
  model: string;
  dataset: string;
  seqLen: number;
  batch: number;
  steps: number;
  evalEvery: number;
  learningRate: number;
  say: (msg: string) => void;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const DTYPES = ["float32", "bfloat16"];

export async function runFineTune(o: FineTuneBenchOptions): Promise<SectionResult> {
  const sec = section("fine_tune");
  const args = {
    model: o.model,
    work: "fine_tune",
    dataset: o.dataset,
    batch_sizes: [o.batch],
    seq_lens: [o.seqLen],
    dtypes: DTYPES,
    modes: ["eager"],
    steps: o.steps,
    eval_every: o.evalEvery,
    learning_rate: o.learningRate,
    wait: false,
  };
  const server = await startStdio(o.config);
  let r: any;
  const before = loadavg()[0];
  try {
    o.say(`fine_tune: ${o.model} on ${o.dataset}, b${o.batch} s${o.seqLen}, ${o.steps} steps…`);
    r = await server.call("run_benchmark", args);
    // A job: followed to its report, which a stop or a cancel keeps partial.
    while (r.job_id && !r.configs) {
      await sleep(2000);
      const j = await server.call("get_job", { job_id: r.job_id });
      if (j.status !== "running" && j.result) r = j.result;
      else if (j.status !== "running")
        throw new Error(`fine_tune job ${j.status}: ${JSON.stringify(j.error)}`);
    }
  } finally {
    await server.close();
  }
  const [fp32, bf16] = DTYPES.map((d) => r.configs.find((c: any) => c.dtype === d));
  for (const c of [fp32, bf16]) {
    if (c.error) {
      sec.row(c.dtype, "FAILED", `${c.error.code}: ${c.error.message}`);
      continue;
    }
    sec.row(
      c.dtype,
      `${c.status} ${c.train_steps}/${c.steps_requested} steps`,
      `held-out ${c.heldout_first} → ${c.heldout_final}, train loss ${c.loss_first?.toFixed(4)} → ${c.loss_final?.toFixed(4)}, ` +
        `${c.tokens_per_s?.toFixed(0)} tokens/s, p50 ${c.latency_ms?.p50.toFixed(1)} ms/step`,
    );
    sec.fig(`${c.dtype}.heldout_first`, c.heldout_first);
    sec.fig(`${c.dtype}.heldout_final`, c.heldout_final);
    sec.fig(`${c.dtype}.tokens_per_s`, c.tokens_per_s);
  }
  // Both held-out curves and their drift, step by step.
  for (const h of fp32.heldout_loss ?? []) {
    const b = (bf16.heldout_loss ?? []).find((x: any) => x.step === h.step);
    sec.row(
      `held-out @ step ${h.step}`,
      `fp32 ${h.loss} | bf16 ${b?.loss ?? "–"}`,
      b ? `drift ${Math.abs(b.loss - h.loss).toExponential(2)}` : "",
    );
  }
  const d = bf16.loss_drift_vs_fp32;
  if (d) {
    sec.row(
      "bf16 train-loss drift",
      `max ${d.max_abs}`,
      `final ${d.final_abs} over ${d.steps} steps`,
    );
    sec.fig("bfloat16.loss_drift_max_abs", d.max_abs);
  }
  sec.note(
    `fine_tune: ${o.model} on ${o.dataset} (${JSON.stringify(r.manifest.fine_tune?.data ?? {})}), lr ${o.learningRate}`,
  );
  writeRunDetail("fine_tune", args, r, before);
  return sec.result();
}
