// Markdown rendering of a stored benchmark report, for tpu://benchmarks/{id}.md and the README.
import { unstableNote } from "./compare.js";
import { TRAIN_HEADERS, trainNotes, trainRow } from "./train_rows.js";
import { fineTuneSection } from "./fine_tune_rows.js";

type Any = Record<string, any>;

const num = (v: unknown, digits = 2) =>
  typeof v === "number" && Number.isFinite(v) ? v.toFixed(digits) : "–";
const sci = (v: unknown) =>
  typeof v === "number" && Number.isFinite(v) ? (v === 0 ? "0" : v.toExponential(1)) : "–";
const mib = (v: unknown) =>
  typeof v === "number" && Number.isFinite(v) ? (v / 2 ** 20).toFixed(1) : "–";
const pct = (v: unknown) =>
  typeof v === "number" && Number.isFinite(v) ? `${(v * 100).toFixed(2)}` : "–";
const ci = (v: unknown) => (Array.isArray(v) && v.length === 2 ? `${num(v[0])}–${num(v[1])}` : "–");
/** "yes", "**no**", or "–" for a report made before verdicts. */
const stable = (c: Any) =>
  c.stability?.stable === true ? "yes" : c.stability?.stable === false ? "**no**" : "–";
const cos = (v: unknown) => (typeof v === "number" && Number.isFinite(v) ? v.toFixed(6) : "–");

function deviceLine(m: Any): string {
  if (m.device && typeof m.device === "object")
    return `${m.device.kind ?? "?"} (${m.device.name ?? "?"})`;
  return `${m.device ?? "?"} (${m.device_name ?? "?"}${m.device_count ? `, ${m.device_count} device(s)` : ""})`;
}

