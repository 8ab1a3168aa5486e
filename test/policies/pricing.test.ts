// Device time in money (issue 32, item 3): the conversion (policies/limits/pricing.ts), the
// `pricing` and `money_per_window` config, the meter on a line whose unit is money (its rate is
// the price per second of the call's device kind), and the gate's cap in money on a fake clock.
import { afterAll, describe, expect, it } from "vitest";
import { SqliteApprovalQueue } from "../../server/stores/approvals/sqlite.js";
import { SqliteAuditTrail } from "../../server/stores/audit/sqlite.js";
import { parsePolicyConfig, type PolicyConfigInput } from "../../policies/config.js";
import { PolicyError } from "../../policies/errors.js";
import type { CostEstimate } from "../../policies/estimate.js";
import { approvalPrompt } from "../../policies/gate/answers.js";
import { MONEY_KEY_SUFFIX } from "../../policies/gate/budget_lines.js";
import { Gate, type GateCall } from "../../policies/gate/gate.js";
import { SqliteBudgetLedger } from "../../policies/limits/budget.js";
import { ConcurrencyLimiter } from "../../policies/limits/concurrency.js";
import { lineStopInMs, stopInMs, type Runner } from "../../policies/limits/meter.js";
import {
  costMicros,
  costOf,
  formatAmount,
  formatMoney,
  microsPerSecond,
  reportCost,
  nanosPerChipHour,
  toMicros,
  type PricingConfig,
} from "../../policies/limits/pricing.js";
import { RateLimiter } from "../../policies/limits/rate.js";
import { webhookText } from "../../policies/notify.js";
import type { Principal } from "../../policies/scopes.js";
import { stopReasonOf } from "../../runtime/types.js";
import { TOOL_POLICIES } from "../../tools/registry.js";
import { captureLogger, FakeClock, flush, tempDir } from "./helpers.js";

const tmp = tempDir();
afterAll(() => tmp.cleanup());

const PRICING: PricingConfig = {
  currency: "USD",
  per_device_second: { cpu: 0.0125 },
  per_chip_hour: { tpu: 4.2 },
};

describe("the conversion", () => {
  it("keeps a price per device-second and one per chip-hour as the same exact rate", () => {
    // 0.0125 per second = 45 per hour, in whole nano-units.
    expect(nanosPerChipHour(PRICING, "cpu")).toBe(45_000_000_000n);
    expect(nanosPerChipHour(PRICING, "tpu")).toBe(4_200_000_000n);
    expect(nanosPerChipHour(PRICING, "cuda")).toBeUndefined();
    const perHour: PricingConfig = {
      ...PRICING,
      per_device_second: {},
      per_chip_hour: { cpu: 45 },
    };
    expect(nanosPerChipHour(perHour, "cpu")).toBe(nanosPerChipHour(PRICING, "cpu"));
  });

  it("prices device time in whole micro-units, rounded half up", () => {
    const cpu = nanosPerChipHour(PRICING, "cpu")!;
    expect(costMicros(1, cpu)).toBe(12_500); // 0.0125
    expect(costMicros(3600, cpu)).toBe(45_000_000); // 45.00
    expect(costMicros(0.001, cpu)).toBe(13); // 12.5 µ → 13
    expect(costMicros(0, cpu)).toBe(0);
    const tpu = nanosPerChipHour(PRICING, "tpu")!;
    // 4.2 per hour for 1 s = 0.0011666…: 1166.67 µ → 1167.
    expect(costMicros(1, tpu)).toBe(1167);
    expect(costMicros(1800, tpu)).toBe(2_100_000);
    // Past 2^53 in the product (a month on a dear device) and still exact.
    expect(costMicros(30 * 86400, 1_000_000_000_000n)).toBe(720_000_000_000);
    // Sums of charges are integers: no float residue in a long window.
    let sum = 0;
    for (let i = 0; i < 10_000; i++) sum += costMicros(0.123, tpu);
    expect(sum).toBe(10_000 * costMicros(0.123, tpu));
    expect(Number.isInteger(sum)).toBe(true);
  });

  it("gives the meter the rate the charge uses", () => {
    const tpu = nanosPerChipHour(PRICING, "tpu")!;
    expect(microsPerSecond(tpu) * 1800).toBeCloseTo(costMicros(1800, tpu), 6);
  });

  it("writes amounts exactly, 2 to 6 decimals", () => {
    expect(formatAmount(12_500_000)).toBe("12.50");
    expect(formatAmount(1167)).toBe("0.001167");
    expect(formatAmount(0)).toBe("0.00");
    expect(formatAmount(100_000)).toBe("0.10");
    expect(formatMoney(1_234_500, "EUR")).toBe("1.2345 EUR");
    expect(toMicros(0.1 + 0.2)).toBe(300_000);
  });

  it("prices an estimate, with its kind and its rate, or not at all for an unpriced kind", () => {
    expect(costOf(PRICING, "cpu", 2)).toEqual({
      currency: "USD",
      amount: "0.025",
      amount_micros: 25_000,
      device_kind: "cpu",
      price_per_chip_hour: "45.00",
    });
    expect(costOf(PRICING, "cuda", 2)).toBeUndefined();
  });
});

