// A check: one recorded forward pass at a batch and length (operator interception about as much again), a shape audit priced as one compile.
import { DEFAULT_SEQ_LEN } from "../../lib/benchmark_defaults.js";
import { blankModelled, latencyMs, num } from "./model.js";
import type { WorkKind } from "./work_kind.js";

export const check: WorkKind = {
  work(input, { dtype, keep }) {
    const { args } = input;
    return {
      dtype,
      batch: num(args.batch) ?? 1,
      seq_len: num(args.seq_len) ?? DEFAULT_SEQ_LEN,
      ...keep("attention", "mode"),
      ...(args.cold === true ? { cold: true } : {}),
      ...(args.shape_audit === true ? { shape_audit: true } : {}),
    };
  },
  classOf(w) {
    // A cold check (a fresh worker's first) is a class of its own; warm ones keep their key.
    return [
      "check",
      w.dtype,
      w.attention ?? "default",
      ...(w.cold ? ["cold"] : []),
      ...(w.shape_audit ? ["audit"] : []),
    ].join("|");
  },
  modelled(input, { a, dtype, compileGraph, alreadyLoaded }) {
    const { args, model } = input;
    const m = blankModelled(dtype);
    m.weightBytes = alreadyLoaded ? 0 : (model?.weight_bytes ?? 0);
    m.needsWeights = !alreadyLoaded;
    m.compileS = args.mode === "compile" ? compileGraph : 0;
    const b = num(args.batch) ?? 1;
    const l = num(args.seq_len) ?? DEFAULT_SEQ_LEN;
    m.tokens = b * l;
    // One recorded forward pass: operator interception costs about as much again. A shape
    // audit (a dynamo trace, no code generated) is charged as one graph's compile.
    m.deviceSeconds =
      a.check_overhead_s +
      m.weightBytes / a.load_bytes_per_s +
      m.compileS +
      (args.shape_audit === true ? compileGraph : 0) +
      (2 * latencyMs(input, b, l, dtype, a)) / 1000;
    return m;
  },
};
