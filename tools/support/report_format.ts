// Markdown rendering of a stored benchmark report, for tpu://benchmarks/{id}.md and the README.
type Any = Record<string, any>;

const num = (v: unknown, digits = 2) => (typeof v === "number" && Number.isFinite(v) ? v.toFixed(digits) : "–");

export function renderReportMarkdown(report: Any): string {
  const m: Any = report.manifest ?? {};
  const dev: Any = m.device ?? {};
  const lines: string[] = [];
  lines.push(`# Benchmark ${report.report_id ?? ""} — ${report.model}`);
  lines.push("");
  lines.push(
    `Scenario **${report.scenario}** on **${dev.kind ?? "?"}** (${dev.name ?? "?"}), torch ${m.torch_version ?? "?"}` +
      (m.backend_version ? `, backend ${m.backend_version}` : "") +
      (report.cancelled ? " — **cancelled: partial results**" : ""),
  );
  lines.push("");
  lines.push("| batch | seq | dtype | mode | p50 ms | p90 ms | p99 ms | items/s | compile s | matmul precision |");
  lines.push("|---:|---:|---|---|---:|---:|---:|---:|---:|---|");
  for (const c of (report.configs ?? []) as Any[]) {
    const l = c.latency_ms ?? {};
    lines.push(
      `| ${c.batch} | ${c.seq_len ?? "–"} | ${c.dtype} | ${c.mode} | ${num(l.p50)} | ${num(l.p90)} | ${num(l.p99)} | ${num(c.throughput_items_per_s, 1)} | ${num(c.compile_s, 3)} | ${c.matmul_precision ?? "–"} |`,
    );
  }
  if (report.comparison) {
    const cmp = report.comparison as Any;
    lines.push("", `## Compared with ${cmp.baseline_id}`, "");
    lines.push("| batch | seq | dtype | mode | p50 ratio | p99 ratio | throughput ratio |");
    lines.push("|---:|---:|---|---|---:|---:|---:|");
    for (const r of cmp.ratios as Any[]) {
      lines.push(`| ${r.batch} | ${r.seq_len ?? "–"} | ${r.dtype} | ${r.mode} | ${num(r.p50_ratio, 3)} | ${num(r.p99_ratio, 3)} | ${num(r.throughput_ratio, 3)} |`);
    }
    for (const w of cmp.warnings as string[]) lines.push(`- warning: ${w}`);
  }
  lines.push("", "## Manifest", "", "```json", JSON.stringify(m, null, 2), "```", "");
  return lines.join("\n");
}
