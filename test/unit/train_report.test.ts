// A work "train_step" report as its readers see it: the tool's text, the Markdown report and the
// table the MCP App and console draw (tools/render/train_rows.ts). The report is crafted: the
// figures themselves are proved in the worker's tests and test/e2e/train_step.test.ts.
import { describe, expect, it } from "vitest";
import { renderReportMarkdown } from "../../tools/render/report_format.js";
import { TRAIN_HEADERS, trainLine, trainRow } from "../../tools/render/train_rows.js";

function step(dtype: string, mode: string, extra: Record<string, unknown> = {}) {
  return {
    batch: 4,
    seq_len: 32,
    dtype,
    mode,
    scenario: "single-stream",
    work: "train_step",
    iterations: 10,
    latency_ms: { p50: 80, p90: 90, p99: 100, mean: 82, min: 70, max: 110 },
    throughput_items_per_s: 48.78,
    tokens_per_s: 1560.9,
    compile_s: mode === "compile" ? 12.5 : 0,
    train_steps: 12,
    loss_first: 10.337,
    loss_final: 8.3593,
    memory_split: {
      weights_bytes: 8 * 2 ** 20,
      gradients_bytes: 8 * 2 ** 20,
      optimizer_state_bytes: 16 * 2 ** 20,
      activations_bytes: 3 * 2 ** 20,
    },
    flops_per_step: 1.5757e9,
    fraction_of_peak: 0.25,
    fraction_of_peak_fault: null,
    stability: { stable: true, reason: null },
    error: null,
    ...extra,
  };
}

const fault =
  "measured 3e+12 FLOP/s exceeds the peak of 1e+12 (a table): a timing or FLOP-count fault, so no fraction is reported";

describe("a train_step report", () => {
  it("shows the training figures in one row per configuration", () => {
    const row = trainRow(
      step("bfloat16", "compile", { loss_drift_vs_fp32: { max_abs: 5.2e-4, final_abs: 1e-4 } }),
    );
    expect(row).toHaveLength(TRAIN_HEADERS.length);
    const cell = (h: (typeof TRAIN_HEADERS)[number]) => row[TRAIN_HEADERS.indexOf(h)];
    expect(cell("p50 ms/step")).toBe("80.000");
    expect(cell("compile s")).toBe("12.500");
    expect(cell("loss first → final")).toBe("10.3370 → 8.35930");
    expect(cell("bf16 drift (max, final)")).toBe("5.20e-4, 1.00e-4");
    expect([cell("weights MiB"), cell("optimizer MiB"), cell("activations MiB")]).toEqual([
      "8.00",
      "16.00",
      "3.00",
    ]);
    expect(cell("% of peak")).toBe("25.00");
  });

  it("never prints a fraction of peak the worker flagged as a fault", () => {
    const flagged = step("float32", "eager", {
      fraction_of_peak: 3,
      fraction_of_peak_fault: fault,
    });
    expect(trainRow(flagged)[TRAIN_HEADERS.indexOf("% of peak")]).toBe("fault");
    expect(trainLine(flagged)).toMatch(/% of peak: FAULT/);
    expect(trainLine(flagged)).not.toMatch(/300/);
    const md = renderReportMarkdown({
      report_id: "bench_0123456789abcdef0123",
      model: "tiny-gpt2",
      scenario: "single-stream",
      work: "train_step",
      configs: [
        flagged,
        step("bfloat16", "eager", {
          loss_drift_note: "no float32 configuration of this shape and mode ran",
        }),
      ],
      manifest: {
        work: "train_step",
        optimizer: { name: "adamw", lr: 1e-4 },
        train: { loss: "causal LM cross-entropy" },
      },
    });
    expect(md).toMatch(/Training: optimizer adamw \(lr 0.0001\), loss causal LM cross-entropy/);
    expect(md).toMatch(/\| p50 ms\/step \|/);
    expect(md).toMatch(/\| fault \|/);
    expect(md).toContain(`batch 4, seq 32, float32, eager: ${fault}`);
    expect(md).toContain("no bf16 drift (no float32 configuration of this shape and mode ran)");
  });
});
