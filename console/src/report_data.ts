// Pure helpers shared by the console, the MCP App view and their unit tests (no DOM, no uPlot).

export type Report = Record<string, any>;

export interface Point {
  batch: number;
  p50: number;
  p90: number;
  p99: number;
  tput: number | null;
}

/** Successful configurations grouped into series named "dtype mode[ seq N]". */
export function seriesOf(report: Report): Map<string, Point[]> {
  const groups = new Map<string, Point[]>();
  for (const c of (report?.configs ?? []) as Record<string, any>[]) {
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

/** JSON with arrays of plain values on one line, so an argument list stays readable. */
export function compactJson(v: unknown): string {
  const text = JSON.stringify(v, null, 2) ?? "null";
  return text.replace(
    /\[\s+((?:(?:-?[\d.eE+-]+|"[^"\n]*"|true|false|null),?\s+)+)\]/g,
    (_m, inner: string) => `[${inner.trim().split(/,\s+/).join(", ")}]`,
  );
}
