// An inference: one forward over the batch and one decoding step per new token; a compiled model's first call of a shape bucket compiles.
import { blankModelled, bucket, latencyMs, num, nums } from "./model.js";
import type { WorkKind } from "./work_kind.js";

export const inference: WorkKind = {
  work(input, { a, dtype, keep }) {
    const { args, model } = input;
    // Already reduced (a stored call's work): as it is.
    if (typeof args.items === "number") return { ...args };
    const texts = Array.isArray(args.texts) ? args.texts : [];
    const tensors = Array.isArray(args.tensors) ? args.tensors : [];
    let items = texts.length;
    let seq = 1;
    if (texts.length > 0) {
      const maxChars = Math.max(...texts.map((t) => (typeof t === "string" ? t.length : 0)));
      seq = Math.max(1, Math.ceil(maxChars * a.tokens_per_char));
    } else if (tensors.length > 0) {
      const shape = nums((tensors[0] as Record<string, unknown>)?.shape);
      items = shape[0] ?? 1;
    }
    items = Math.max(1, items);
    const mode = input.loaded_mode ?? "eager";
    const since = input.loaded_at;
    // A model with a shape plan compiled all of it at load: no call of it compiles.
    const cold =
      mode === "compile" &&
      model?.shape_plan == null &&
      since !== undefined &&
      !(input.calls ?? []).some(
        (c) =>
          c.kind === "inference" &&
          c.model === model?.id &&
          c.at >= since &&
          bucket(Number(c.work.items)) === bucket(items) &&
          bucket(Number(c.work.seq)) === bucket(seq),
      );
    return {
      ...keep(),
      dtype,
      items,
      seq,
      max_new_tokens: num(args.max_new_tokens) ?? 0,
      mode,
      cold,
    };
  },
  classOf(w) {
    return [
      "inference",
      w.dtype,
      w.mode,
      Number(w.max_new_tokens) > 0 ? "generate" : "forward",
      w.cold ? "cold" : "warm",
    ].join("|");
  },
  modelled(input, { a, dtype, compileGraph }) {
    const { args } = input;
    const m = blankModelled(dtype);
    const items = num(args.items) ?? 1;
    const seq = num(args.seq) ?? 1;
    const newTokens = num(args.max_new_tokens) ?? 0;
    // Decoding costs one forward over the batch per new token (with a KV cache: ~1 token each).
    m.deviceSeconds =
      latencyMs(input, items, seq, dtype, a) / 1000 +
      newTokens * (latencyMs(input, items, 1, dtype, a, a.decode_step_overhead_s) / 1000);
    // A compiled model's first call of a shape compiles it before it runs.
    if (args.cold) {
      m.compileS = compileGraph;
      m.deviceSeconds += compileGraph;
    }
    m.tokens = items * (seq + newTokens);
    return m;
  },
};
