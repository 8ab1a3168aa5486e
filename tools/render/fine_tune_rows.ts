// The figures of a work "fine_tune" benchmark report (tpu_worker/bench/fine_tune.py): one line
// per configuration for the tool's text, and the Markdown section with the held-out curves side
// by side. No imports, no DOM.

type Config = Record<string, any>;

const num = (v: unknown, digits = 2) =>
  typeof v === "number" && Number.isFinite(v) ? v.toFixed(digits) : "–";
const loss = (v: unknown) => (typeof v === "number" && Number.isFinite(v) ? v.toPrecision(5) : "–");
const sci = (v: unknown) =>
  typeof v === "number" && Number.isFinite(v) ? (v === 0 ? "0" : v.toExponential(2)) : "–";

/** One line of the tool's text answer: status, steps, train and held-out loss, speed, drift. */
export function fineTuneLine(c: Config): string {
  const head = `  b=${c.batch} s=${c.seq_len} ${c.dtype} ${c.mode}: ${c.status ?? "?"} ${c.train_steps ?? 0}/${c.steps_requested ?? "?"} steps`;
  if (c.error) return `${head}, ${c.error.code}: ${c.error.message}`;
  if (!c.train_steps) return head;
  const l = c.latency_ms ?? {};
  const d = c.loss_drift_vs_fp32;
  const h = c.heldout_drift_vs_fp32;
  const mfu =
    typeof c.fraction_of_peak === "number"
      ? `, MFU ${(c.fraction_of_peak * 100).toFixed(2)} %${String(c.mfu_basis ?? "").startsWith("host") ? " (host figure)" : ""}`
      : "";
  return (
    `${head}, loss ${loss(c.loss_first)} → ${loss(c.loss_final)}, held-out ${loss(c.heldout_first)} → ${loss(c.heldout_final)}` +
    `, p50 ${num(l.p50)} ms/step, ${num(c.tokens_per_s, 0)} tokens/s` +
    (c.mode !== "eager" ? `, compile ${num(c.compile_s)} s` : "") +
    mfu +
    (d ? `, bf16 drift max ${sci(d.max_abs)} (held-out ${sci(h?.max_abs)})` : "")
  );
}

/** The Markdown section: the held-out curves of every configuration, one column each. */
export function fineTuneSection(configs: Config[]): string[] {
  const ran = configs.filter((c) => Array.isArray(c.heldout_loss) && c.heldout_loss.length);
  if (!ran.length) return [];
  const steps = [...new Set(ran.flatMap((c) => c.heldout_loss.map((h: Config) => h.step)))].sort(
    (a, b) => a - b,
  );
  const at = (c: Config, s: number) => c.heldout_loss.find((h: Config) => h.step === s)?.loss;
  return [
    "",
    "Held-out loss (the same held-out blocks for every configuration):",
    "",
    `| step | ${ran.map((c) => `${c.dtype} ${c.mode}`).join(" | ")} |`,
    `|---:|${ran.map(() => "---:").join("|")}|`,
    ...steps.map((s) => `| ${s} | ${ran.map((c) => loss(at(c, s))).join(" | ")} |`),
    "",
    `Status: ${configs.map((c) => `${c.dtype} ${c.mode} ${c.status} (${c.train_steps ?? 0}/${c.steps_requested ?? "?"} steps)`).join("; ")}.`,
  ];
}
