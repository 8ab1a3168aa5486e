// A benchmark report's successful configurations grouped into series, one per "dtype mode[ seq N]",
// each sorted by batch. Shared by the server's SVG chart (report_chart.ts) and the browser console
// (console/src/report_data.ts re-exports it), so both draw the same lines: no imports, no DOM.

export interface SeriesPoint {
  batch: number;
  p50: number;
  /** p90 and p99 fall back to p50 when the report lacks them. */
  p90: number;
  p99: number;
  /** null when the configuration reported no throughput. */
  tput: number | null;
  /** The 95 % interval of p50 (ms); null in reports made before intervals were measured. */
  ci: [number, number] | null;
  /** Why the configuration was measured unstable; null when stable or not judged. */
  unstable: string | null;
}

function intervalOf(v: unknown): [number, number] | null {
  return Array.isArray(v) && v.length === 2 && v.every((x) => typeof x === "number" && x > 0)
    ? [v[0], v[1]]
    : null;
}

export function seriesOf(report: unknown): Map<string, SeriesPoint[]> {
  const groups = new Map<string, SeriesPoint[]>();
  const configs = (report as { configs?: unknown } | null)?.configs;
  for (const c of (Array.isArray(configs) ? configs : []) as Record<string, any>[]) {
    const l = c?.latency_ms;
    if (!c || c.error || !l || typeof l.p50 !== "number" || typeof c.batch !== "number") continue;
    const name = `${c.dtype} ${c.mode}${c.seq_len ? ` seq ${c.seq_len}` : ""}`;
    const pts = groups.get(name) ?? [];
    pts.push({
      batch: c.batch,
      p50: l.p50,
      p90: typeof l.p90 === "number" ? l.p90 : l.p50,
      p99: typeof l.p99 === "number" ? l.p99 : l.p50,
      tput: typeof c.throughput_items_per_s === "number" ? c.throughput_items_per_s : null,
      ci: intervalOf(c.stability?.p50_ci_ms),
      unstable: c.stability?.stable === false ? String(c.stability.reason ?? "unstable") : null,
    });
    groups.set(name, pts);
  }
  for (const pts of groups.values()) pts.sort((a, b) => a.batch - b.batch);
  return groups;
}
