// SVG chart of a benchmark report (tpu://benchmarks/{id}.svg): latency p50 with its 95 % interval
// (solid bar; dashed on to p99) and throughput against batch size, one series per dtype × mode ×
// seq_len; a point measured unstable is drawn hollow with a red ring and its reason as its title.
// Hand-written SVG, no dependency; every text from the report is escaped.
import { seriesOf, type SeriesPoint } from "./series.js";

type Any = Record<string, any>;

const W = 960;
const PANEL_W = 380;
const PANEL_H = 280;
const TOP = 70;
const LEFT = [70, 560];
const COLORS = [
  "#1f77b4",
  "#d62728",
  "#2ca02c",
  "#ff7f0e",
  "#9467bd",
  "#8c564b",
  "#e377c2",
  "#17becf",
  "#7f7f7f",
  "#bcbd22",
];

const esc = (s: string) =>
  s.replace(
    /[<>&"']/g,
    (ch) => ({ "<": "&lt;", ">": "&gt;", "&": "&amp;", '"': "&quot;", "'": "&#39;" })[ch]!,
  );
const fmt = (v: number) =>
  v >= 1000 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v >= 1 ? v.toFixed(2) : v.toPrecision(2);

type Point = SeriesPoint;

/** Nice log-scale ticks (1, 2, 5 × 10^k) covering [lo, hi]. */
function logTicks(lo: number, hi: number): number[] {
  const out: number[] = [];
  for (let e = Math.floor(Math.log10(lo)); e <= Math.ceil(Math.log10(hi)); e++) {
    for (const m of [1, 2, 5]) {
      const v = m * 10 ** e;
      if (v >= lo * 0.999 && v <= hi * 1.001) out.push(v);
    }
  }
  return out.length >= 2 ? out : [lo, hi];
}

function panel(
  x0: number,
  title: string,
  unit: string,
  series: [string, Point[]][],
  pick: (p: Point) => number,
  bars: boolean,
  batches: number[],
): string[] {
  const parts: string[] = [];
  const values = series
    .flatMap(([, pts]) =>
      pts.flatMap((p) => (bars ? [pick(p), p.p99, ...(p.ci ?? [])] : [pick(p)])),
    )
    .filter((v) => v > 0);
  let lo = Math.min(...values);
  let hi = Math.max(...values);
  if (!(lo > 0) || !Number.isFinite(hi)) {
    lo = 1;
    hi = 10;
  }
  if (hi / lo < 10) {
    const mid = Math.sqrt(hi * lo);
    lo = mid / Math.sqrt(10);
    hi = mid * Math.sqrt(10);
  }
  lo /= 1.15;
  hi *= 1.15;
  const bLo = Math.min(...batches);
  const bHi = Math.max(...batches);
  const xs = (b: number) =>
    x0 +
    (bHi === bLo
      ? PANEL_W / 2
      : ((Math.log2(b) - Math.log2(bLo)) / (Math.log2(bHi) - Math.log2(bLo))) * (PANEL_W - 40) +
        20);
  const ys = (v: number) =>
    TOP +
    PANEL_H -
    ((Math.log10(v) - Math.log10(lo)) / (Math.log10(hi) - Math.log10(lo))) * PANEL_H;
  parts.push(
    `<rect x="${x0}" y="${TOP}" width="${PANEL_W}" height="${PANEL_H}" fill="#fff" stroke="#999"/>`,
  );
  parts.push(
    `<text x="${x0 + PANEL_W / 2}" y="${TOP - 10}" text-anchor="middle" font-weight="bold">${esc(title)}</text>`,
  );
  for (const t of logTicks(lo, hi)) {
    const y = ys(t).toFixed(1);
    parts.push(`<line x1="${x0}" x2="${x0 + PANEL_W}" y1="${y}" y2="${y}" stroke="#eee"/>`);
    parts.push(
      `<text x="${x0 - 6}" y="${y}" text-anchor="end" dominant-baseline="middle" font-size="11">${fmt(t)}</text>`,
    );
  }
  for (const b of batches) {
    const x = xs(b).toFixed(1);
    parts.push(`<line x1="${x}" x2="${x}" y1="${TOP}" y2="${TOP + PANEL_H}" stroke="#f3f3f3"/>`);
    parts.push(
      `<text x="${x}" y="${TOP + PANEL_H + 16}" text-anchor="middle" font-size="11">${b}</text>`,
    );
  }
  parts.push(
    `<text x="${x0 + PANEL_W / 2}" y="${TOP + PANEL_H + 34}" text-anchor="middle" font-size="12">batch size (log scale)</text>`,
  );
  parts.push(
    `<text transform="translate(${x0 - 48},${TOP + PANEL_H / 2}) rotate(-90)" text-anchor="middle" font-size="12">${esc(unit)} (log scale)</text>`,
  );
  series.forEach(([, pts], i) => {
    const color = COLORS[i % COLORS.length];
    const sorted = [...pts].filter((p) => pick(p) > 0).sort((a, b) => a.batch - b.batch);
    if (sorted.length > 1) {
      const d = sorted
        .map((p, j) => `${j ? "L" : "M"}${xs(p.batch).toFixed(1)},${ys(pick(p)).toFixed(1)}`)
        .join(" ");
      parts.push(`<path d="${d}" fill="none" stroke="${color}" stroke-width="2"/>`);
    }
    for (const p of sorted) {
      const x = xs(p.batch).toFixed(1);
      if (bars && p.p99 > pick(p)) {
        parts.push(
          `<line x1="${x}" x2="${x}" y1="${ys(pick(p)).toFixed(1)}" y2="${ys(p.p99).toFixed(1)}" stroke="${color}" stroke-width="1" stroke-dasharray="3,2"/>`,
        );
        parts.push(
          `<line x1="${(Number(x) - 4).toFixed(1)}" x2="${(Number(x) + 4).toFixed(1)}" y1="${ys(p.p99).toFixed(1)}" y2="${ys(p.p99).toFixed(1)}" stroke="${color}"/>`,
        );
      }
      if (bars && p.ci) {
        const [a, b] = p.ci.map((v) => ys(v).toFixed(1));
        const x0c = (Number(x) - 5).toFixed(1);
        const x1c = (Number(x) + 5).toFixed(1);
        parts.push(
          `<g class="ci" stroke="${color}" stroke-width="1.5"><line x1="${x0c}" x2="${x1c}" y1="${a}" y2="${a}"/><line x1="${x}" x2="${x}" y1="${a}" y2="${b}"/><line x1="${x0c}" x2="${x1c}" y1="${b}" y2="${b}"/></g>`,
        );
      }
      const note = p.unstable ? `, unstable: ${esc(p.unstable)}` : "";
      const ci = bars && p.ci ? ` (95 % CI ${fmt(p.ci[0])}–${fmt(p.ci[1])})` : "";
      parts.push(
        p.unstable
          ? `<circle class="unstable" cx="${x}" cy="${ys(pick(p)).toFixed(1)}" r="5" fill="#fff" stroke="#d00" stroke-width="2"><title>batch ${p.batch}: ${fmt(pick(p))} ${esc(unit)}${ci}${note}</title></circle>`
          : `<circle cx="${x}" cy="${ys(pick(p)).toFixed(1)}" r="3.5" fill="${color}"><title>batch ${p.batch}: ${fmt(pick(p))} ${esc(unit)}${ci}</title></circle>`,
      );
    }
  });
  return parts;
}

export function renderReportSvg(report: Any): string {
  const m: Any = report.manifest ?? {};
  const groups = seriesOf(report);
  const series = [...groups.entries()];
  const batches = [...new Set(series.flatMap(([, pts]) => pts.map((p) => p.batch)))].sort(
    (a, b) => a - b,
  );
  const device =
    typeof m.device === "object"
      ? `${m.device?.kind}`
      : `${m.device ?? "?"} (${m.device_name ?? "?"})`;
  const unstable = series.reduce((n, [, pts]) => n + pts.filter((p) => p.unstable).length, 0);
  const rows = Math.max(1, Math.ceil(series.length / 4));
  const H = TOP + PANEL_H + 56 + rows * 16 + 8;
  const title = `${report.model ?? "?"} on ${device}: ${report.scenario ?? m.scenario ?? ""}, ${report.work ?? m.work ?? "forward"}`;
  const parts: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="Helvetica, Arial, sans-serif" font-size="12">`,
    `<rect width="${W}" height="${H}" fill="#fafafa"/>`,
    `<text x="${W / 2}" y="24" text-anchor="middle" font-size="15" font-weight="bold">${esc(title)}</text>`,
    `<text x="${W / 2}" y="42" text-anchor="middle" font-size="11" fill="#555">${esc(`report ${report.report_id ?? ""}, torch ${m.torch_version ?? "?"}, warmup not counted${unstable ? `; ${unstable} unstable point(s): hollow, red ring` : ""}`)}</text>`,
  ];
  if (series.length === 0) {
    parts.push(
      `<text x="${W / 2}" y="${H / 2}" text-anchor="middle">no successful configurations to plot</text>`,
      "</svg>",
    );
    return parts.join("\n");
  }
  parts.push(
    ...panel(
      LEFT[0],
      "Latency p50 with 95 % CI (dashed to p99)",
      "ms",
      series,
      (p) => p.p50,
      true,
      batches,
    ),
  );
  parts.push(
    ...panel(LEFT[1], "Throughput", "items/s", series, (p) => p.tput ?? 0, false, batches),
  );
  series.forEach(([name], i) => {
    const x = 70 + (i % 4) * 220;
    const y = TOP + PANEL_H + 62 + Math.floor(i / 4) * 16;
    parts.push(
      `<rect x="${x}" y="${y - 8}" width="14" height="4" fill="${COLORS[i % COLORS.length]}"/>`,
    );
    parts.push(`<text x="${x + 20}" y="${y - 4}" dominant-baseline="middle">${esc(name)}</text>`);
  });
  parts.push("</svg>");
  return parts.join("\n");
}
