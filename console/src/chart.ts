// Benchmark charts shared by the console and the MCP App: latency percentiles (p50 solid, p90
// dashed, p99 dotted) and throughput against batch size, one colour per dtype × mode (× seq_len),
// a second report drawn thinner for comparison. p50 carries its 95 % interval as an error bar, and
// a point measured unstable is ringed in red (both drawn by a hook after uPlot's own series).
// uPlot's legend shows the values under the cursor, with the interval and "unstable".
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";
import {
  compareReports,
  seriesOf,
  TRAIN_HEADERS,
  trainNotes,
  trainRow,
  type Point,
  type Report,
} from "./report_data.js";

export { compactJson, seriesOf, type Report } from "./report_data.js";

const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2"];
const DASH: Record<string, number[]> = { p50: [], p90: [6, 4], p99: [2, 3] };
const UNSTABLE = "#d00";

/** Per x of a line: the p50 interval to draw as an error bar, and why the point is unstable. */
interface Marks {
  ci: ([number, number] | null)[];
  unstable: (string | null)[];
}

type Line = {
  label: string;
  color: string;
  dash: number[];
  width: number;
  ys: (number | null)[];
  marks?: Marks;
};

export interface ChartInput {
  label: string;
  report: Report;
}

const fmt = (v: number | null | undefined, unit: string) =>
  v == null || !Number.isFinite(v)
    ? "–"
    : `${v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2)} ${unit}`;

/** Error bars and red rings over the drawn series, in canvas pixels; hidden series skipped. */
function drawMarks(u: uPlot, xs: number[], lines: Line[]) {
  const ctx = u.ctx;
  const px = devicePixelRatio || 1;
  ctx.save();
  lines.forEach((l, i) => {
    if (!l.marks || !u.series[i + 1]?.show) return;
    xs.forEach((x, j) => {
      const y = l.ys[j];
      if (y == null) return;
      const cx = u.valToPos(x, "x", true);
      const ci = l.marks!.ci[j];
      if (ci) {
        const [a, b] = ci.map((v) => u.valToPos(v, "y", true));
        ctx.strokeStyle = l.color;
        ctx.lineWidth = 1.5 * px;
        ctx.beginPath();
        for (const [x0, y0, x1, y1] of [
          [cx - 4 * px, a, cx + 4 * px, a],
          [cx, a, cx, b],
          [cx - 4 * px, b, cx + 4 * px, b],
        ]) {
          ctx.moveTo(x0, y0);
          ctx.lineTo(x1, y1);
        }
        ctx.stroke();
      }
      if (l.marks!.unstable[j]) {
        ctx.strokeStyle = UNSTABLE;
        ctx.lineWidth = 2 * px;
        ctx.beginPath();
        ctx.arc(cx, u.valToPos(y, "y", true), 6 * px, 0, 2 * Math.PI);
        ctx.stroke();
      }
    });
  });
  ctx.restore();
}

