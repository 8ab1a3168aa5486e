import { describe, expect, it } from "vitest";
import {
  DEFAULT_ASSUMPTIONS,
  estimateCost,
  hostDrift,
  workOf,
  type CallRecord,
  type CostEstimate,
  type EstimateInput,
  memoryFor,
  type DeviceFacts,
  type LatencyRecord,
  type ModelFacts,
  dtypeBytes,
} from "../../policies/estimate.js";
import { DTYPE_ITEMSIZE } from "../../lib/dtypes.js";
import { DEFAULT_APPROVAL_RULES } from "../../policies/config.js";
import { matchApprovalRule } from "../../policies/gate/approval_flow.js";
import { formatBytes } from "../../lib/units.js";

const GiB = 2 ** 30;
/** A benchmark's estimate as asked: without the worst case of its stability extension. */
const asked = (e: CostEstimate) => e.device_seconds - (e.stability_extension_s ?? 0);
const minilm: ModelFacts = {
  id: "all-minilm-l6-v2",
  parameters: 22_700_000,
  weight_bytes: 90_900_000,
  dtypes: ["float32", "bfloat16", "float16"],
};
const big: ModelFacts = {
  id: "big-8b",
  parameters: 8e9,
  weight_bytes: 32e9,
  dtypes: ["float32", "bfloat16"],
};
const tpu = (freeGiB: number, totalGiB = 32): DeviceFacts => ({
  kind: "tpu",
  memory_free_bytes: freeGiB * GiB,
  memory_total_bytes: totalGiB * GiB,
});

