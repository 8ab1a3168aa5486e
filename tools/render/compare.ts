// Compares a benchmark report with a baseline: ratios per matching configuration (this report
// over the baseline: latency < 1 is faster, throughput > 1 is better), the p50 difference with its
// interval (significant only where the two reports' p50 intervals do not overlap), and warnings
// wherever the two are not like for like (device, precision, scenario, work, compile backend,
// versions, weights) or either side was measured unstable.
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
  /** The p50 ratio's interval: this report's p50 interval over the baseline's; null without both. */
  p50_ratio_ci: [number, number] | null;
  /** False where the p50 intervals overlap; null where either report has no interval. */
  significant: boolean | null;
  /** "no significant difference", "slower", "faster", or "no interval" (a report without one). */
  difference: string;
};

export interface Comparison {
  baseline_id: string;
  ratios: Ratio[];
  unmatched: number;
  warnings: string[];
}

const ratio = (a: unknown, b: unknown) =>
  typeof a === "number" && typeof b === "number" && Number.isFinite(a) && b > 0 ? a / b : null;

type Interval = [number, number];

/** A configuration's p50 interval (ms), when its report has one. */
function p50Interval(c: Config): Interval | null {
  const ci = c.stability?.p50_ci_ms;
  return Array.isArray(ci) && ci.length === 2 && ci.every((v) => Number.isFinite(v) && v >= 0)
    ? [ci[0], ci[1]]
    : null;
}

/**
 * The p50 difference of `a` over `b`: its ratio interval (a's low over b's high to a's high over
 * b's low), and whether the two intervals are apart. Overlapping 95 % intervals are read as no
 * significant difference: a conservative test, which is what a claim of "faster" should pass.
 */
export function p50Difference(
  a: Config,
  b: Config,
): Pick<Ratio, "p50_ratio_ci" | "significant" | "difference"> {
  const x = p50Interval(a);
  const y = p50Interval(b);
  if (!x || !y) return { p50_ratio_ci: null, significant: null, difference: "no interval" };
  const lo = y[1] > 0 ? x[0] / y[1] : null;
  const hi = y[0] > 0 ? x[1] / y[0] : null;
  const apart = x[0] > y[1] || y[0] > x[1];
  return {
    p50_ratio_ci: lo != null && hi != null ? [round(lo), round(hi)] : null,
    significant: apart,
    difference: !apart ? "no significant difference" : x[0] > y[1] ? "slower" : "faster",
  };
}

const round = (v: number) => Math.round(v * 1e4) / 1e4;

/** "unstable: <reason>" for a configuration measured unstable, else null. */
export function unstableNote(c: Config): string | null {
  return c?.stability?.stable === false
    ? `unstable: ${c.stability.reason ?? "no reason given"}`
    : null;
}

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
      ...p50Difference(c, b),
    });
    for (const [side, x] of [
      ["this report", c],
      ["the baseline", b],
    ] as const) {
      const note = unstableNote(x);
      if (note) warnings.push(`${key(c)} in ${side}: ${note}`);
    }
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
