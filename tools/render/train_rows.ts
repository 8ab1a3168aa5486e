// The figures of a work "train_step" benchmark report as table rows: one reading for the tool's
// text, the Markdown report and the MCP App view (console/src/report_data.ts re-exports it), so
// all three show the same columns. No imports, no DOM.

type Config = Record<string, any>;

const num = (v: unknown, digits = 2) =>
  typeof v === "number" && Number.isFinite(v) ? v.toFixed(digits) : "–";
const mib = (v: unknown) =>
  typeof v === "number" && Number.isFinite(v) ? (v / 2 ** 20).toFixed(2) : "–";
const loss = (v: unknown) => (typeof v === "number" && Number.isFinite(v) ? v.toPrecision(6) : "–");
const sci = (v: unknown) =>
  typeof v === "number" && Number.isFinite(v) ? (v === 0 ? "0" : v.toExponential(2)) : "–";

export const TRAIN_HEADERS = [
  "batch",
  "seq",
  "dtype",
  "mode",
  "p50 ms/step",
  "p99 ms/step",
  "samples/s",
  "tokens/s",
  "compile s",
  "steps",
  "loss first → final",
  "bf16 drift (max, final)",
  "weights MiB",
  "grads MiB",
  "optimizer MiB",
  "activations MiB",
  "GFLOP/step",
  "% of peak",
  "stable",
] as const;

/**
 * The fraction of peak as a percentage, or "fault" where the worker flagged it (a measured rate
 * above the peak is a timing or FLOP-count fault and is never shown as a figure).
 */
export function trainPeakCell(c: Config): string {
  if (c.fraction_of_peak_fault) return "fault";
  const f = c.fraction_of_peak;
  return typeof f === "number" && Number.isFinite(f) && f <= 1 ? (f * 100).toFixed(2) : "–";
}

export function trainRow(c: Config): string[] {
  const l = c.latency_ms ?? {};
  const s = c.memory_split ?? {};
  const d = c.loss_drift_vs_fp32;
  return [
    String(c.batch),
    c.seq_len == null ? "–" : String(c.seq_len),
    c.dtype,
    c.mode,
    num(l.p50, 3),
    num(l.p99, 3),
    num(c.throughput_items_per_s, 1),
    num(c.tokens_per_s, 0),
    c.mode === "compile" ? num(c.compile_s, 3) : "–",
    c.train_steps == null ? "–" : String(c.train_steps),
    `${loss(c.loss_first)} → ${loss(c.loss_final)}`,
    d ? `${sci(d.max_abs)}, ${sci(d.final_abs)}` : "–",
    mib(s.weights_bytes),
    mib(s.gradients_bytes),
    mib(s.optimizer_state_bytes),
    mib(s.activations_bytes),
    typeof c.flops_per_step === "number" ? (c.flops_per_step / 1e9).toFixed(4) : "–",
    trainPeakCell(c),
    c.stability?.stable === true ? "yes" : c.stability?.stable === false ? "no" : "–",
  ];
}

/** One line of the tool's text answer for a train_step configuration. */
export function trainLine(c: Config): string {
  const head = `  b=${c.batch}${c.seq_len ? ` s=${c.seq_len}` : ""} ${c.dtype} ${c.mode}`;
  if (c.error) return `${head}: ${c.error.code}`;
  const l = c.latency_ms ?? {};
  const d = c.loss_drift_vs_fp32;
  return (
    `${head}: p50 ${num(l.p50)} ms/step, p99 ${num(l.p99)} ms, ${num(c.throughput_items_per_s, 1)} samples/s` +
    (typeof c.tokens_per_s === "number" ? `, ${num(c.tokens_per_s, 0)} tokens/s` : "") +
    (c.mode === "compile" ? `, compile ${num(c.compile_s)} s` : "") +
    `, loss ${loss(c.loss_first)} → ${loss(c.loss_final)} over ${c.train_steps ?? "?"} steps` +
    (d ? `, bf16 drift max ${sci(d.max_abs)}` : "") +
    (c.fraction_of_peak_fault
      ? ", % of peak: FAULT (measured above peak)"
      : trainPeakCell(c) !== "–"
        ? `, ${trainPeakCell(c)} % of peak`
        : "")
  );
}

/** Notes under the table: flagged fractions of peak, and why a drift is missing. */
export function trainNotes(configs: Config[]): string[] {
  const out: string[] = [];
  for (const c of configs) {
    if (c.error) continue;
    const at = `batch ${c.batch}${c.seq_len ? `, seq ${c.seq_len}` : ""}, ${c.dtype}, ${c.mode}`;
    if (c.fraction_of_peak_fault) out.push(`${at}: ${c.fraction_of_peak_fault}`);
    if (c.loss_drift_note) out.push(`${at}: no bf16 drift (${c.loss_drift_note})`);
  }
  return out;
}