describe("estimateCost", () => {
  it("counts parameters × dtype bytes × 1.2 plus an activation allowance", () => {
    const fp32 = memoryFor(big.parameters, "float32", 1);
    const bf16 = memoryFor(big.parameters, "bfloat16", 1);
    expect(fp32).toBeGreaterThan(8e9 * 4 * 1.2);
    expect(bf16).toBeGreaterThan(8e9 * 2 * 1.2);
    expect(bf16).toBeLessThan(fp32 / 1.9);
  });

  it("fits a small model and reports its weight bytes", () => {
    const e = estimateCost({
      kind: "load",
      args: { model: minilm.id, device: "cpu" },
      model: minilm,
      device: { kind: "cpu", memory_free_bytes: 8 * GiB, memory_total_bytes: 16 * GiB },
    });
    expect(e.fits).toBe(true);
    expect(e.weight_bytes).toBe(90_900_000);
    expect(e.compile_s).toBe(0);
    expect(e.device_seconds).toBeGreaterThan(0);
  });

  it("prices a compiled load of a model with a shape plan at one compile per shape of the plan", () => {
    const device = { kind: "cpu", memory_free_bytes: 8 * GiB, memory_total_bytes: 16 * GiB };
    const args = { model: minilm.id, device: "cpu", mode: "compile" };
    const perGraph = DEFAULT_ASSUMPTIONS.compile_s_per_graph.cpu!;
    const plan = (batches: number[], lengths: number[]) =>
      batches.flatMap((batch) => lengths.map((length) => ({ batch, length })));
    const small = plan([1, 2, 4, 8], [8, 16, 32, 64, 128]);
    const large = plan([1, 2, 4, 8, 16, 32, 64], [8, 16, 32, 64, 128, 256]);
    const load = (shape_plan: ModelFacts["shape_plan"], more: Partial<EstimateInput> = {}) =>
      estimateCost({ kind: "load", args, model: { ...minilm, shape_plan }, device, ...more });
    expect(load(small).compile_s).toBe(20 * perGraph);
    expect(load(large).compile_s).toBe(42 * perGraph);
    // The warm-up runs each shape once too: more buckets, more than their compiles.
    expect(load(large).device_seconds - load(small).device_seconds).toBeGreaterThan(22 * perGraph);
    // Eager loads compile nothing, whatever the plan; no plan: one graph per warm-up shape.
    expect(load(large, { args: { ...args, mode: "eager" } }).compile_s).toBe(0);
    expect(estimateCost({ kind: "load", args, model: minilm, device }).compile_s).toBe(perGraph);
    // A measured compiled load of the small plan prices the large one by the plans' sizes, not as
    // the same work (the catalog's buckets changed, so the load did).
    const measured: CallRecord = {
      kind: "load",
      model: minilm.id,
      device: "cpu",
      work: workOf({ kind: "load", args, model: { ...minilm, shape_plan: small }, device }),
      seconds: 150,
      at: 1,
    };
    expect(measured.work.graphs).toBe(20);
    const learnedSmall = load(small, { calls: [measured] }).device_seconds;
    const learnedLarge = load(large, { calls: [measured] }).device_seconds;
    expect(learnedSmall).toBeCloseTo(150, 3);
    // (compiles by the two counts; the measured plan's warm-up as that many of the large plan's
    // shapes on average, which the work does not keep one by one).
    expect(learnedLarge / learnedSmall).toBeGreaterThan(2);
    expect(learnedLarge / learnedSmall).toBeLessThanOrEqual(
      load(large).device_seconds / load(small).device_seconds,
    );
    // ...and no call of it compiles afterwards (the warm-up covered every shape).
    const call = { kind: "inference" as const, args: { texts: ["a b c"] }, device };
    const loaded = { loaded_mode: "compile", loaded_at: 0 };
    expect(workOf({ ...call, model: { ...minilm, shape_plan: large }, ...loaded }).cold).toBe(
      false,
    );
    expect(workOf({ ...call, model: minilm, ...loaded }).cold).toBe(true);
  });

  it("refuses what does not fit and suggests bfloat16 when that fits", () => {
    const e = estimateCost({
      kind: "load",
      args: { model: big.id, device: "tpu" },
      model: big,
      device: tpu(30),
    });
    expect(e.fits).toBe(false);
    expect(e.reason).toMatch(/^needs [\d.]+ GiB, device has 30\.0 GiB free$/);
    expect(e.suggestion).toMatch(/use dtype bfloat16/);
  });

  it("prices a load's memory at the worker's own pre-flight where the worker gave one", () => {
    // SmolLM2 as its worker measures it (docs/troubleshooting.md): 1.63 GiB in float32, 0.93 in
    // bfloat16, where parameters × bytes + headroom alone would say 0.66 and 0.39.
    const smol: ModelFacts = {
      id: "smollm2-135m-instruct",
      parameters: 134_515_008,
      weight_bytes: 269_030_016,
      dtypes: ["float32", "bfloat16"],
      load_memory_bytes: { float32: 1_749_000_000, bfloat16: 1_002_000_000 },
    };
    const cpu = (free: number): DeviceFacts => ({
      kind: "cpu",
      memory_free_bytes: free,
      memory_total_bytes: 8 * GiB,
    });
    const e = estimateCost({
      kind: "load",
      args: { model: smol.id },
      model: smol,
      device: cpu(2 * GiB),
    });
    expect(e.memory_bytes).toBe(1_749_000_000);
    expect(e.fits).toBe(true);
    const short = estimateCost({
      kind: "load",
      args: { model: smol.id },
      model: smol,
      device: cpu(1.5 * GiB),
    });
    expect(short.fits).toBe(false);
    expect(short.suggestion).toBe(`use dtype bfloat16 (needs ${formatBytes(1_002_000_000)})`);
  });

  it("suggests unloading named models when no smaller dtype fits", () => {
    const e = estimateCost({
      kind: "load",
      args: { model: big.id, device: "tpu", dtype: "bfloat16" },
      model: big,
      device: tpu(10),
      loaded: [
        { model: "small", bytes: 1 * GiB },
        { model: "large", bytes: 12 * GiB },
      ],
    });
    expect(e.fits).toBe(false);
    expect(e.suggestion).toMatch(/^unload large \(/);
  });

  it("says when a model can never fit the device", () => {
    const e = estimateCost({
      kind: "load",
      args: { model: big.id, device: "tpu", dtype: "bfloat16" },
      model: big,
      device: tpu(8, 8),
    });
    expect(e.fits).toBe(false);
    expect(e.suggestion).toMatch(/does not fit this device at all/);
  });

  it("treats unknown device memory as fitting", () => {
    const e = estimateCost({
      kind: "load",
      args: {},
      model: big,
      device: { kind: "cpu", memory_free_bytes: null, memory_total_bytes: null },
    });
    expect(e.fits).toBe(true);
  });

  it("adds compile time per warmup shape in compile mode", () => {
    const eager = estimateCost({
      kind: "load",
      args: { mode: "eager" },
      model: minilm,
      device: tpu(30),
    });
    const compiled = estimateCost({
      kind: "load",
      args: {
        mode: "compile",
        warmup_shapes: [
          { batch: 1, seq_len: 128 },
          { batch: 8, seq_len: 128 },
        ],
      },
      model: minilm,
      device: tpu(30),
    });
    expect(compiled.compile_s).toBe(90);
    expect(compiled.device_seconds).toBeGreaterThan(eager.device_seconds + 89);
  });

  it("scales benchmarks with grid size and iterations", () => {
    // The passes alone (the fixed cost per configuration has a test of its own).
    const assumptions = { benchmark_config_overhead_s: 0 };
    const one = estimateCost({
      kind: "benchmark",
      args: { batch_sizes: [8], seq_lens: [128], iterations: 10 },
      model: minilm,
      device: tpu(30),
      assumptions,
    });
    const grid = estimateCost({
      kind: "benchmark",
      args: { batch_sizes: [8, 8], seq_lens: [128, 128], iterations: 10 },
      model: minilm,
      device: tpu(30),
      assumptions,
    });
    const more = estimateCost({
      kind: "benchmark",
      args: { batch_sizes: [8], seq_lens: [128], iterations: 100 },
      model: minilm,
      device: tpu(30),
      assumptions,
    });
    expect(grid.device_seconds).toBeGreaterThan(one.device_seconds * 3.5);
    expect(more.device_seconds).toBeGreaterThan(one.device_seconds * 5);
  });

  it("prices a training step as three forwards plus the optimizer, and its memory as a copy with gradients and state", () => {
    const assumptions = { benchmark_config_overhead_s: 0 };
    const args = { batch_sizes: [8], seq_lens: [128], iterations: 10, warmup: 0 };
    const at = (extra: Record<string, unknown>) =>
      estimateCost({
        kind: "benchmark",
        args: { ...args, ...extra },
        model: minilm,
        // The CPU's FLOP rate: the optimizer's passes are milliseconds there, not rounded away.
        device: { kind: "cpu", memory_free_bytes: 30 * GiB, memory_total_bytes: 32 * GiB },
        loaded: [{ model: minilm.id, bytes: 1e8 }],
        assumptions,
      });
    const forward = at({});
    const adamw = at({ work: "train_step", optimizer: "adamw" });
    const sgd = at({ work: "train_step", optimizer: "sgd" });
    // 10 steps of 3 forwards each (and 4 forwards counting FLOPs) against 11 forwards.
    expect(adamw.device_seconds).toBeGreaterThan(forward.device_seconds * 2.5);
    expect(adamw.device_seconds).toBeGreaterThan(sgd.device_seconds);
    // A float32 copy, its gradients and AdamW's two moments (SGD: one momentum buffer).
    expect(adamw.memory_bytes - forward.memory_bytes).toBe(minilm.parameters * 4 * 4);
    expect(sgd.memory_bytes - forward.memory_bytes).toBe(minilm.parameters * 4 * 3);
    // The optimizer is part of the work an estimate learns from.
    const work = workOf({
      kind: "benchmark",
      args: { ...args, work: "train_step", optimizer: "sgd" },
      model: minilm,
    });
    expect(work.optimizer).toBe("sgd");
  });

  it("leaves no training step outside the default approval rules", () => {
    // The rule names the tool alone: whatever its work or estimate, a run_benchmark asks first.
    const cheap = estimateCost({
      kind: "benchmark",
      args: { batch_sizes: [1], iterations: 1, work: "train_step", optimizer: "sgd" },
      model: { ...minilm, parameters: 1 },
      device: tpu(30),
    });
    // The config gives each default rule its assurance; matching reads tool, principals and when.
    const rules = DEFAULT_APPROVAL_RULES.map((r) => ({ ...r, assurance: "token" as const }));
    expect(matchApprovalRule(rules, "agent", "run_benchmark", cheap)?.tool).toBe("run_benchmark");
  });

  it("uses duration_s per grid point when given", () => {
    const e = estimateCost({
      kind: "benchmark",
      args: { batch_sizes: [1, 2], seq_lens: [16], duration_s: 30, warmup: 0 },
      model: minilm,
      device: tpu(30),
    });
    expect(asked(e)).toBeGreaterThanOrEqual(60);
    expect(asked(e)).toBeLessThan(61);
  });

  it("learns from history: a measured latency replaces the FLOP guess", () => {
    const args = { batch_sizes: [4], seq_lens: [64], iterations: 100, warmup: 0 };
    const measured = estimateCost({
      kind: "benchmark",
      args,
      model: minilm,
      device: tpu(30),
      loaded: [{ model: minilm.id, bytes: 1e8 }],
      history: [{ model: minilm.id, device: "tpu:0", batch: 4, seq_len: 64, mean_latency_ms: 200 }],
    });
    // 100 iterations × 0.2 s, plus a small fp32 reference pass...
    expect(asked(measured)).toBeGreaterThanOrEqual(20);
    expect(asked(measured)).toBeLessThan(20.5);
    // ...and up to three times the 100 more if the series is unstable (stability.py).
    expect(measured.stability_extension_s).toBeCloseTo(3 * 20, 3);
    expect(measured.weight_bytes).toBe(0);
  });

  // Issue 23 (finding 2): check_model's estimate ignored the dtype, so float16 checks that ran
  // several times longer on a CPU were admitted as if they were float32.
  it("prices a dtype by its measured cost on the device kind; history in the call's own dtype wins", () => {
    const cpu: DeviceFacts = { kind: "cpu", memory_free_bytes: null, memory_total_bytes: null };
    const check = (dtype: string, device: DeviceFacts, history: LatencyRecord[] = []) =>
      estimateCost({
        kind: "check",
        args: { batch: 8, seq_len: 256, dtype },
        model: minilm,
        device,
        loaded: [{ model: minilm.id, bytes: 1 }],
        history,
        assumptions: { dtype_cost_factor: { cpu: { float32: 1, float16: 4, bfloat16: 2 } } },
      }).device_seconds;
    // The FLOP model: a float16 pass on a CPU costs what the factor says (above the overhead).
    const f32 = check("float32", cpu);
    expect(check("float16", cpu)).toBeGreaterThan(3.5 * f32);
    expect(check("bfloat16", cpu)).toBeGreaterThan(1.8 * f32);
    // A device kind without a factor: no dtype assumed cheaper or dearer.
    expect(check("float16", tpu(30))).toBeCloseTo(check("float32", tpu(30)), 6);
    // History in the call's own dtype wins over the factor...
    const at = (dtype: string, ms: number): LatencyRecord => ({
      model: minilm.id,
      device: "cpu",
      batch: 8,
      seq_len: 256,
      dtype,
      mean_latency_ms: ms,
    });
    // (the check's fixed cost, plus two passes)
    const fixed = DEFAULT_ASSUMPTIONS.check_overhead_s;
    expect(check("float16", cpu, [at("float16", 500)])).toBeCloseTo(fixed + 1, 6); // 2 × 0.5 s
    // ...and another dtype's is converted by the two factors.
    expect(check("float16", cpu, [at("float32", 500)])).toBeCloseTo(fixed + 4, 6);
    expect(check("float16", cpu, [at("float32", 500), at("float16", 200)])).toBeCloseTo(
      fixed + 0.4,
      6,
    );
  });

  it("ships measured CPU factors: float16 above float32, no dtype assumed cheaper", () => {
    const f = DEFAULT_ASSUMPTIONS.dtype_cost_factor.cpu!;
    expect(f.float16).toBeGreaterThan(1);
    for (const d of ["float32", "bfloat16", "float16"]) expect(f[d]).toBeGreaterThanOrEqual(1);
  });

  it("estimates inference from the number of items and new tokens", () => {
    const one = estimateCost({
      kind: "inference",
      args: { texts: ["hi"] },
      model: minilm,
      device: tpu(30),
    });
    const many = estimateCost({
      kind: "inference",
      args: { texts: Array(64).fill("hello there"), max_new_tokens: 16 },
      model: minilm,
      device: tpu(30),
    });
    expect(many.device_seconds).toBeGreaterThan(one.device_seconds);
    expect(one.fits).toBe(true);
  });

  it("charges generation per new token, so a 64-token run is not estimated as one forward pass", () => {
    const base = { batch_sizes: [1], seq_lens: [32], iterations: 10, warmup: 0 };
    const forward = estimateCost({
      kind: "benchmark",
      args: { ...base, work: "forward" },
      model: minilm,
      device: tpu(30),
      assumptions: { benchmark_config_overhead_s: 0 },
    });
    const generate = estimateCost({
      kind: "benchmark",
      args: { ...base, work: "generate", max_new_tokens: 64 },
      model: minilm,
      device: tpu(30),
      assumptions: { benchmark_config_overhead_s: 0 },
    });
    // Each pass is a prompt forward plus 64 one-token steps (each at least a step's overhead).
    expect(generate.device_seconds).toBeGreaterThan(forward.device_seconds * 5);
    const shorter = estimateCost({
      kind: "benchmark",
      args: { ...base, work: "generate", max_new_tokens: 8 },
      model: minilm,
      device: tpu(30),
      assumptions: { benchmark_config_overhead_s: 0 },
    });
    expect(generate.device_seconds).toBeGreaterThan(shorter.device_seconds * 3);
  });

  it("estimates offline runs at the largest batch only, and check_model by its batch and length", () => {
    const grid = { batch_sizes: [1, 2, 4, 8], seq_lens: [64], iterations: 10, warmup: 0 };
    const single = estimateCost({
      kind: "benchmark",
      args: grid,
      model: minilm,
      device: tpu(30),
    });
    const offline = estimateCost({
      kind: "benchmark",
      args: { ...grid, scenario: "offline" },
      model: minilm,
      device: tpu(30),
    });
    expect(offline.device_seconds).toBeLessThan(single.device_seconds);
    const small = estimateCost({
      kind: "check",
      args: { batch: 1, seq_len: 16 },
      model: big,
      device: tpu(30),
      loaded: [{ model: big.id, bytes: 1 }],
      assumptions: { check_overhead_s: 0 },
    });
    const large = estimateCost({
      kind: "check",
      args: { batch: 8, seq_len: 512 },
      model: big,
      device: tpu(30),
      loaded: [{ model: big.id, bytes: 1 }],
      assumptions: { check_overhead_s: 0 },
    });
    expect(large.device_seconds).toBeGreaterThan(small.device_seconds * 50);
  });

  // One table (lib/dtypes.ts) for the wire and the estimate; unknown dtypes count as 4 bytes.
  it("sizes every dtype as the wire's framing does", () => {
    expect(dtypeBytes("complex128")).toBe(4);
    for (const [dtype, size] of Object.entries(DTYPE_ITEMSIZE))
      expect(dtypeBytes(dtype), dtype).toBe(size);
  });

  it("formats bytes in binary units, negatives with a sign", () => {
    expect(formatBytes(512)).toBe("512 B");
    expect(formatBytes(3 * 2 ** 30)).toBe("3.0 GiB");
    expect(formatBytes(-2048)).toBe("-2.0 KiB");
  });
});

describe("fixed costs measured on the estimate corpus (bench/estimates.ts)", () => {
  const cpu: DeviceFacts = { kind: "cpu", memory_free_bytes: null, memory_total_bytes: null };
  const tiny: ModelFacts = { ...minilm, id: "tiny", parameters: 100_000 };
  const est = (kind: EstimateInput["kind"], args: Record<string, unknown>) =>
    estimateCost({ kind, args, model: tiny, device: cpu, loaded: [{ model: "tiny", bytes: 1 }] })
      .device_seconds;

  it("prices a decoding step at its own small overhead, not a whole call's", () => {
    const fwd = est("inference", { texts: ["hello"] });
    const gen = est("inference", { texts: ["hello"], max_new_tokens: 64 });
    // 64 steps of a tiny model: about 64 × 1 ms, far from 64 × the 10 ms of a call.
    expect(gen - fwd).toBeGreaterThan(64 * 0.0009);
    expect(gen - fwd).toBeLessThan(64 * 0.002);
  });

  it("counts a fixed cost per benchmark configuration and per check, however small the model", () => {
    const bench = (batch_sizes: number[]) =>
      est("benchmark", { batch_sizes, seq_lens: [8], iterations: 1, warmup: 0 });
    const perConfig = DEFAULT_ASSUMPTIONS.benchmark_config_overhead_s;
    expect(perConfig).toBeGreaterThan(0);
    expect(bench([1])).toBeGreaterThanOrEqual(perConfig);
    expect(bench([1, 2, 4, 8]) - bench([1])).toBeGreaterThanOrEqual(3 * perConfig);
    expect(est("check", { batch: 1, seq_len: 8 })).toBeGreaterThanOrEqual(
      DEFAULT_ASSUMPTIONS.check_overhead_s,
    );
    expect(DEFAULT_ASSUMPTIONS.check_overhead_s).toBeGreaterThan(0);
  });

  it("charges a check's shape audit (a dynamo trace) as one graph's compile", () => {
    const plain = est("check", { batch: 1, seq_len: 8 });
    const traced = est("check", { batch: 1, seq_len: 8, shape_audit: true });
    expect(traced - plain).toBeCloseTo(DEFAULT_ASSUMPTIONS.compile_s_per_graph.cpu, 6);
  });
});

// Issue 22 (item 2): estimates measured against a corpus of real calls (bench/estimates.ts). The
// device model alone was off by 0.1–40× there; calls the gate measured make the estimate.
describe("estimates from measured calls", () => {
  const cpu: DeviceFacts = { kind: "cpu", memory_free_bytes: null, memory_total_bytes: null };
  const base = { model: minilm, device: cpu, loaded: [{ model: minilm.id, bytes: 1 }] };
  const est = (input: Omit<EstimateInput, "model" | "device">) =>
    estimateCost({ ...base, ...input }).device_seconds;
  /** A call of `kind` with these args that took `seconds`, as the tools layer keeps it. */
  const call = (
    kind: EstimateInput["kind"],
    args: Record<string, unknown>,
    seconds: number,
    extra: Partial<EstimateInput> = {},
    at = 1000,
  ): CallRecord => ({
    kind,
    model: minilm.id,
    device: "cpu",
    work: workOf({ ...base, kind, args, ...extra }),
    seconds,
    at,
  });
  const texts = (n: number, chars: number) => Array(n).fill("x".repeat(chars));

  // Issue 44 (item 5): the gate refuses as never fitting only what is not a guess.
  it("says what an estimate rests on: defaults, measured calls, or the request's own window", () => {
    const basis = (input: Omit<EstimateInput, "model" | "device">) =>
      estimateCost({ ...base, ...input }).basis;
    const tiny = { model: minilm.id, batch_sizes: [1], seq_lens: [8] };
    const cold = { cold: true };
    expect(basis({ kind: "load", args: cold, models_built: 0 })).toBe("default");
    expect(
      basis({
        kind: "load",
        args: cold,
        models_built: 0,
        calls: [call("load", cold, 3, { models_built: 0 })],
      }),
    ).toBe("measured");
    expect(basis({ kind: "benchmark", args: { ...tiny, iterations: 5 } })).toBe("default");
    expect(basis({ kind: "benchmark", args: { ...tiny, duration_s: 2 } })).toBe("requested");
    // A measured benchmark of the same class prices a larger one of it: measured.
    const small = { ...tiny, iterations: 5 };
    expect(
      basis({
        kind: "benchmark",
        args: { ...tiny, iterations: 10_000 },
        calls: [call("benchmark", small, 1)],
      }),
    ).toBe("measured");
  });

  it("takes a repeated call's measured cost, whatever the device model says", () => {
    const args = { texts: texts(8, 200) };
    const modelled = est({ kind: "inference", args });
    const measured = est({ kind: "inference", args, calls: [call("inference", args, 0.75)] });
    expect(modelled).not.toBeCloseTo(0.75, 2);
    expect(measured).toBeCloseTo(0.75, 3);
  });

  it("scales the nearest measured call by batch and tokens as the device model does", () => {
    const small = { texts: texts(2, 400) };
    const large = { texts: texts(16, 400) };
    const calls = [call("inference", small, 0.4)];
    const ratio = est({ kind: "inference", args: large }) / est({ kind: "inference", args: small });
    expect(ratio).toBeGreaterThan(4); // the model's growth from 2 to 16 items
    const scaled = est({ kind: "inference", args: large, calls });
    expect(Math.abs(scaled / (0.4 * ratio) - 1)).toBeLessThan(0.01);
    // Of two measured sizes, the nearer one decides: 16 items from 16 items, not from 2.
    const both = [...calls, call("inference", large, 1.1)];
    expect(est({ kind: "inference", args: large, calls: both })).toBeCloseTo(1.1, 3);
    // Generation too: more new tokens cost more than the measured call in proportion.
    const gen = (n: number) => ({ texts: texts(1, 40), max_new_tokens: n });
    const g = [call("inference", gen(16), 0.05)];
    expect(est({ kind: "inference", args: gen(64), calls: g })).toBeGreaterThan(0.1);
    expect(est({ kind: "inference", args: gen(64), calls: g })).toBeLessThan(0.25);
  });

  it("takes a repeat of the very work over another shape the model prices about the same", () => {
    // Overhead-bound shapes (a tiny model): the model prices batch 1 and 64 alike, but the first
    // check of a worker took 4.6 s and the batch-64 one 0.44 s.
    const tiny = { ...base, model: { ...minilm, parameters: 1000 } };
    const rec = (batch: number, seconds: number, at: number): CallRecord => ({
      kind: "check",
      model: minilm.id,
      device: "cpu",
      work: workOf({ ...tiny, kind: "check", args: { batch, seq_len: 1 } }),
      seconds,
      at,
    });
    const calls = [rec(1, 4.6, 1000), rec(64, 0.44, 2000)];
    const e = estimateCost({ ...tiny, kind: "check", args: { batch: 64, seq_len: 1 }, calls });
    expect(e.device_seconds).toBeCloseTo(0.44, 3);
  });

  it("takes the median of repeats, so one slow measurement does not decide alone", () => {
    const args = { batch_sizes: [1, 4], seq_lens: [32], iterations: 5, warmup: 1 };
    const calls = [0.5, 9, 0.6].map((s) => call("benchmark", args, s));
    expect(asked(estimateCost({ ...base, kind: "benchmark", args, calls }))).toBeCloseTo(0.6, 3);
  });

  it("never lets compile stand for eager, generation for a forward pass, or another dtype", () => {
    const bench = { batch_sizes: [4], seq_lens: [32], iterations: 5, warmup: 1 };
    const compiled = { ...bench, modes: ["compile"] };
    const eagerAlone = est({ kind: "benchmark", args: bench });
    // A 12 s compiled run says nothing of an eager one...
    expect(
      est({ kind: "benchmark", args: bench, calls: [call("benchmark", compiled, 12)] }),
    ).toBeCloseTo(eagerAlone, 6);
    // ...but does of the next compiled one.
    expect(
      asked(
        estimateCost({
          ...base,
          kind: "benchmark",
          args: compiled,
          calls: [call("benchmark", compiled, 12)],
        }),
      ),
    ).toBeCloseTo(12, 3);
    const fwd = { texts: texts(1, 40) };
    const gen = { ...fwd, max_new_tokens: 16 };
    expect(est({ kind: "inference", args: fwd, calls: [call("inference", gen, 3)] })).toBeCloseTo(
      est({ kind: "inference", args: fwd }),
      6,
    );
    const check = { batch: 4, seq_len: 64 };
    expect(
      est({
        kind: "check",
        args: { ...check, dtype: "float16" },
        calls: [call("check", check, 5)],
      }),
    ).toBeLessThan(1);
  });

  it("prices a compiled model's first call of a shape with a compile, the next one without", () => {
    const args = { texts: texts(1, 40) };
    const compiled = { loaded_mode: "compile", loaded_at: 5000 };
    const compileS = DEFAULT_ASSUMPTIONS.compile_s_per_graph.cpu!;
    // Cold: nothing of this shape since the load (an eager call before it does not count).
    const before = [call("inference", args, 0.02, {}, 4000)];
    const cold = estimateCost({ ...base, kind: "inference", args, ...compiled, calls: before });
    expect(cold.compile_s).toBe(compileS);
    expect(cold.device_seconds).toBeGreaterThan(compileS);
    // Warm: a call of the same bucket ran since the load (at 6000).
    const since = [call("inference", args, 25, compiled, 6000)];
    expect(workOf({ ...base, kind: "inference", args, ...compiled, calls: since }).cold).toBe(
      false,
    );
    const warm = estimateCost({ ...base, kind: "inference", args, ...compiled, calls: since });
    expect(warm.compile_s).toBe(0);
    expect(warm.device_seconds).toBeLessThan(1);
    // An eager model never compiles, and a measured cold call prices the next cold one.
    expect(
      workOf({ ...base, kind: "inference", args, loaded_mode: "eager", loaded_at: 0 }).cold,
    ).toBe(false);
    const coldCalls = [call("inference", args, 27, compiled, 4000)];
    expect(est({ kind: "inference", args, ...compiled, calls: coldCalls })).toBeCloseTo(27, 3);
  });

  it("keeps no texts or tensor data in a call's work, and never estimates under a call's overhead", () => {
    const w = workOf({ ...base, kind: "inference", args: { texts: ["secret words"] } });
    expect(JSON.stringify(w)).not.toContain("secret");
    expect(w).toMatchObject({ items: 1, seq: 6, max_new_tokens: 0 });
    const tiny = { kind: "inference" as const, args: { tensors: [{ shape: [1, 1] }] } };
    expect(
      estimateCost({ ...base, ...tiny, model: { ...minilm, parameters: 1 } }).device_seconds,
    ).toBeGreaterThan(0);
    expect(
      estimateCost({
        ...base,
        ...tiny,
        calls: [{ ...call("inference", tiny.args, 0.0001) }],
      }).device_seconds,
    ).toBe(DEFAULT_ASSUMPTIONS.call_overhead_s);
  });
  it("follows the host: calls since the measurement running slower than estimated scale the next", () => {
    const args = { texts: texts(8, 200) };
    const other = { texts: texts(1, 40) };
    const measuredThen = call("inference", args, 0.5, {}, 1000);
    // Since then, three calls of another shape took twice what measured calls said they would.
    const slow = [2000, 3000, 4000].map((at) => ({
      ...call("inference", other, 0.2, {}, at),
      estimate_s: 0.1,
    }));
    const now = 5000;
    const calls = [measuredThen, ...slow];
    expect(hostDrift({ ...base, kind: "inference", args, calls, now }, 1000)).toBeCloseTo(2, 6);
    expect(est({ kind: "inference", args, calls, now })).toBeCloseTo(1.0, 3);
    // A measurement newer than those calls already knows the host as it is: no drift on top.
    const fresh = call("inference", args, 0.9, {}, 4500);
    expect(est({ kind: "inference", args, calls: [...calls, fresh], now })).toBeCloseTo(0.9, 3);
    // Calls priced by the device model alone, two calls, tiny calls (jitter) or old ones say
    // nothing of the host.
    const unpriced = slow.map(({ estimate_s: _, ...c }) => c);
    expect(hostDrift({ ...base, kind: "inference", args, calls: unpriced, now })).toBe(1);
    expect(hostDrift({ ...base, kind: "inference", args, calls: slow.slice(0, 2), now })).toBe(1);
    const tiny = slow.map((c) => ({ ...c, seconds: 0.02, estimate_s: 0.005 }));
    expect(hostDrift({ ...base, kind: "inference", args, calls: tiny, now })).toBe(1);
    const later = now + 11 * 60_000;
    expect(hostDrift({ ...base, kind: "inference", args, calls, now: later })).toBe(1);
    // Bounded: a stalled host does not make every estimate a hundred times larger.
    const stalled = slow.map((c) => ({ ...c, seconds: 100 }));
    expect(hostDrift({ ...base, kind: "inference", args, calls: stalled, now })).toBe(4);
  });
});

describe("a cold load (issue 33: estimated 0.057 s, took 28.8 s)", () => {
  const gpt2: ModelFacts = {
    id: "tiny-gpt2",
    parameters: 2_100_000,
    weight_bytes: 8_400_000,
    dtypes: ["float32"],
    library: "transformers",
  };
  const cpu: DeviceFacts = {
    kind: "cpu",
    memory_free_bytes: 8 * GiB,
    memory_total_bytes: 16 * GiB,
  };
  const load = (extra: Partial<EstimateInput> = {}): EstimateInput => ({
    kind: "load",
    args: { model: gpt2.id },
    model: gpt2,
    device: cpu,
    ...extra,
  });
  const importS = DEFAULT_ASSUMPTIONS.library_import_s;

  it("prices the worker's first import of the model's library, and only then", () => {
    const warm = estimateCost(load({ libraries_imported: ["transformers"] })).device_seconds;
    const cold = estimateCost(load({ libraries_imported: [] })).device_seconds;
    expect(warm).toBeLessThan(1);
    expect(cold).toBeGreaterThanOrEqual(importS);
    expect(cold - warm).toBeCloseTo(importS, 3);
    // Unknown (no status): priced as before; a plain-torch model never imports the library.
    expect(estimateCost(load()).device_seconds).toBeCloseTo(warm, 3);
    const { library: _l, ...torchOnly } = gpt2;
    expect(
      estimateCost(load({ model: torchOnly, libraries_imported: [] })).device_seconds,
    ).toBeCloseTo(warm, 3);
  });

  it("prices the weight bytes it reads", () => {
    const heavy = { ...gpt2, weight_bytes: 2e9 };
    const warm = (m: ModelFacts) =>
      estimateCost(load({ model: m, libraries_imported: ["transformers"] })).device_seconds;
    expect(warm(heavy) - warm(gpt2)).toBeCloseTo(
      (2e9 - gpt2.weight_bytes) / DEFAULT_ASSUMPTIONS.load_bytes_per_s,
      1,
    );
  });

  it("prices a plain-torch model's load in a worker that has built no model yet (issue 33: mnist-cnn at 0.01 s)", () => {
    const { library: _l, ...mnist } = { ...gpt2, id: "mnist-cnn", weight_bytes: 420_000 };
    const fresh = estimateCost(load({ model: mnist, libraries_imported: [], models_built: 0 }));
    const warm = estimateCost(load({ model: mnist, libraries_imported: [], models_built: 1 }));
    expect(warm.device_seconds).toBeLessThan(0.1);
    expect(fresh.device_seconds - warm.device_seconds).toBeCloseTo(
      DEFAULT_ASSUMPTIONS.first_build_s,
      3,
    );
    // A transformers model in a fresh worker pays the library's import, which covers its build.
    expect(
      estimateCost(load({ libraries_imported: [], models_built: 0 })).device_seconds,
    ).toBeCloseTo(estimateCost(load({ libraries_imported: [] })).device_seconds, 3);
    // Once a cold load was measured, it prices the next (warm loads stay apart: 2.46 s measured
    // cold, a warm reload priced from its own 3 ms).
    const rec = (models_built: number, seconds: number): CallRecord => ({
      kind: "load",
      model: mnist.id,
      device: "cpu",
      work: workOf(load({ model: mnist, models_built })),
      seconds,
      at: 1000,
    });
    const calls = [rec(0, 2.46), rec(1, 0.003)];
    expect(estimateCost(load({ model: mnist, models_built: 0, calls })).device_seconds).toBeCloseTo(
      2.46,
      2,
    );
    expect(estimateCost(load({ model: mnist, models_built: 3, calls })).device_seconds).toBeCloseTo(
      0.01,
      2,
    );
  });

  it("learns cold loads apart from warm ones", () => {
    const rec = (cold: boolean, seconds: number): CallRecord => ({
      kind: "load",
      model: gpt2.id,
      device: "cpu",
      work: workOf(load({ libraries_imported: cold ? [] : ["transformers"] })),
      seconds,
      at: 1000,
    });
    expect(rec(true, 1).work.cold).toBe(true);
    expect(rec(false, 1).work.cold).toBeUndefined();
    // A measured cold load of 35 s prices the next cold load; a warm one's 0.05 s does not.
    const calls = [rec(true, 35), rec(false, 0.05)];
    expect(estimateCost(load({ libraries_imported: [], calls })).device_seconds).toBeCloseTo(35, 1);
    expect(
      estimateCost(load({ libraries_imported: ["transformers"], calls })).device_seconds,
    ).toBeCloseTo(0.05, 2);
  });
});
