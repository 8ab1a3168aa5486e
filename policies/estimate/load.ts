// A load: the weights read, a compiled load's plan warmed (one compile and one forward per shape), a cold library import or first build.
import { DEFAULT_SEQ_LEN } from "../../lib/benchmark_defaults.js";
import { blankModelled, coldLibrary, freshWorker, latencyMs, num } from "./model.js";
import type { WorkKind } from "./work_kind.js";

export const load: WorkKind = {
  work(input, { dtype, keep }) {
    const { args, model } = input;
    const mode = String(args.mode ?? "eager");
    const plan = model?.shape_plan;
    return {
      dtype,
      mode,
      ...keep("warmup_shapes", "warmup"),
      // A compiled load warms its plan: a measured one of another plan's size is scaled, not taken.
      ...(mode === "compile" && plan ? { graphs: plan.length } : {}),
      ...(coldLibrary(input) || freshWorker(input) ? { cold: true } : {}),
    };
  },
  classOf(w) {
    return ["load", w.dtype, w.mode, w.cold ? "cold" : "warm"].join("|");
  },
  modelled(input, { a, dtype, compileGraph }) {
    const { args, model } = input;
    const m = blankModelled(dtype);
    m.weightBytes = model?.weight_bytes ?? 0;
    m.needsWeights = true;
    // Warmup shapes ({batch, seq_len}) under either name the tools layer may use.
    const listed = Array.isArray(args.warmup_shapes) ? args.warmup_shapes : args.warmup;
    const warmup = Array.isArray(listed) ? listed : [];
    const shapes = warmup.length > 0 ? warmup : [{ batch: 1, seq_len: DEFAULT_SEQ_LEN }];
    let warm = 0;
    for (const s of shapes) {
      const sh = (s ?? {}) as Record<string, unknown>;
      const b = num(sh.batch) ?? 1;
      const l = num(sh.seq_len) ?? DEFAULT_SEQ_LEN;
      m.tokens = Math.max(m.tokens, b * l);
      warm += latencyMs(input, b, l, dtype, a) / 1000;
    }
    // A model with a shape plan compiles and runs every shape of it at load (and none later):
    // the estimate grows with the plan's buckets (MiniLM's 7 × 6 is 42 graphs). A measured
    // load's work keeps its plan's size (`graphs`); its warm-up is priced as that many of the
    // current plan's shapes on average, so a load of another plan scales by the two sizes.
    const plan = args.mode === "compile" ? model?.shape_plan : undefined;
    const graphs = plan ? (num(args.graphs) ?? plan.length) : shapes.length;
    if (plan && plan.length > 0) {
      let planWarm = 0;
      for (const s of plan) {
        m.tokens = Math.max(m.tokens, s.batch * Math.max(1, s.length));
        planWarm += latencyMs(input, s.batch, Math.max(1, s.length), dtype, a) / 1000;
      }
      warm += (planWarm * graphs) / plan.length;
    }
    m.compileS = args.mode === "compile" ? compileGraph * graphs : 0;
    // A cold load: the worker's first import of the model's library (which includes its first
    // build), or else the worker's first model build at all.
    const coldS = args.cold ? (model?.library ? a.library_import_s : a.first_build_s) : 0;
    m.deviceSeconds = coldS + m.weightBytes / a.load_bytes_per_s + m.compileS + warm;
    return m;
  },
};
