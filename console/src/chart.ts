// Benchmark charts shared by the console and the MCP App: latency percentiles (p50 solid, p90
// dashed, p99 dotted) and throughput against batch size, one colour per dtype × mode (× seq_len),
// a second report drawn thinner for comparison. uPlot's legend shows the values under the cursor.
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";
import { seriesOf, type Point, type Report } from "./report_data.js";

export { compactJson, seriesOf, type Report } from "./report_data.js";

const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2"];
const DASH: Record<string, number[]> = { p50: [], p90: [6, 4], p99: [2, 3] };

export interface ChartInput {
  label: string;
  report: Report;
}

const fmt = (v: number | null | undefined, unit: string) =>
  v == null || !Number.isFinite(v)
    ? "–"
    : `${v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2)} ${unit}`;

function build(
  el: HTMLElement,
  title: string,
  unit: string,
  xs: number[],
  lines: { label: string; color: string; dash: number[]; width: number; ys: (number | null)[] }[],
  width: number,
): uPlot {
  const opts: uPlot.Options = {
    title,
    width,
    height: Math.max(220, Math.min(320, Math.round(width * 0.45))),
    scales: {
      x: { distr: 3, log: 2, time: false, range: (_u, lo, hi) => [lo / 1.4, hi * 1.4] },
      y: { distr: 3, log: 10 },
    },
    axes: [
      // Ticks at the measured batch sizes only, never at in-between values.
      { label: "batch size", splits: () => xs, values: (_u, ticks) => ticks.map((t) => String(t)) },
      { label: unit, size: 60 },
    ],
    cursor: { points: { size: 7 } },
    legend: { live: true },
    series: [
      { label: "batch", value: (_u, v) => (v == null ? "–" : String(v)) },
      ...lines.map((l) => ({
        label: l.label,
        stroke: l.color,
        dash: l.dash,
        width: l.width,
        spanGaps: true,
        points: { show: true, size: 5 },
        value: (_u: uPlot, v: number | null) => fmt(v, unit),
      })),
    ],
  };
  return new uPlot(opts, [xs, ...lines.map((l) => l.ys)] as uPlot.AlignedData, el);
}

/** Draws both charts into `el` (emptied first); returns a function that removes them. */
export function drawReports(el: HTMLElement, inputs: ChartInput[]): () => void {
  el.replaceChildren();
  const groups = inputs.map((i) => ({ ...i, series: seriesOf(i.report) }));
  const names = [...new Set(groups.flatMap((g) => [...g.series.keys()]))];
  const xs = [
    ...new Set(groups.flatMap((g) => [...g.series.values()].flat().map((p) => p.batch))),
  ].sort((a, b) => a - b);
  el.dataset.series = JSON.stringify(names);
  el.dataset.points = String(groups.reduce((n, g) => n + [...g.series.values()].flat().length, 0));
  if (xs.length === 0) {
    const p = document.createElement("p");
    p.textContent = "This report has no successful configurations to plot.";
    el.append(p);
    return () => el.replaceChildren();
  }
  const at = (pts: Point[], pick: (p: Point) => number | null) =>
    xs.map((x) => {
      const p = pts.find((q) => q.batch === x);
      const v = p ? pick(p) : null;
      return v != null && v > 0 ? v : null;
    });
  const latency: Parameters<typeof build>[4] = [];
  const tput: Parameters<typeof build>[4] = [];
  groups.forEach((g, gi) => {
    const prefix = inputs.length > 1 ? `${g.label}: ` : "";
    for (const [name, pts] of g.series) {
      const color = COLORS[names.indexOf(name) % COLORS.length];
      const width = gi === 0 ? 2 : 1;
      for (const q of ["p50", "p90", "p99"] as const) {
        latency.push({
          label: `${prefix}${name} ${q}`,
          color,
          dash: DASH[q],
          width,
          ys: at(pts, (p) => p[q]),
        });
      }
      tput.push({
        label: `${prefix}${name}`,
        color,
        dash: gi === 0 ? [] : [8, 4],
        width,
        ys: at(pts, (p) => p.tput),
      });
    }
  });
  const width = Math.max(280, Math.min(el.clientWidth || 900, 1100));
  const a = document.createElement("div");
  const b = document.createElement("div");
  a.className = "chart chart-latency";
  b.className = "chart chart-throughput";
  el.append(a, b);
  const plots = [
    build(a, "Latency percentiles (ms) vs batch size", "ms", xs, latency, width),
    build(b, "Throughput (items/s) vs batch size", "items/s", xs, tput, width),
  ];
  const onResize = () => {
    const w = Math.max(280, Math.min(el.clientWidth || 900, 1100));
    for (const p of plots) p.setSize({ width: w, height: p.height });
  };
  window.addEventListener("resize", onResize);
  return () => {
    window.removeEventListener("resize", onResize);
    for (const p of plots) p.destroy();
    el.replaceChildren();
  };
}

/** The same numbers as a table (screen readers, keyboard users, copying). */
export function reportTable(inputs: ChartInput[]): HTMLTableElement {
  const table = document.createElement("table");
  table.className = "data";
  const head = table.createTHead().insertRow();
  for (const h of ["report", "series", "batch", "p50 ms", "p90 ms", "p99 ms", "items/s"]) {
    const th = document.createElement("th");
    th.textContent = h;
    head.append(th);
  }
  const body = table.createTBody();
  for (const i of inputs) {
    for (const [name, pts] of seriesOf(i.report)) {
      for (const p of pts) {
        const row = body.insertRow();
        for (const v of [
          i.label,
          name,
          String(p.batch),
          p.p50.toFixed(3),
          p.p90.toFixed(3),
          p.p99.toFixed(3),
          p.tput == null ? "–" : p.tput.toFixed(1),
        ])
          row.insertCell().textContent = v;
      }
    }
  }
  return table;
}
