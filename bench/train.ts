// One training path, measured through MCP (issue 28): run_benchmark work "train_step" on one
// built-in model in eager and compile mode, float32 and bfloat16 autocast, in one run, with step
// time, compile time apart and bfloat16's loss drift from float32 side by side. The detailed
// result goes to bench/results/train.json.
import { loadavg } from "node:os";
import { startStdio } from "./lib/procs.js";
import { section, writeRunDetail, type SectionResult } from "./lib/report.js";

export interface TrainBenchOptions {
  config: string;
  model: string;
  seqLen: number;
  batch: number;
  iterations: number;
  optimizer: "adamw" | "sgd";
  say: (msg: string) => void;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const MODES = ["eager", "compile", "compile_step"];

export async function runTrain(o: TrainBenchOptions): Promise<SectionResult> {
  const sec = section("train");
  const args = {
    model: o.model,
    work: "train_step",
    optimizer: o.optimizer,
    batch_sizes: [o.batch],
    seq_lens: [o.seqLen],
    dtypes: ["float32", "bfloat16"],
    // The split (model and loss compiled, optimizer eager) and the whole step compiled, as
    // TorchTPU's compile guide advises, side by side.
    modes: MODES,
    iterations: o.iterations,
    warmup: 2,
  };
  const server = await startStdio(o.config);
  let r: any;
  const before = loadavg()[0];
  try {
    await server.call("load_model", { model: o.model });
    o.say(
      `train: ${o.model} b${o.batch} s${o.seqLen} ${o.optimizer}, ${2 * MODES.length} configurations…`,
    );
    r = await server.call("run_benchmark", args);
    // Past the server's soft deadline the answer is a job: follow it to its report.
    while (r.job_id && !r.configs) {
      await sleep(1000);
      const j = await server.call("get_job", { job_id: r.job_id });
      if (j.status === "succeeded") r = j.result;
      else if (j.status !== "running")
        throw new Error(`train_step job ${j.status}: ${JSON.stringify(j.error)}`);
    }
  } finally {
    await server.close();
  }
  const cfg = (dtype: string, mode: string) =>
    r.configs.find((c: any) => c.dtype === dtype && c.mode === mode);
  for (const dtype of ["float32", "bfloat16"]) {
    for (const mode of MODES) {
      const c = cfg(dtype, mode);
      if (c.error) {
        sec.row(`${dtype} ${mode}`, "FAILED", `${c.error.code}: ${c.error.message}`);
        continue;
      }
      const drift = c.loss_drift_vs_fp32;
      sec.row(
        `${dtype} ${mode}`,
        `${c.latency_ms.p50.toFixed(2)} ms/step`,
        `p99 ${c.latency_ms.p99.toFixed(2)} ms, ${c.tokens_per_s.toFixed(0)} tokens/s` +
          (mode !== "eager" ? `, compile ${c.compile_s.toFixed(1)} s` : "") +
          `, loss ${c.loss_first.toFixed(4)} → ${c.loss_final.toFixed(4)} over ${c.train_steps} steps` +
          (drift ? `, drift vs fp32 max ${drift.max_abs.toExponential(2)}` : "") +
          `, ${c.stability.stable ? "stable" : `unstable: ${c.stability.reason}`}`,
      );
      const key = `${dtype}.${mode}`;
      sec.fig(`${key}.p50_ms`, c.latency_ms.p50);
      sec.fig(`${key}.tokens_per_s`, c.tokens_per_s);
      if (mode !== "eager") sec.fig(`${key}.compile_s`, c.compile_s);
      if (drift) sec.fig(`${key}.loss_drift_max_abs`, drift.max_abs);
    }
    const e = cfg(dtype, "eager");
    for (const mode of MODES.slice(1)) {
      const k = cfg(dtype, mode);
      if (e.error || k.error) continue;
      const speedup = e.latency_ms.p50 / k.latency_ms.p50;
      sec.row(`${dtype} ${mode} vs eager`, `×${speedup.toFixed(2)}`, `eager p50 ÷ ${mode} p50`);
      sec.fig(`${dtype}.${mode}_speedup`, speedup);
    }
  }
  sec.note(
    `train: ${o.model} batch ${o.batch} seq ${o.seqLen}, ${o.optimizer}, ${o.iterations} iterations asked, compile backend ${r.manifest.compile_backend}`,
  );
  writeRunDetail("train", args, r, before);
  return sec.result();
}
