// run_benchmark and check_model end to end: the real `tpu-mcp stdio` server, the SDK's Client and
// a real torch worker on the CPU. The figures must be internally consistent and say what they
// measured; no assertion is about speed.
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import Database from "better-sqlite3";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { compareReports } from "../../tools/render/compare.js";
import { scaled, slowdown } from "../helpers/calibrate.js";
import { connectStdio, writeConfig } from "../helpers/server.js";
import { call } from "./scenario.js";

/** The estimates of the executed run_benchmark calls, in order. */
function executedEstimates(dataDir: string): Record<string, number>[] {
  const db = new Database(join(dataDir, "policy.db"), { readonly: true });
  try {
    const rows = db.prepare("SELECT record FROM audit_log ORDER BY seq").all() as {
      record: string;
    }[];
    return rows
      .map((r) => JSON.parse(r.record))
      .filter((r) => r.tool === "run_benchmark" && r.outcome === "executed" && r.estimate)
      .map((r) => r.estimate);
  } finally {
    db.close();
  }
}

function estimates(dataDir: string): number[] {
  return executedEstimates(dataDir).map((e) => e.device_seconds);
}

/** How much of each estimate is the worst case of the stability extension. */
function extensions(dataDir: string): number[] {
  return executedEstimates(dataDir).map((e) => e.stability_extension_s ?? 0);
}

/** What the gate charged each run_benchmark call, in order. */
function readCharges(dataDir: string): number[] {
  const db = new Database(join(dataDir, "policy.db"), { readonly: true });
  try {
    return (
      db
        .prepare("SELECT seconds FROM budget_charges WHERE tool = 'run_benchmark' ORDER BY id")
        .all() as { seconds: number }[]
    ).map((r) => r.seconds);
  } finally {
    db.close();
  }
}

// These tests want each report itself, however slow the machine: no soft deadline. The read
// allowance (30 device-s per window) is what a quiet machine's checks need; on a loaded one three
// cold checks of MiniLM used it up and the shape report was refused, so it scales too.
const POLICY = {
  approvals: { rules: [] },
  limits: {
    rate_limit: { per_principal_per_minute: 6000 },
    soft_deadline_s: 0,
    budget: { read_device_seconds_per_window: Math.round(30 * slowdown()) },
  },
};

