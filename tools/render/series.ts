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
    });
    groups.set(name, pts);
  }
  for (const pts of groups.values()) pts.sort((a, b) => a.batch - b.batch);
  return groups;
}
