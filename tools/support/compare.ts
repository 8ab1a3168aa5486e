// Compares a benchmark report with a baseline: ratios per matching configuration, and warnings
// where the two are not like for like (device, precision, mode, versions).
type Config = Record<string, any>;

const key = (c: Config) => `${c.batch}|${c.seq_len ?? "-"}|${c.dtype}|${c.mode}`;

export interface Comparison {
  baseline_id: string;
  ratios: {
    batch: number;
    seq_len: number | null;
    dtype: string;
    mode: string;
    p50_ratio: number | null;
    p99_ratio: number | null;
    throughput_ratio: number | null;
  }[];
  unmatched: number;
  warnings: string[];
}

const ratio = (a: unknown, b: unknown) =>
  typeof a === "number" && typeof b === "number" && b > 0 ? a / b : null;

export function compareReports(report: Config, baseline: Config, baselineId: string): Comparison {
  const base = new Map<string, Config>((baseline.configs ?? []).map((c: Config) => [key(c), c]));
  const ratios: Comparison["ratios"] = [];
  let unmatched = 0;
  const warnings: string[] = [];
  for (const c of report.configs ?? []) {
    const b = base.get(key(c));
    if (!b) {
      unmatched++;
      continue;
    }
    ratios.push({
      batch: c.batch,
      seq_len: c.seq_len ?? null,
      dtype: c.dtype,
      mode: c.mode,
      p50_ratio: ratio(c.latency_ms?.p50, b.latency_ms?.p50),
      p99_ratio: ratio(c.latency_ms?.p99, b.latency_ms?.p99),
      throughput_ratio: ratio(c.throughput_items_per_s, b.throughput_items_per_s),
    });
    if (c.matmul_precision !== b.matmul_precision) {
      warnings.push(`matmul precision differs for ${key(c)}: ${c.matmul_precision} vs ${b.matmul_precision}`);
    }
  }
  const m = report.manifest ?? {};
  const bm = baseline.manifest ?? {};
  const dev = (x: any) => (x?.device && typeof x.device === "object" ? `${x.device.kind}:${x.device.name}` : String(x?.device));
  if (dev(m) !== dev(bm)) warnings.push(`devices differ: ${dev(m)} vs ${dev(bm)}`);
  if (m.torch_version !== bm.torch_version) warnings.push(`torch versions differ: ${m.torch_version} vs ${bm.torch_version}`);
  if (m.weight_digest && bm.weight_digest && m.weight_digest !== bm.weight_digest) warnings.push("the weights differ (digest)");
  if (unmatched) warnings.push(`${unmatched} configuration(s) have no counterpart in the baseline`);
  return { baseline_id: baselineId, ratios, unmatched, warnings };
}
