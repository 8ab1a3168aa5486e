// How sure a benchmark is, as every reader of a report sees it: compare's differences with their
// intervals ("no significant difference" where the two p50 intervals overlap), the text rendering's
// "unstable: <reason>", the Markdown table and the SVG chart's marked points and intervals. The
// reports are crafted: the verdicts themselves are proved in the worker's tests.
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { readCatalog } from "../../runtime/catalog.js";
import { compareReports } from "../../tools/render/compare.js";
import { renderReportSvg } from "../../tools/render/report_chart.js";
import { renderReportMarkdown } from "../../tools/render/report_format.js";
import { seriesOf } from "../../tools/render/series.js";
import { buildTools } from "../../tools/registry.js";
import { ROOT } from "../helpers/server.js";

/** A configuration whose p50 is `p50` ms with the interval [lo, hi]; unstable when `reason`. */
function cfg(batch: number, p50: number, lo: number, hi: number, reason: string | null = null) {
  return {
    batch,
    seq_len: null,
    dtype: "float32",
    mode: "eager",
    scenario: "single-stream",
    iterations: reason ? 80 : 20,
    latency_ms: { p50, p90: p50 * 1.1, p99: p50 * 1.2, mean: p50, min: lo, max: hi * 1.3 },
    throughput_items_per_s: (batch * 1000) / p50,
    stability: {
      stable: reason === null,
      reason,
      mad_ms: (hi - lo) / 4,
      p50_ci_ms: [lo, hi],
      iterations_requested: 20,
      extended: reason !== null,
      loadavg_1m: reason ? 9 : 0.3,
      steal_pct: 0,
      cpus: 2,
    },
    error: null,
  };
}

const report = (configs: object[]) => ({
  report_id: "bench_00000000000000000001",
  model: "mnist-cnn",
  scenario: "single-stream",
  work: "forward",
  cancelled: false,
  manifest: { device: "cpu", device_kind: "cpu", device_name: "cpu", torch_version: "2.x" },
  configs,
});

describe("compare with intervals", () => {
  it("says no significant difference where the p50 intervals overlap, and which way where they do not", () => {
    const now = report([cfg(1, 1.0, 0.95, 1.05), cfg(2, 2.0, 1.9, 2.1), cfg(4, 3.0, 2.9, 3.1)]);
    const base = report([cfg(1, 1.04, 1.0, 1.08), cfg(2, 3.0, 2.8, 3.2), cfg(4, 2.0, 1.9, 2.1)]);
    const c = compareReports(now, base, "bench_base");
    expect(c.ratios.map((r) => [r.batch, r.difference, r.significant])).toEqual([
      [1, "no significant difference", false],
      [2, "faster", true],
      [4, "slower", true],
    ]);
    // The ratio's interval: this report's low over the baseline's high, and high over low.
    expect(c.ratios[1].p50_ratio_ci).toEqual([1.9 / 3.2, 2.1 / 2.8].map((v) => +v.toFixed(4)));
    expect(c.ratios[0].p50_ratio_ci![0]).toBeLessThan(1);
    expect(c.ratios[0].p50_ratio_ci![1]).toBeGreaterThan(1);
    expect(c.warnings).toEqual([]);
  });

  it("has no interval against a report made before intervals, and warns about an unstable side", () => {
    const old = report([{ ...cfg(1, 1.0, 0.9, 1.1), stability: undefined }]);
    const loaded = report([cfg(1, 5.0, 2.0, 9.0, "load above cores (9.00 on 2 CPUs)")]);
    const a = compareReports(loaded, old, "bench_old");
    expect(a.ratios[0]).toMatchObject({
      p50_ratio_ci: null,
      significant: null,
      difference: "no interval",
    });
    expect(a.warnings).toEqual([
      "1|-|float32|eager in this report: unstable: load above cores (9.00 on 2 CPUs)",
    ]);
    // A loaded run 5x slower whose interval still reaches the quiet one's: nothing to claim.
    const quiet = report([cfg(1, 1.0, 0.95, 2.5)]);
    expect(compareReports(loaded, quiet, "bench_q").ratios[0].difference).toBe(
      "no significant difference",
    );
  });
});

