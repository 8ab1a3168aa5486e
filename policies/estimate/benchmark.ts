// A benchmark: every configuration of its grid (dtypes × modes × batches × lengths), the float32 reference, the worst case of its stability extension, and a training step's extra memory.
import {
  DEFAULT_ITERATIONS,
  DEFAULT_MAX_NEW_TOKENS,
  DEFAULT_SEQ_LEN,
  DEFAULT_WARMUP,
  EXTEND_FACTOR,
} from "../../lib/benchmark_defaults.js";
import { blankModelled, extensionS, latencyMs, num, nums, strs } from "./model.js";
import type { WorkKind } from "./work_kind.js";

export const benchmark: WorkKind = {
  work(_input, { dtype, keep }) {
    return {
      dtype,
      ...keep(
        "batch_sizes",
        "seq_lens",
        "dtypes",
        "modes",
        "mode",
        "scenario",
        "work",
        "max_new_tokens",
        "optimizer",
        "iterations",
        "duration_s",
        "warmup",
        "extend_factor",
      ),
    };
  },
  classOf(w) {
    const sorted = (v: unknown) => strs(v).slice().sort().join(",");
    return [
      "benchmark",
      w.dtype,
      w.work ?? "forward",
      w.scenario ?? "single-stream",
      sorted(w.dtypes),
      sorted(w.modes) || String(w.mode ?? "eager"),
    ].join("|");
  },
  modelled(input, { a, dtype, compileGraph, alreadyLoaded, device: kind }) {
    const { args, model } = input;
    const m = blankModelled(dtype);
    const batches = nums(args.batch_sizes);
    const seqs = nums(args.seq_lens);
    const dtypes = strs(args.dtypes);
    const modes = strs(args.modes);
    const bs = batches.length ? batches : [1];
    const ls = seqs.length ? seqs : [DEFAULT_SEQ_LEN];
    const ds = dtypes.length ? dtypes : [dtype];
    const ms = modes.length ? modes : [String(args.mode ?? "eager")];
    const iterations = num(args.iterations) ?? DEFAULT_ITERATIONS;
    const warmup = num(args.warmup) ?? DEFAULT_WARMUP;
    const duration = num(args.duration_s);
    // How far an unstable series may be extended (the tool resolves it: 1 keeps a duration_s
    // run inside duration_s); an engine other than the worker's own never extends.
    const factor =
      model?.engine && model.engine !== "torch" ? 1 : (num(args.extend_factor) ?? EXTEND_FACTOR);
    // Generation: the prompt's forward pass plus one decoding step (batch × 1 token, with a KV
    // cache) per new token, for every iteration, warmup and reference pass alike.
    const newTokens =
      args.work === "generate" ? (num(args.max_new_tokens) ?? DEFAULT_MAX_NEW_TOKENS) : 0;
    const step = a.decode_step_overhead_s;
    // A training step: forward, backward (about twice the forward) and the optimizer's update,
    // a few elementwise passes over the float32 weights (AdamW ~4, SGD with momentum ~2).
    // A fine-tune (work "fine_tune") is priced as its steps of training (iterations: steps).
    const training = args.work === "train_step" || args.work === "fine_tune";
    const params = input.model?.parameters ?? 0;
    const rate = a.flops_per_s[kind] ?? a.flops_per_s.cpu ?? 100e9;
    const optimizerS = training ? ((args.optimizer === "sgd" ? 2 : 4) * 4 * params) / rate : 0;
    const pass = (b: number, l: number, d: string) =>
      training
        ? (3 * latencyMs(input, b, l, d, a)) / 1000 + optimizerS
        : (latencyMs(input, b, l, d, a) + newTokens * latencyMs(input, b, 1, d, a, step)) / 1000;
    // Offline measures the largest batch per series only.
    const points = args.scenario === "offline" ? [Math.max(...bs)] : bs;
    for (const d of ds) {
      for (const mode of ms) {
        for (const b of points) {
          for (const l of ls) {
            const per = pass(b, l, d);
            const timed = duration !== undefined ? duration : iterations * per;
            // "compile", or a training step compiled whole ("compile_step"): one graph each.
            const graph = mode !== "eager" ? compileGraph : 0;
            m.compileS += graph;
            m.deviceSeconds += graph + warmup * per + timed + a.benchmark_config_overhead_s;
            // An unstable configuration runs longer (the worker's stability extension): its
            // worst case is part of what is approved and reserved.
            const more = extensionS(
              duration !== undefined ? { duration_s: duration } : { iterations },
              per,
              factor,
              input.max_duration_s,
            );
            if (duration !== undefined) m.extension.wallS += more;
            else m.extension.passesS += more;
          }
        }
      }
    }
    // The fp32 reference for precision error: one eager pass per (batch, seq_len) point; a
    // training grid counts the FLOPs of one forward and one forward + backward instead.
    for (const b of points)
      for (const l of ls)
        m.deviceSeconds += training
          ? (4 * latencyMs(input, b, l, "float32", a)) / 1000
          : pass(b, l, "float32");
    // A float32 copy of the weights, its gradients and the optimizer's state (AdamW two moments,
    // SGD one momentum buffer), beside the served model.
    if (training) m.extraBytes = params * 4 * (2 + (args.optimizer === "sgd" ? 1 : 2));
    m.tokens = Math.max(...bs) * (Math.max(...ls) + newTokens);
    m.needsWeights = !alreadyLoaded;
    m.weightBytes = alreadyLoaded ? 0 : (model?.weight_bytes ?? 0);
    return m;
  },
};