describe("a benchmark report in money", () => {
  it("prices each configuration's measured window and 1000 items at its throughput", () => {
    const cost = reportCost(PRICING, "cpu", [
      { measured_s: 2, throughput_items_per_s: 500 },
      { error: { code: "out_of_memory" } },
      { measured_s: 0.5, throughput_items_per_s: 4000 },
    ]);
    expect(cost).toEqual({
      currency: "USD",
      device_kind: "cpu",
      price_per_chip_hour: "45.00",
      measured: "0.03125",
      measured_s: 2.5,
      // 1000 items at 500/s: 2 s = 0.025; at 4000/s: 0.25 s = 0.003125.
      configs: [
        { measured: "0.025", per_1k_items: "0.025" },
        null,
        { measured: "0.00625", per_1k_items: "0.003125" },
      ],
    });
    expect(reportCost(PRICING, "cuda", [])).toBeUndefined();
  });
});

describe("the pricing config", () => {
  const parse = (p: unknown) => parsePolicyConfig(p, TOOL_POLICIES);
  it("is optional, and absent by default", () => {
    expect(parse({}).pricing).toBeUndefined();
    expect(parse({}).limits.budget.money_per_window).toBeUndefined();
  });
  it("refuses a budget in money without prices, a kind priced twice, a bad currency", () => {
    expect(() => parse({ limits: { budget: { money_per_window: 10 } } })).toThrow(
      /needs prices: add a pricing section/,
    );
    expect(() =>
      parse({
        pricing: { currency: "USD", per_device_second: { cpu: 1 }, per_chip_hour: { cpu: 1 } },
      }),
    ).toThrow(/priced twice/);
    expect(() => parse({ pricing: { currency: "usd", per_chip_hour: { cpu: 1 } } })).toThrow(
      /ISO 4217/,
    );
    expect(() => parse({ pricing: { currency: "USD" } })).toThrow(/at least one device kind/);
    expect(() => parse({ pricing: { currency: "USD", per_chip_hour: { gpu: 1 } } })).toThrow();
  });
});

