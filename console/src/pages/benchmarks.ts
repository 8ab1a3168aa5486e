// The Benchmarks page: stored reports as charts and tables, one drawn against another.
import { comparisonTable, drawReports, reportTable, trainTable, type Report } from "../chart.js";
import { api } from "../session.js";
import { h, when, status, onLeave, type Json } from "../ui.js";

export async function benchmarksPage(root: HTMLElement) {
  const d = await api("benchmarks");
  const reports: Json[] = d.reports;
  if (!reports.length) {
    root.replaceChildren(
      h("h1", {}, "Benchmarks"),
      status("No reports yet: run_benchmark stores one per run."),
    );
    return;
  }
  const label = (r: Json) =>
    `${r.id} · ${r.model} on ${r.device} · ${r.scenario ?? ""} · ${when(r.created_at)}`;
  const a = h(
    "select",
    { id: "report-a" },
    ...reports.map((r) => h("option", { value: r.id }, label(r))),
  );
  const b = h(
    "select",
    { id: "report-b" },
    h("option", { value: "" }, "(none)"),
    ...reports.map((r) => h("option", { value: r.id }, label(r))),
  );
  const charts = h("div", { id: "charts", class: "charts" });
  const details = h("div", { id: "report-table" });
  let undraw: (() => void) | null = null;
  onLeave(() => undraw?.());
  const draw = async () => {
    const ids = [a.value, b.value].filter((x, i, all) => x && all.indexOf(x) === i);
    const got = await Promise.all(ids.map((id) => api(`benchmarks/${id}`)));
    const inputs = got.map((r, i) => ({
      label: i === 0 ? `A ${r.id.slice(6, 12)}` : `B ${r.id.slice(6, 12)}`,
      report: r.report as Report,
    }));
    undraw?.();
    undraw = drawReports(charts, inputs);
    // A report cut short (the caller cancelled, or the budget or time limit stopped it) is partial.
    const partial = inputs.flatMap(({ label, report }) =>
      report.stopped || report.cancelled
        ? [
            h(
              "p",
              { class: "warning partial" },
              `${label}: ${report.stopped ? `stopped (${report.stopped})` : "cancelled"} — partial results, only the configurations measured before it ended.`,
            ),
          ]
        : [],
    );
    details.replaceChildren(
      ...partial,
      h(
        "div",
        { class: "scroll", tabindex: "0", role: "region", "aria-label": "report numbers" },
        reportTable(inputs),
      ),
      // A training report's own figures: loss, bf16 drift, memory split, FLOPs per step.
      ...inputs
        .filter(({ report }) => report.work === "train_step")
        .map(({ label, report }) =>
          h(
            "div",
            { class: "scroll", tabindex: "0", role: "region", "aria-label": `${label} training` },
            trainTable(report),
          ),
        ),
      ...(inputs.length === 2
        ? [
            h("h3", {}, `${inputs[0].label} against ${inputs[1].label}`),
            h(
              "div",
              { class: "scroll", tabindex: "0", role: "region", "aria-label": "comparison" },
              comparisonTable(inputs[0], inputs[1]),
            ),
          ]
        : []),
    );
  };
  a.addEventListener("change", () => void draw());
  b.addEventListener("change", () => void draw());
  root.replaceChildren(
    h("h1", {}, "Benchmarks"),
    h(
      "div",
      { class: "filters" },
      h("label", { for: "report-a" }, "Report"),
      a,
      h("label", { for: "report-b" }, "Compare with"),
      b,
    ),
    h(
      "p",
      { class: "hint" },
      "Hover a chart for values; p50 solid with its 95 % interval as an error bar, p90 dashed, p99 dotted; " +
        "a red ring marks a point measured unstable (the table says why); the compared report is drawn thinner.",
    ),
    charts,
    h("h2", {}, "Numbers"),
    details,
  );
  await draw();
}