export function renderReportMarkdown(report: Any): string {
  const m: Any = report.manifest ?? {};
  const lines: string[] = [];
  lines.push(`# Benchmark ${report.report_id ?? ""} — ${report.model}`);
  lines.push("");
  lines.push(
    `Scenario **${report.scenario ?? m.scenario ?? "?"}**, work **${report.work ?? m.work ?? "forward"}** on **${deviceLine(m)}**, ` +
      `torch ${m.torch_version ?? "?"}` +
      (m.backend_version && m.backend_version !== m.torch_version
        ? `, backend ${m.backend ?? ""} ${m.backend_version}`
        : "") +
      (m.compile_backend ? `, compile backend ${m.compile_backend}` : "") +
      (report.cancelled ? " — **cancelled: partial results**" : "") +
      (report.stopped ? ` — **stopped (${report.stopped}): partial results**` : ""),
  );
  lines.push("");
  // With the server's pricing set: what the measured device time cost.
  const cost: Any = report.cost;
  if (cost)
    lines.push(
      `Cost: ${cost.measured} ${cost.currency} for ${cost.measured_s} s measured on ${cost.device_kind} at ${cost.price_per_chip_hour} ${cost.currency} per chip-hour.`,
      "",
    );
  lines.push(
    `Warmup ${m.warmup ?? "?"} (never counted), ${m.iterations ? `${m.iterations} iterations` : `${m.duration_s} s`} per configuration; ` +
      `${m.torch_threads ?? "?"} torch threads; seed ${m.seed ?? "?"}; precision reference: ${m.precision_reference ?? "–"}; ` +
      `peak memory: ${m.peak_memory_kind ?? "–"}.`,
  );
  lines.push("");
  const tuned = (report.work ?? m.work) === "fine_tune";
  const training = (report.work ?? m.work) === "train_step" || tuned;
  if (training) {
    const o = m.optimizer ?? {};
    const t = tuned ? m.fine_tune : m.train;
    lines.push(
      `Training: optimizer ${o.name ?? "?"} (lr ${o.lr ?? "?"}), loss ${t?.loss ?? "?"}; ${t?.weights ?? ""}; ${t?.precision ?? ""}.` +
        (tuned
          ? ` Dataset ${m.dataset?.id ?? "?"} (sha256 ${m.dataset?.sha256 ?? "?"}), ${m.fine_tune?.steps ?? "?"} steps, held-out every ${m.fine_tune?.eval_every ?? "?"}.`
          : ""),
      "",
      `| ${TRAIN_HEADERS.join(" | ")} |`,
      `|${TRAIN_HEADERS.map((h) => (["dtype", "mode", "stable", "loss first → final", "bf16 drift (max, final)"].includes(h) ? "---" : "---:")).join("|")}|`,
    );
  } else {
    lines.push(
      "| batch | seq | dtype | mode | p50 ms | p90 ms | p99 ms | mean ms | p50 95 % CI | MAD ms | stable | items/s | compile s | recompiled | peak MiB | +MiB | max abs err | max rel err | cosine | GFLOP/item | % of peak | matmul precision |",
    );
    lines.push(
      "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    );
  }
  const failed: string[] = [];
  for (const c of (report.configs ?? []) as Any[]) {
    if (c.error) {
      failed.push(
        `- batch ${c.batch}${c.seq_len ? `, seq ${c.seq_len}` : ""}, ${c.dtype}, ${c.mode}: **${c.error.code}** — ${c.error.message}`,
      );
      continue;
    }
    if (training) {
      lines.push(`| ${trainRow(c).join(" | ")} |`);
      continue;
    }
    const l = c.latency_ms ?? {};
    lines.push(
      `| ${c.batch} | ${c.seq_len ?? "–"} | ${c.dtype} | ${c.mode} | ${num(l.p50)} | ${num(l.p90)} | ${num(l.p99)} | ${num(l.mean)} | ` +
        `${ci(c.stability?.p50_ci_ms)} | ${num(c.stability?.mad_ms, 3)} | ${stable(c)} | ` +
        `${num(c.throughput_items_per_s, 1)} | ${c.mode === "compile" ? num(c.compile_s, 3) : "–"} | ${c.recompiled ? `**yes (${c.recompiles_in_window})**` : "no"} | ` +
        `${mib(c.peak_memory_bytes)} | ${mib(c.peak_memory_increase_bytes)} | ${sci(c.max_abs_error_vs_fp32)} | ${sci(c.max_rel_error_vs_fp32)} | ` +
        `${cos(c.cosine_similarity_vs_fp32)} | ${typeof c.flops_per_item === "number" ? (c.flops_per_item / 1e9).toFixed(3) : "–"} | ` +
        `${c.fraction_of_peak_fault ? "fault" : pct(c.fraction_of_peak)} | ${c.matmul_precision ?? "–"} |`,
    );
  }
  if (tuned) lines.push(...fineTuneSection((report.configs ?? []) as Any[]));
  // A fraction of peak above 1 is a measurement fault (the worker says which): never a figure.
  const fault = ((report.configs ?? []) as Any[]).find((c) => !c.error && c.fraction_of_peak_fault);
  if (fault) lines.push("", `% of peak not shown ("fault"): ${fault.fraction_of_peak_fault}.`);
  const offline = ((report.configs ?? []) as Any[]).filter(
    (c) => Array.isArray(c.offline_skipped_batches) && c.offline_skipped_batches.length,
  );
  if (offline.length) {
    lines.push("", "Offline: batches skipped because they did not fit:");
    for (const c of offline) {
      lines.push(
        `- ${c.dtype} ${c.mode}${c.seq_len ? ` seq ${c.seq_len}` : ""}: ran batch ${c.batch}; skipped ${c.offline_skipped_batches.map((s: Any) => `${s.batch} (${s.reason})`).join(", ")}`,
      );
    }
  }
  const unstable = ((report.configs ?? []) as Any[]).filter((c) => !c.error && unstableNote(c));
  if (unstable.length) {
    lines.push("", "Unstable configurations (their figures may move on a quiet host):");
    for (const c of unstable) {
      const st = c.stability;
      lines.push(
        `- batch ${c.batch}${c.seq_len ? `, seq ${c.seq_len}` : ""}, ${c.dtype}, ${c.mode}: ${unstableNote(c)}` +
          ` (${c.iterations} iterations${st.extended ? `, extended from ${st.iterations_requested ?? "a duration"}` : ""})`,
      );
    }
  }
  const notes = training ? trainNotes((report.configs ?? []) as Any[]) : [];
  if (notes.length) lines.push("", "Notes:", ...notes.map((n) => `- ${n}`));
  if (failed.length) lines.push("", "Failed configurations:", ...failed);
  const peaks = [
    ...new Set(((report.configs ?? []) as Any[]).map((c) => c.peak_flops_source).filter(Boolean)),
  ];
  if (peaks.length) lines.push("", `Peak FLOP/s: ${peaks.join("; ")}.`);
  if (report.comparison) {
    const cmp = report.comparison as Any;
    lines.push(
      "",
      `## Compared with ${cmp.baseline_id}`,
      "",
      "Ratios are this report over the baseline (latency < 1 and throughput > 1 are better). " +
        "The p50 interval is this report's 95 % interval over the baseline's; where the two reports' " +
        "intervals overlap there is no significant difference.",
      "",
    );
    lines.push(
      "| batch | seq | dtype | mode | p50 | p50 interval | difference | p90 | p99 | throughput | compile s | peak memory |",
    );
    lines.push("|---:|---:|---|---|---:|---:|---|---:|---:|---:|---:|---:|");
    for (const r of cmp.ratios as Any[]) {
      lines.push(
        `| ${r.batch} | ${r.seq_len ?? "–"} | ${r.dtype} | ${r.mode} | ${num(r.p50_ratio, 3)} | ${r.p50_ratio_ci ? `${num(r.p50_ratio_ci[0], 3)}–${num(r.p50_ratio_ci[1], 3)}` : "–"} | ${r.difference ?? "–"} | ${num(r.p90_ratio, 3)} | ${num(r.p99_ratio, 3)} | ${num(r.throughput_ratio, 3)} | ${num(r.compile_s_ratio, 3)} | ${num(r.peak_memory_ratio, 3)} |`,
      );
    }
    for (const w of cmp.warnings as string[]) lines.push(`- warning: ${w}`);
  }
  lines.push("", "## Manifest", "", "```json", JSON.stringify(m, null, 2), "```", "");
  return lines.join("\n");
}