describe("every rendering marks unstable configurations and shows the intervals", () => {
  const r = report([cfg(1, 1.0, 0.95, 1.05), cfg(4, 30.0, 3.0, 60.0, "steal above 5 % (12.0 %)")]);

  it("the series carry the interval and the reason", () => {
    const pts = seriesOf(r).get("float32 eager")!;
    expect(pts.map((p) => [p.ci, p.unstable])).toEqual([
      [[0.95, 1.05], null],
      [[3.0, 60.0], "steal above 5 % (12.0 %)"],
    ]);
  });

  it("Markdown: the interval, MAD and verdict columns and the reason", () => {
    const md = renderReportMarkdown(r);
    expect(md).toContain("| p50 95 % CI | MAD ms | stable |");
    expect(md).toMatch(/\| 1 \| – \| float32 \| eager \|.*\| 0\.95–1\.05 \| 0\.025 \| yes \|/);
    expect(md).toMatch(
      /\| 4 \| – \| float32 \| eager \|.*\| 3\.00–60\.00 \| 14\.250 \| \*\*no\*\* \|/,
    );
    expect(md).toContain(
      "- batch 4, float32, eager: unstable: steal above 5 % (12.0 %) (80 iterations, extended from 20)",
    );
    const cmp = renderReportMarkdown({
      ...r,
      comparison: compareReports(r, report([cfg(1, 1.0, 0.97, 1.03)]), "bench_b"),
    });
    expect(cmp).toMatch(
      /\| 1 \| – \| float32 \| eager \| 1\.000 \| 0\.922–1\.083 \| no significant difference \|/,
    );
  });

  it("SVG: an error bar per latency point, the unstable point hollow with its reason", () => {
    const svg = renderReportSvg(r);
    expect(svg.match(/<g class="ci"/g)).toHaveLength(2);
    // Marked in both panels (latency and throughput).
    expect(svg.match(/<circle class="unstable"/g)).toHaveLength(2);
    expect(svg).toContain("unstable: steal above 5 % (12.0 %)");
    expect(svg).toContain("1 unstable point(s): hollow, red ring");
  });

  it("the tool's text says unstable: <reason> and each difference with its interval", () => {
    const env = {
      catalog: readCatalog(join(ROOT, "runtime/catalog.builtin.json")),
      limits: {
        max_texts: 64,
        inline_max_elements: 4096,
        max_tensor_elements: 1 << 20,
        benchmark: {
          max_configs: 64,
          max_iterations: 10_000,
          max_duration_s: 600,
          max_warmup: 100,
        },
      },
      deployment: { pool: false, fleet: false },
    };
    const tool = buildTools(env).find((t) => t.name === "run_benchmark")!;
    const text = tool.render({
      ...r,
      resource_uri: "tpu://benchmarks/bench_00000000000000000001",
      comparison: compareReports(r, report([cfg(1, 2.0, 1.9, 2.1)]), "bench_b"),
    });
    expect(text).toContain("b=4 float32 eager: p50 30.00 ms");
    expect(text).toContain("; unstable: steal above 5 % (12.0 %)");
    expect(text).toContain("p50 CI 0.95–1.05 ms");
    expect(text).toMatch(
      /vs bench_b:\n {2}b=1 float32 eager: p50 ×0\.500 \(0\.452–0\.553\): faster/,
    );
    expect(text.split("\n").filter((l) => l.includes("unstable:"))).toHaveLength(1);
  });
});

describe("a fraction of peak that cannot be true", () => {
  it("shows a fault and its reason instead of a percentage above 100", () => {
    const fault =
      "measured 3.75e+10 FLOP/s exceeds the peak of 1e+10 (measured: best float32 matmul on this CPU in this worker): a measurement fault";
    const md = renderReportMarkdown(
      report([
        { ...cfg(1, 1.0, 0.95, 1.05), fraction_of_peak: null, fraction_of_peak_fault: fault },
        { ...cfg(2, 2.0, 1.9, 2.1), fraction_of_peak: 0.25, fraction_of_peak_fault: null },
      ]),
    );
    expect(md).toMatch(/\| fault \|/);
    expect(md).toContain(fault);
    expect(md).toMatch(/\| 25\.00 \|/);
  });
});
