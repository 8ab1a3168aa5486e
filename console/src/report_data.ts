// Pure helpers shared by the console, the MCP App view and their unit tests (no DOM, no uPlot).

export type Report = Record<string, any>;

// One grouping for the console and the server's SVG chart (tools/render/series.ts).
export { seriesOf, type SeriesPoint as Point } from "../../tools/render/series.js";
// One reading of "significant" for the tool's comparison, the console and the MCP App.
export { compareReports, unstableNote } from "../../tools/render/compare.js";
// One reading of a train_step report's figures for the tool, the Markdown report and these views.
export { TRAIN_HEADERS, trainNotes, trainRow } from "../../tools/render/train_rows.js";

/** JSON with arrays of plain values on one line, so an argument list stays readable. */
export function compactJson(v: unknown): string {
  const text = JSON.stringify(v, null, 2) ?? "null";
  return text.replace(
    /\[\s+((?:(?:-?[\d.eE+-]+|"[^"\n]*"|true|false|null),?\s+)+)\]/g,
    (_m, inner: string) => `[${inner.trim().split(/,\s+/).join(", ")}]`,
  );
}
