// Compares a benchmark report with a baseline: ratios per matching configuration (this report
// over the baseline: latency < 1 is faster, throughput > 1 is better), and warnings wherever the
// two are not like for like (device, precision, scenario, work, compile backend, versions, weights).
type Config = Record<string, any>;

const key = (c: Config) => `${c.batch}|${c.seq_len ?? "-"}|${c.dtype}|${c.mode}`;

export type Ratio = {
  batch: number;
  seq_len: number | null;
  dtype: string;
  mode: string;
  p50_ratio: number | null;
  p90_ratio: number | null;
  p99_ratio: number | null;
  mean_ratio: number | null;
  throughput_ratio: number | null;
  compile_s_ratio: number | null;
  peak_memory_ratio: number | null;
};

export interface Comparison {
  baseline_id: string;
  ratios: Ratio[];
  unmatched: number;
  warnings: string[];
}

const ratio = (a: unknown, b: unknown) =>
  typeof a === "number" && typeof b === "number" && Number.isFinite(a) && b > 0 ? a / b : null;

/** Describes the device a manifest measured (old reports stored an object, new ones strings). */
function deviceOf(m: Config): string {
  if (m?.device && typeof m.device === "object") return `${m.device.kind}:${m.device.name}`;
  return `${m?.device_kind ?? m?.device ?? "?"}:${m?.device_name ?? "?"}`;
}

export function compareReports(report: Config, baseline: Config, baselineId: string): Comparison {
  const base = new Map<string, Config>(
    (baseline.configs ?? []).filter((c: Config) => !c.error).map((c: Config) => [key(c), c]),
  );
  const ratios: Ratio[] = [];
  let unmatched = 0;
  const warnings: string[] = [];
  const precisionDiffers = new Set<string>();
  for (const c of (report.configs ?? []) as Config[]) {
    const b = base.get(key(c));
    if (!b || c.error) {
      unmatched++;
      continue;
    }
    const l = c.latency_ms ?? {};
    const bl = b.latency_ms ?? {};
    ratios.push({
      batch: c.batch,
      seq_len: c.seq_len ?? null,
      dtype: c.dtype,
      mode: c.mode,
      p50_ratio: ratio(l.p50, bl.p50),
      p90_ratio: ratio(l.p90, bl.p90),
      p99_ratio: ratio(l.p99, bl.p99),
      mean_ratio: ratio(l.mean, bl.mean),
      throughput_ratio: ratio(c.throughput_items_per_s, b.throughput_items_per_s),
      compile_s_ratio: c.mode === "compile" ? ratio(c.compile_s, b.compile_s) : null,
      peak_memory_ratio: ratio(c.peak_memory_bytes, b.peak_memory_bytes),
    });
    if (c.matmul_precision !== b.matmul_precision) {
      precisionDiffers.add(`${c.matmul_precision} vs ${b.matmul_precision}`);
    }
    if (c.recompiled || b.recompiled)
      warnings.push(
        `${key(c)} recompiled inside the measured window in ${c.recompiled ? "this report" : "the baseline"}`,
      );
    if (c.peak_memory_kind && b.peak_memory_kind && c.peak_memory_kind !== b.peak_memory_kind) {
      warnings.push(
        `${key(c)}: peak memory measured differently (${c.peak_memory_kind} vs ${b.peak_memory_kind})`,
      );
    }
  }
  for (const p of precisionDiffers) warnings.push(`matmul precision differs: ${p}`);
  const m = report.manifest ?? {};
  const bm = baseline.manifest ?? {};
  if (deviceOf(m) !== deviceOf(bm))
    warnings.push(`devices differ: ${deviceOf(m)} vs ${deviceOf(bm)}`);
  const same = (field: string, label: string) => {
    if (m[field] !== undefined && bm[field] !== undefined && m[field] !== bm[field]) {
      warnings.push(`${label} differ: ${m[field]} vs ${bm[field]}`);
    }
  };
  same("scenario", "scenarios");
  same("work", "work types");
  same("execution_mode", "execution modes");
  same("compile_backend", "compile backends");
  same("torch_version", "torch versions");
  same("backend_version", "backend versions");
  same("torch_threads", "torch thread counts");
  same("precision_reference", "precision references");
  if (m.weight_digest && bm.weight_digest && m.weight_digest !== bm.weight_digest)
    warnings.push("the weights differ (digest)");
  const modes = (r: Config) =>
    [...new Set(((r.configs ?? []) as Config[]).map((c) => c.mode))].sort().join(",");
  if (modes(report) !== modes(baseline))
    warnings.push(`modes differ: ${modes(report)} vs ${modes(baseline)}`);
  if (unmatched) warnings.push(`${unmatched} configuration(s) have no counterpart in the baseline`);
  return { baseline_id: baselineId, ratios, unmatched, warnings };
}
