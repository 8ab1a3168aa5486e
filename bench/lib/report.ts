import { mkdirSync, writeFileSync } from "node:fs";
import { cpus } from "node:os";
import { join } from "node:path";
import { ROOT } from "./procs.js";
// What each bench module returns: table rows for people, figures for latest.json and targets.

export interface Row {
  section: string;
  metric: string;
  value: string;
  detail?: string;
}

export interface SectionResult {
  rows: Row[];
  /** Flat machine-readable figures, keyed like "overhead.b1.stdio_p50_ms". */
  figures: Record<string, number>;
  notes?: string[];
  /** Per-case measurements a section keeps beside its figures (written to its own JSON file). */
  data?: Record<string, unknown>;
}

export function section(name: string) {
  const rows: Row[] = [];
  const figures: Record<string, number> = {};
  const notes: string[] = [];
  return {
    row(metric: string, value: string, detail?: string) {
      rows.push({ section: name, metric, value, detail });
    },
    fig(key: string, value: number) {
      figures[`${name}.${key}`] = value;
    },
    note(text: string) {
      notes.push(text);
    },
    result(): SectionResult {
      return { rows, figures, notes };
    },
  };
}

export function renderTable(rows: Row[]): string {
  const head = { section: "section", metric: "metric", value: "value", detail: "detail" };
  const all = [head, ...rows.map((r) => ({ ...r, detail: r.detail ?? "" }))];
  const w = (k: keyof typeof head) => Math.max(...all.map((r) => String(r[k]).length));
  const ws = { section: w("section"), metric: w("metric"), value: w("value") };
  const line = (r: (typeof all)[number]) =>
    `${r.section.padEnd(ws.section)}  ${r.metric.padEnd(ws.metric)}  ${r.value.padStart(ws.value)}  ${r.detail}`.trimEnd();
  const sep = "-".repeat(ws.section + ws.metric + ws.value + 6 + 40);
  const out = [line(all[0]), sep];
  let prev = "";
  for (const r of all.slice(1)) {
    if (prev && r.section !== prev) out.push("");
    out.push(line(r));
    prev = r.section;
  }
  return out.join("\n");
}

/** A run's request and full report, beside the machine it ran on: bench/results/<name>.json. */
export function writeRunDetail(
  name: string,
  request: unknown,
  report: unknown,
  loadavgBefore: number,
): void {
  const detail = {
    command: `BENCH_ONLY=${name} npm run bench`,
    date: new Date().toISOString(),
    machine: { cpus: cpus().length, cpu_model: cpus()[0]?.model, loadavg_before: loadavgBefore },
    request,
    report,
  };
  const dir = join(ROOT, "bench", "results");
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, `${name}.json`), JSON.stringify(detail, null, 2) + "\n");
}