describe("run_benchmark and check_model over MCP", () => {
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-bench-e2e-"));
  let conn: Awaited<ReturnType<typeof connectStdio>>;
  beforeAll(async () => {
    conn = await connectStdio(writeConfig({ policy: POLICY }, dir));
  });
  afterAll(async () => {
    await conn?.close();
  });

  /**
   * A test that reads what its own calls left (the estimates learned, the graphs compiled) gets
   * its own server and worker, so an earlier test or a failed attempt of it leaves it nothing.
   */
  async function withOwnServer(
    name: string,
    fn: (own: Awaited<ReturnType<typeof connectStdio>>, dataDir: string) => Promise<void>,
  ) {
    const ownDir = mkdtempSync(join(dir, `${name}-`));
    const own = await connectStdio(writeConfig({ policy: POLICY }, ownDir));
    try {
      await fn(own, join(ownDir, "data"));
    } finally {
      await own.close();
    }
  }

  it(
    "learns cost estimates from the calls it measured",
    () =>
      withOwnServer("learns", async (own, dataDir) => {
        const args = { model: "mnist-cnn", batch_sizes: [4], iterations: 5, warmup: 1 };
        const first = await call(own.client, "run_benchmark", args);
        expect(first.isError, JSON.stringify(first)).toBeFalsy();
        const second = await call(own.client, "run_benchmark", {
          ...args,
          baseline_id: first.structuredContent.report_id,
        });
        expect(second.isError, JSON.stringify(second)).toBeFalsy();
        learned(first, second, dataDir);
      }),
    scaled(120_000),
  );

  function learned(first: any, second: any, dataDir: string) {
    const [before, after] = estimates(dataDir);
    // The same work again: what the first run took (the gate charged it), whatever the device
    // model or the latency history would say (policies/estimate.ts, measured calls), plus the
    // worst case of its stability extension, priced as the measured passes were.
    const charges = readCharges(dataDir);
    expect(after - extensions(dataDir)[1]).toBeCloseTo(charges[0], 1);
    expect(after).not.toBe(before);
    // The second report compares itself with the first, like for like.
    const cmp = second.structuredContent.comparison;
    expect(cmp.baseline_id).toBe(first.structuredContent.report_id);
    expect(cmp.ratios).toHaveLength(1);
    expect(cmp.ratios[0].throughput_ratio).toBeGreaterThan(0);
    expect(cmp.ratios[0].difference).toMatch(/^(no significant difference|slower|faster)$/);
    expect(cmp.ratios[0].p50_ratio_ci).toHaveLength(2);
    // Like for like; only a verdict of this busy test machine may be warned about.
    expect(cmp.warnings.filter((w: string) => !/: unstable: /.test(w))).toEqual([]);
  }

  it(
    "measures a dtype × mode grid: percentiles, precision vs fp32, compile apart, memory, FLOPs, progress",
    async () => {
      // graphs_compiled counts what this call compiled: no earlier call may have compiled them.
      await withOwnServer("grid", grid);
    },
    scaled(240_000),
  );

  async function grid(own: Awaited<ReturnType<typeof connectStdio>>) {
    const progress: string[] = [];
    const r: any = await own.client.callTool(
      {
        name: "run_benchmark",
        arguments: {
          model: "mnist-cnn",
          batch_sizes: [1, 4],
          dtypes: ["float32", "bfloat16"],
          modes: ["eager", "compile"],
          iterations: 5,
          warmup: 1,
        },
      },
      undefined,
      { onprogress: (p) => progress.push(String(p.message)), timeout: scaled(300_000) },
    );
    expect(r.isError, JSON.stringify(r)).toBeFalsy();
    const report = r.structuredContent;
    expect(report).toMatchObject({ scenario: "single-stream", work: "forward", cancelled: false });
    expect(report.configs).toHaveLength(8);
    expect(progress.filter((m) => /^batch=/.test(m))).toHaveLength(8);
    const m = report.manifest;
    expect(m).toMatchObject({
      device_kind: "cpu",
      seed: 0,
      compile_backend: "inductor",
      precision_reference: "cpu float32 eager",
    });
    expect(m.weight_digest).toMatch(/^sha256:/);
    expect(m.torch_version).toBeTruthy();
    for (const c of report.configs) {
      expect(c.error).toBeNull();
      const l = c.latency_ms;
      expect(l.p50).toBeLessThanOrEqual(l.p90);
      expect(l.p90).toBeLessThanOrEqual(l.p99);
      // An unstable configuration is extended (up to 4× here): never fewer than asked.
      expect(c.stability).toMatchObject({ iterations_requested: 5, cpus: expect.any(Number) });
      if (!c.stability.extended) expect(c.iterations).toBe(5);
      expect(c.iterations).toBeGreaterThanOrEqual(5);
      expect(c.iterations).toBeLessThanOrEqual(20);
      expect(c.stability.stable || c.stability.reason.length > 0).toBe(true);
      expect(c.stability.p50_ci_ms[0]).toBeLessThanOrEqual(l.p50);
      expect(c.stability.p50_ci_ms[1]).toBeGreaterThanOrEqual(l.p50);
      expect(c.flops_per_item).toBeGreaterThan(1e6);
      // A fraction in (0, 1], or (a CPU peak measured while other work ran) none, with the fault.
      if (c.fraction_of_peak === null) expect(c.fraction_of_peak_fault).toMatch(/exceeds the peak/);
      else {
        expect(c.fraction_of_peak).toBeGreaterThan(0);
        expect(c.fraction_of_peak).toBeLessThanOrEqual(1);
      }
      expect(c.peak_memory_bytes).toBeGreaterThan(0);
      expect(c.peak_memory_kind).toMatch(/^cpu_/);
      if (c.dtype === "float32") expect(c.max_abs_error_vs_fp32).toBeLessThanOrEqual(1e-6);
      else {
        expect(c.max_abs_error_vs_fp32).toBeGreaterThan(0);
        expect(c.cosine_similarity_vs_fp32).toBeGreaterThan(0.99);
      }
      if (c.mode === "compile") {
        expect(c.compile_s).toBeGreaterThan(0);
        expect(c.graphs_compiled).toBeGreaterThanOrEqual(1);
        expect(c.recompiles_in_window).toBe(0);
        expect(c.recompiled).toBe(false);
      } else {
        expect(c.compile_s).toBe(0);
      }
    }

    // A report compared with itself: every ratio is 1 and nothing to warn about.
    const self = compareReports(report, report, report.report_id);
    expect(self.ratios).toHaveLength(8);
    for (const x of self.ratios) {
      for (const k of [
        "p50_ratio",
        "p90_ratio",
        "p99_ratio",
        "mean_ratio",
        "throughput_ratio",
        "peak_memory_ratio",
      ] as const)
        expect(x[k]).toBe(1);
    }
    // Identical intervals overlap: no difference is claimed.
    expect(new Set(self.ratios.map((x) => x.difference))).toEqual(
      new Set(["no significant difference"]),
    );
    expect(self.warnings.every((w) => /: unstable: /.test(w))).toBe(true);
    // Unlike for like: a different matmul precision and device are called out.
    const other = structuredClone(report);
    other.manifest.device_name = "TPU v5 lite";
    other.configs.forEach(
      (c: any) => (c.matmul_precision = "default (one-pass bf16, fp32 accumulation)"),
    );
    expect(compareReports(report, other, "bench_x").warnings.join("\n")).toMatch(
      /matmul precision differs[\s\S]*devices differ/,
    );

    // JSON, Markdown and SVG resources.
    const json = JSON.parse(
      ((await own.client.readResource({ uri: report.resource_uri })).contents[0] as any).text,
    );
    expect(json.configs).toHaveLength(8);
    const md = ((await own.client.readResource({ uri: report.markdown_uri })).contents[0] as any)
      .text as string;
    expect(md).toContain("| batch | seq | dtype | mode | p50 ms | p90 ms | p99 ms |");
    expect(md.split("\n").filter((l) => /^\| [14] \|/.test(l))).toHaveLength(8);
    const svg = (await own.client.readResource({ uri: report.chart_uri })).contents[0] as any;
    expect(svg.mimeType).toBe("image/svg+xml");
    expect(svg.text).toMatch(/^<svg[^>]*xmlns="http:\/\/www.w3.org\/2000\/svg"/);
    expect((svg.text.match(/<path /g) ?? []).length).toBe(8); // 4 series × (latency, throughput)
    expect(svg.text).toContain("bfloat16 compile");
    const templates = await own.client.listResourceTemplates();
    expect(templates.resourceTemplates.map((t) => t.uriTemplate)).toContain(
      "tpu://benchmarks/{id}.svg",
    );
  }

  it("runs offline at the largest batch; its throughput is items ÷ wall time of the window", async () => {
    const r = await call(conn.client, "run_benchmark", {
      model: "mnist-cnn",
      batch_sizes: [2, 16, 8],
      scenario: "offline",
      iterations: 6,
      warmup: 1,
    });
    expect(r.isError, JSON.stringify(r)).toBeFalsy();
    const [c, ...rest] = r.structuredContent.configs;
    expect(rest).toHaveLength(0);
    expect(c).toMatchObject({ batch: 16, scenario: "offline", offline_skipped_batches: [] });
    // Offline measures the whole timed window (the gaps between calls included), not one call:
    // batch ÷ mean latency (single-stream's formula) would overstate it.
    expect(c.stability.iterations_requested).toBe(6);
    expect(c.iterations).toBeGreaterThanOrEqual(6);
    expect(c.throughput_basis).toBe("items / wall time of the measured window");
    const expected = (c.batch * c.iterations) / c.measured_s;
    // Only rounding apart: measured_s to the µs (relative 0.5 µs ÷ window) and the throughput to
    // 4 decimals; twice that allowed. The gaps between calls are far more than this.
    const rounding = expected * (1e-6 / c.measured_s) + 1e-4;
    expect(Math.abs(c.throughput_items_per_s - expected)).toBeLessThanOrEqual(rounding);
  });

  it("reports each configuration's shapes and padding at the model's shape plan", async () => {
    const r = await call(conn.client, "run_benchmark", {
      model: "mnist-cnn",
      batch_sizes: [3],
      iterations: 2,
      warmup: 0,
    });
    expect(r.isError, JSON.stringify(r)).toBeFalsy();
    const [c] = r.structuredContent.configs;
    // A batch of 3 runs at the batch bucket 4: a quarter of the forward is padding.
    expect(c.shape_report).toMatchObject({
      distinct_shapes: 1,
      shapes: [["forward", 4, 0]],
      padding_waste: 0.25,
    });
    expect(JSON.stringify(r.content)).toContain("padding 25%");
  });

  it("check_model lists MiniLM's matmul, layer-norm and softmax operators with counts", async () => {
    const r = await call(conn.client, "check_model", {
      model: "all-minilm-l6-v2",
      batch: 1,
      seq_len: 8,
      attention: "math",
    });
    expect(r.isError, JSON.stringify(r)).toBeFalsy();
    const out = r.structuredContent;
    expect(out).toMatchObject({
      model: "all-minilm-l6-v2",
      device: "cpu",
      verdict: "supported",
      attention: "math",
      error: null,
    });
    const ops = new Map<string, any>(out.ops.map((o: any) => [o.op, o]));
    expect(ops.get("aten::addmm")).toMatchObject({
      category: "matmul",
      count: 37,
      on_device: 37,
      fell_back: 0,
      failed: 0,
    });
    expect(ops.get("aten::bmm")?.count).toBe(12);
    expect(ops.get("aten::native_layer_norm")?.count).toBe(13);
    expect(out.ops.find((o: any) => o.category === "softmax")?.count).toBe(6);
    expect(out.estimated_memory_bytes).toBeGreaterThan(0);
    expect(out.measured_peak_memory_bytes).toBeGreaterThan(0);
    expect(out.total_ops).toBe(out.ops.reduce((s: number, o: any) => s + o.count, 0));
    // By default the fused attention kernel the CPU really dispatches is what is listed.
    const fused = await call(conn.client, "check_model", {
      model: "all-minilm-l6-v2",
      batch: 1,
      seq_len: 8,
    });
    expect(fused.structuredContent.categories.attention).toBe(6);
  });

  it("check_model's shape report: the plan's bucket, its padding and a shape-stable verdict", async () => {
    const r = await call(conn.client, "check_model", {
      model: "mnist-cnn",
      batch: 3,
      shape_audit: true,
    });
    expect(r.isError, JSON.stringify(r)).toBeFalsy();
    const out = r.structuredContent;
    // 3 items ran at the batch bucket 4 (the answer cut back to 3), traced by dynamo as one graph.
    expect(out.output_shape).toEqual([3, 10]);
    expect(out.shape_report).toMatchObject({
      distinct_shapes: 1,
      shapes: [[4, 0]],
      padding_waste: 0.25,
      shape_stable: true,
      graphs: 1,
      graph_breaks: 0,
      breaks: [],
    });
    expect(JSON.stringify(r.content)).toContain("shape-stable (one graph)");
  });
});