describe("the meter on a line in money", () => {
  it("stops where the same budget in seconds would, at the kind's rate", () => {
    // 10 s limit, 3 charged, a 2 s estimate: 7 s in all (meter.test.ts), at 1000 µ/s.
    const rate = 1000;
    const r: Runner = { startedMs: 0, reservedS: 2 * rate, rate };
    const line = { limitS: 10 * rate, chargedS: 3 * rate, reservedS: 2 * rate, runners: [r] };
    expect(stopInMs(line, r, 0)).toBeCloseTo(7000);
  });

  it("meters calls of different kinds at their own rates on one line", () => {
    // A cheap call (1 µ/s) and a dear one (10 µ/s), both estimated at 10 µ, on a 40 µ line.
    const cheap: Runner = { startedMs: 0, reservedS: 10, rate: 1 };
    const dear: Runner = { startedMs: 0, reservedS: 10, rate: 10 };
    const line = { limitS: 40, chargedS: 0, reservedS: 20, runners: [cheap, dear] };
    // The dear one reaches its estimate at 1 s, then draws the 20 µ left at 10 µ/s: out at 3 s,
    // when the cheap one has used 3 of its 10.
    expect(lineStopInMs(line, [cheap, dear], 0)).toBeCloseTo(3000);
    expect(stopInMs(line, dear, 0)).toBeCloseTo(3000);
  });

  it("finds the first stop by headroom in money, not by time, after an overrun", () => {
    // 2 µ over already (a 14 µ line holding 16): the dear call (10 µ/s, 9 µ held, reached at
    // 0.9 s) has 9 µ of headroom less 10 µ/s and stops at 0.7 s; the cheap one (1 µ/s, 7 µ
    // held) would last until the dear one's excess ate its headroom too, (14 / 11) s. The
    // nearest-in-time walk at the cheap one's rate said 0.
    const cheap: Runner = { startedMs: 0, reservedS: 7, rate: 1 };
    const dear: Runner = { startedMs: 0, reservedS: 9, rate: 10 };
    const line = { limitS: 14, chargedS: 0, reservedS: 16, runners: [cheap, dear] };
    expect(lineStopInMs(line, [cheap, dear], 0)).toBeCloseTo(700);
    expect(stopInMs(line, cheap, 0)).toBeCloseTo(14_000 / 11);
  });
});

const agent: Principal = { id: "agent", scopes: ["benchmark:run", "jobs:read"], via: "token" };
const est = (device_seconds: number): CostEstimate => ({
  device_seconds,
  memory_bytes: 1e6,
  compile_s: 0,
  weight_bytes: 0,
  fits: true,
});
const bench = (seconds: number, kind = "cpu"): GateCall => ({
  principal: agent,
  tool: "run_benchmark",
  args: { model: "mnist-cnn", n: Math.random() },
  device: kind,
  estimator: async () => est(seconds),
  deviceKind: () => kind,
});

function makeGate(policy: PolicyConfigInput) {
  const config = parsePolicyConfig({ approvals: { rules: [] }, ...policy }, TOOL_POLICIES);
  const clock = new FakeClock();
  const logger = captureLogger();
  const file = tmp.file(`money-${Math.random().toString(36).slice(2)}.db`);
  const budget = new SqliteBudgetLedger(file, { ...config.limits.budget, clock: clock.now });
  const audit = new SqliteAuditTrail(file, { logger });
  const gate = new Gate({
    tools: TOOL_POLICIES,
    config,
    approvals: new SqliteApprovalQueue(file, { clock: clock.now }),
    audit,
    limiter: new ConcurrencyLimiter(config.limits, clock.now),
    rateLimiter: new RateLimiter(config.limits.rate_limit.per_principal_per_minute, clock.now),
    budget,
    clock: clock.now,
    logger,
  });
  return { gate, clock, budget, audit };
}

/** Work that runs until it is stopped, then answers at once with a partial result. */
function partialOnStop(clock: FakeClock, startedAt: number) {
  const seen: { reason?: unknown } = {};
  const fn = (signal: AbortSignal): Promise<{ stopped: string | undefined }> =>
    new Promise((resolve) =>
      signal.addEventListener("abort", () => {
        seen.reason = signal.reason;
        const ran = ((signal.reason as PolicyError).details.stopped_after_s as number) ?? 0;
        clock.ms = Math.max(clock.ms, startedAt + ran * 1000);
        resolve({ stopped: stopReasonOf(signal.reason) });
      }),
    );
  return { fn, seen };
}

const moneyPolicy = (money: number): PolicyConfigInput => ({
  pricing: { currency: "USD", per_device_second: { cpu: 0.0125 }, per_chip_hour: { tpu: 4.2 } },
  limits: { budget: { money_per_window: money, window_s: 3600 } },
});