function build(
  el: HTMLElement,
  title: string,
  unit: string,
  xs: number[],
  lines: Line[],
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
    hooks: { draw: [(u) => drawMarks(u, xs, lines)] },
    series: [
      { label: "batch", value: (_u, v) => (v == null ? "–" : String(v)) },
      ...lines.map((l) => ({
        label: l.label,
        stroke: l.color,
        dash: l.dash,
        width: l.width,
        spanGaps: true,
        points: { show: true, size: 5 },
        value: (_u: uPlot, v: number | null, _s: number, j: number | null) => {
          const ci = j == null ? null : l.marks?.ci[j];
          const bad = j == null ? null : l.marks?.unstable[j];
          return (
            fmt(v, unit) +
            (v != null && ci ? ` (CI ${fmt(ci[0], "").trim()}–${fmt(ci[1], "").trim()})` : "") +
            (v != null && bad ? " unstable" : "")
          );
        },
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
  const all = groups.flatMap((g) => [...g.series.values()].flat());
  el.dataset.points = String(all.length);
  // What the hook draws, for tests and tools that read the page: intervals and unstable points.
  el.dataset.intervals = String(all.filter((p) => p.ci).length);
  el.dataset.unstable = String(all.filter((p) => p.unstable).length);
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
  const marksOf = (pts: Point[], withCi: boolean): Marks => ({
    ci: xs.map((x) => (withCi ? (pts.find((q) => q.batch === x)?.ci ?? null) : null)),
    unstable: xs.map((x) => pts.find((q) => q.batch === x)?.unstable ?? null),
  });
  const latency: Line[] = [];
  const tput: Line[] = [];
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
          ...(q === "p50" ? { marks: marksOf(pts, true) } : {}),
        });
      }
      tput.push({
        label: `${prefix}${name}`,
        color,
        dash: gi === 0 ? [] : [8, 4],
        width,
        ys: at(pts, (p) => p.tput),
        marks: marksOf(pts, false),
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

/** Each p50 difference of A over B with its interval (tools/render/compare.ts decides). */
export function comparisonTable(a: ChartInput, b: ChartInput): HTMLTableElement {
  const table = document.createElement("table");
  table.className = "data comparison";
  const head = table.createTHead().insertRow();
  for (const h of ["configuration", `p50 ${a.label} / ${b.label}`, "interval", "difference"]) {
    const th = document.createElement("th");
    th.textContent = h;
    head.append(th);
  }
  const body = table.createTBody();
  for (const r of compareReports(a.report, b.report, b.label).ratios) {
    const row = body.insertRow();
    row.dataset.difference = r.difference;
    for (const v of [
      `b=${r.batch}${r.seq_len ? ` s=${r.seq_len}` : ""} ${r.dtype} ${r.mode}`,
      r.p50_ratio == null ? "–" : `×${r.p50_ratio.toFixed(3)}`,
      r.p50_ratio_ci ? `${r.p50_ratio_ci[0].toFixed(3)}–${r.p50_ratio_ci[1].toFixed(3)}` : "–",
      r.difference,
    ])
      row.insertCell().textContent = v;
  }
  return table;
}

/** The same numbers as a table (screen readers, keyboard users, copying). */
export function reportTable(inputs: ChartInput[]): HTMLTableElement {
  const table = document.createElement("table");
  table.className = "data";
  const head = table.createTHead().insertRow();
  for (const h of [
    "report",
    "series",
    "batch",
    "p50 ms",
    "p50 95 % CI",
    "p90 ms",
    "p99 ms",
    "items/s",
    "stable",
  ]) {
    const th = document.createElement("th");
    th.textContent = h;
    head.append(th);
  }
  const body = table.createTBody();
  for (const i of inputs) {
    for (const [name, pts] of seriesOf(i.report)) {
      for (const p of pts) {
        const row = body.insertRow();
        if (p.unstable) row.className = "unstable";
        for (const v of [
          i.label,
          name,
          String(p.batch),
          p.p50.toFixed(3),
          p.ci ? `${p.ci[0].toFixed(3)}–${p.ci[1].toFixed(3)}` : "–",
          p.p90.toFixed(3),
          p.p99.toFixed(3),
          p.tput == null ? "–" : p.tput.toFixed(1),
          p.unstable ? `unstable: ${p.unstable}` : p.ci ? "yes" : "–",
        ])
          row.insertCell().textContent = v;
      }
    }
  }
  return table;
}

/** A work "train_step" report's own table (step time, loss, bf16 drift, memory split, FLOPs). */
export function trainTable(report: Report): HTMLTableElement {
  const table = document.createElement("table");
  table.className = "data train";
  const head = table.createTHead().insertRow();
  for (const h of TRAIN_HEADERS) {
    const th = document.createElement("th");
    th.textContent = h;
    head.append(th);
  }
  const body = table.createTBody();
  for (const c of (report.configs ?? []) as Record<string, any>[]) {
    if (c.error) continue;
    const row = body.insertRow();
    if (c.fraction_of_peak_fault) row.className = "fault";
    for (const v of trainRow(c)) row.insertCell().textContent = v;
  }
  if (trainNotes(report.configs ?? []).length) {
    const cap = table.createCaption();
    cap.textContent = trainNotes(report.configs ?? []).join("; ");
  }
  return table;
}
