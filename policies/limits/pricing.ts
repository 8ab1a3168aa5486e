// Device time in money, pure. A price is kept as whole nano-units of the currency per chip-hour
// (a price per chip-hour or per device-second to 9 decimal places is kept exactly); an amount is
// whole micro-units (1e-6 of the currency), so sums of charges are exact integers, and a
// duration is whole milliseconds (the gate's clock). The one rounding: a cost is rounded half up
// to the micro-unit, in BigInt (price × milliseconds passes 2^53 for long calls on dear devices).

/** The `pricing` config section, as parsed (policies/config.ts has its schema). */
export interface PricingConfig {
  /** An ISO 4217 code, e.g. "USD". */
  currency: string;
  /** Price per device-second, by device kind (cpu, cuda, tpu, xla). */
  per_device_second: Record<string, number>;
  /** Price per chip-hour, by device kind; a kind is priced in one of the two, never both. */
  per_chip_hour: Record<string, number>;
}

/** Micro-units in one unit of the currency. */
export const MICROS = 1_000_000;
const NANOS_PER_MICRO = 1000n;
const MS_PER_HOUR = 3_600_000n;

/**
 * The price of one chip-hour of `kind`, nano-units; undefined when the kind has no price. A
 * price per device-second is 3600 × that per hour: exact in nano-units to 9 decimal places.
 */
export function nanosPerChipHour(p: PricingConfig, kind: string): bigint | undefined {
  const perHour = p.per_chip_hour[kind];
  if (perHour !== undefined) return BigInt(Math.round(perHour * 1e9));
  const perSecond = p.per_device_second[kind];
  if (perSecond !== undefined) return BigInt(Math.round(perSecond * 1e9)) * 3600n;
  return undefined;
}

/** What `seconds` of device time cost at `nanosPerHour`: micro-units, rounded half up. */
export function costMicros(seconds: number, nanosPerHour: bigint): number {
  const ms = BigInt(Math.max(0, Math.round(seconds * 1000)));
  const denom = MS_PER_HOUR * NANOS_PER_MICRO;
  return Number((nanosPerHour * ms * 2n + denom) / (2n * denom));
}

/** Micro-units per second of device time at `nanosPerHour` (the meter's rate; not rounded). */
export function microsPerSecond(nanosPerHour: bigint): number {
  return Number(nanosPerHour) / 3600 / 1000;
}

/** An amount of currency in micro-units from a configured number (a budget): rounded half up. */
export function toMicros(amount: number): number {
  return Math.round(amount * MICROS);
}

/**
 * Micro-units as a decimal string, with at least 2 and at most 6 decimals ("12.50", "0.001167"),
 * exact: integer arithmetic on the digits, no float formatting.
 */
export function formatAmount(micros: number): string {
  const neg = micros < 0;
  const m = Math.abs(Math.round(micros));
  const whole = Math.floor(m / MICROS);
  const frac = String(m % MICROS)
    .padStart(6, "0")
    .replace(/0+$/, "")
    .padEnd(2, "0");
  return `${neg ? "-" : ""}${whole}.${frac}`;
}

/** "0.0117 USD". */
export function formatMoney(micros: number, currency: string): string {
  return `${formatAmount(micros)} ${currency}`;
}

/** Nano-units per chip-hour as a decimal string (up to 9 decimals, at least 2). */
export function formatRate(nanosPerHour: bigint): string {
  const whole = nanosPerHour / 1_000_000_000n;
  const frac = String(nanosPerHour % 1_000_000_000n)
    .padStart(9, "0")
    .replace(/0+$/, "")
    .padEnd(2, "0");
  return `${whole}.${frac}`;
}

/** An estimate's cost, as estimates, approvals, webhooks and the console show it. */
export interface MoneyCost {
  currency: string;
  /** The amount as a decimal string ("0.0117"). */
  amount: string;
  amount_micros: number;
  /** The device kind priced (cpu, cuda, tpu). */
  device_kind: string;
  /** The kind's price per chip-hour, a decimal string. */
  price_per_chip_hour: string;
}

/** The cost of `seconds` on `kind`; undefined when the kind has no price. */
export function costOf(p: PricingConfig, kind: string, seconds: number): MoneyCost | undefined {
  const rate = nanosPerChipHour(p, kind);
  if (rate === undefined) return undefined;
  const micros = costMicros(seconds, rate);
  return {
    currency: p.currency,
    amount: formatAmount(micros),
    amount_micros: micros,
    device_kind: kind,
    price_per_chip_hour: formatRate(rate),
  };
}

/** " (~0.0117 USD)" after an estimate's device-seconds; "" without a cost (no `pricing`). */
export function costNote(e: { cost?: MoneyCost } | null | undefined): string {
  return e?.cost ? ` (~${e.cost.amount} ${e.cost.currency})` : "";
}

/** A benchmark configuration as reportCost reads it. */
interface MeasuredConfig {
  measured_s?: unknown;
  throughput_items_per_s?: unknown;
  error?: unknown;
}

/** A benchmark report's device time in money: in all, and per configuration (run_benchmark). */
export interface ReportCost {
  currency: string;
  device_kind: string;
  price_per_chip_hour: string;
  /** The configurations' measured device time (measured_s) in money. */
  measured: string;
  measured_s: number;
  /** Per configuration, in order (null for one that failed): its measured time, and 1000 items. */
  configs: ({ measured: string; per_1k_items: string | null } | null)[];
}

/**
 * What a benchmark's measured windows cost on `kind`, and what 1000 items cost at each
 * configuration's throughput (rounded to the micro-unit from the rate, not exact: a throughput
 * is a float). Undefined when the kind has no price.
 */
export function reportCost(
  p: PricingConfig,
  kind: string,
  configs: readonly MeasuredConfig[],
): ReportCost | undefined {
  const rate = nanosPerChipHour(p, kind);
  if (rate === undefined) return undefined;
  let totalMicros = 0;
  let totalS = 0;
  const rows = configs.map((c) => {
    const s = typeof c.measured_s === "number" && c.measured_s > 0 ? c.measured_s : undefined;
    if (c.error || s === undefined) return null;
    const micros = costMicros(s, rate);
    totalMicros += micros;
    totalS += s;
    const tput = c.throughput_items_per_s;
    return {
      measured: formatAmount(micros),
      per_1k_items:
        typeof tput === "number" && tput > 0
          ? formatAmount(Math.round((microsPerSecond(rate) * 1000) / tput))
          : null,
    };
  });
  return {
    currency: p.currency,
    device_kind: kind,
    price_per_chip_hour: formatRate(rate),
    measured: formatAmount(totalMicros),
    measured_s: Math.round(totalS * 1e6) / 1e6,
    configs: rows,
  };
}