describe("a budget in money is a cap", () => {
  it("stops a call when its cost reaches the budget, and charges its cost in micro-units", async () => {
    // 0.00625 USD = 0.5 s at 0.0125 USD/s; the estimate is 0.1 s.
    const { gate, clock, budget, audit } = makeGate(moneyPolicy(0.00625));
    const { fn, seen } = partialOnStop(clock, clock.now());
    expect(await gate.run(bench(0.1), fn)).toEqual({ stopped: "budget" });
    const reason = seen.reason as PolicyError;
    expect(reason.code).toBe("budget_exceeded");
    expect(reason.details).toMatchObject({
      currency: "USD",
      limit: "0.00625",
      estimated: "0.00125",
    });
    expect(reason.details.stopped_after_s).toBeCloseTo(0.5, 2);
    expect(reason.message).toMatch(/budget of agent ran out \(0\.00625 USD per 3600 s window/);
    await flush();
    const charged = (await budget.check(`agent${MONEY_KEY_SUFFIX}`, 0)).used_s;
    expect(Number.isInteger(charged)).toBe(true);
    // Within the price of one gate tick (1 ms) of the limit.
    expect(Math.abs(charged - 6250)).toBeLessThanOrEqual(13);
    // No device-seconds line was charged: the budget is in money.
    expect((await budget.check("agent", 0)).used_s).toBe(0);
    // The audit's estimate carries its cost.
    expect((await audit.tail(2))[0].estimate).toMatchObject({
      cost: { currency: "USD", amount: "0.00125", device_kind: "cpu" },
    });
  }, 10_000);

  it("lets the same budget run longer on a cheaper kind", async () => {
    // 0.0007 USD at 4.2 USD/h is 0.6 s of TPU time (0.056 s of CPU time).
    const { gate, clock } = makeGate(moneyPolicy(0.0007));
    const { fn, seen } = partialOnStop(clock, clock.now());
    expect(await gate.run(bench(0.1, "tpu"), fn)).toEqual({ stopped: "budget" });
    expect((seen.reason as PolicyError).details.stopped_after_s).toBeCloseTo(0.6, 2);
  }, 10_000);

  it("refuses before it runs a call whose cost is over what is left, in money", async () => {
    const { gate } = makeGate(moneyPolicy(0.01));
    const e = await gate.run(bench(1), async () => "ran").catch((x: PolicyError) => x);
    expect((e as PolicyError).code).toBe("budget_exceeded");
    expect((e as PolicyError).message).toMatch(
      /costs ~0\.0125 USD, 0\.01 USD of 0\.01 USD per 3600 s window remain/,
    );
  });

  it("refuses a call on a kind without a price under a budget in money", async () => {
    const { gate } = makeGate(moneyPolicy(1));
    const e = await gate.run(bench(0.1, "cuda"), async () => "ran").catch((x: PolicyError) => x);
    expect((e as PolicyError).code).toBe("budget_exceeded");
    expect((e as PolicyError).message).toMatch(/cuda device, which has no price/);
  });

  it("leaves the estimate as it was without pricing", async () => {
    const { gate, audit } = makeGate({});
    await gate.run(bench(0.1), async () => "ran");
    expect((await audit.tail(2))[0].estimate).toEqual(est(0.1));
  });
});

describe("money beside device-seconds in the words a person reads", () => {
  const priced = { ...est(2), cost: costOf(PRICING, "cpu", 2) };
  const rule = { tool: "run_benchmark", assurance: "token" } as const;
  it("puts the cost in the approval question both eras ask (approvalPrompt)", () => {
    const p = approvalPrompt({ ...bench(2), estimate: priced }, rule as never, {}, priced);
    expect(p.message).toMatch(/\(~2 device-seconds \(~0\.025 USD\), /);
    // Without pricing, the words are as they were.
    const plain = approvalPrompt({ ...bench(2), estimate: est(2) }, rule as never, {}, est(2));
    expect(plain.message).toMatch(/\(~2 device-seconds, 976.6 KiB memory\)/);
  });
  it("puts it in the webhook's text", () => {
    const rec = {
      id: "apr_x",
      principal: "agent",
      tool: "run_benchmark",
      estimate: priced,
      expires_at: "2026-12-02T00:00:00Z",
      assurance: "token",
    };
    expect(webhookText("approval.requested", rec as never)).toMatch(/~2 device-s \(~0\.025 USD\)/);
  });
});
