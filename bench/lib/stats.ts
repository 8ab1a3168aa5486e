// Small statistics and formatting helpers shared by the bench modules.
import { readFileSync } from "node:fs";

/** Nearest-rank percentile (p in 0..100) of unsorted samples; NaN for no samples. */
export function percentile(samples: readonly number[], p: number): number {
  if (samples.length === 0) return NaN;
  const s = [...samples].sort((a, b) => a - b);
  const rank = Math.ceil((p / 100) * s.length);
  return s[Math.min(s.length - 1, Math.max(0, rank - 1))];
}

export interface Summary {
  n: number;
  p50: number;
  p99: number;
  mean: number;
}

export function summarize(samples: readonly number[]): Summary {
  const mean = samples.reduce((a, b) => a + b, 0) / (samples.length || 1);
  return { n: samples.length, p50: percentile(samples, 50), p99: percentile(samples, 99), mean };
}

export function median(samples: readonly number[]): number {
  return percentile(samples, 50);
}

export const fmt = {
  ms: (x: number) => (Number.isFinite(x) ? `${x.toFixed(x < 10 ? 2 : 1)} ms` : "n/a"),
  s: (x: number) => (Number.isFinite(x) ? `${x.toFixed(2)} s` : "n/a"),
  x: (x: number) => (Number.isFinite(x) ? `${x.toFixed(3)}×` : "n/a"),
  mbps: (x: number) => (Number.isFinite(x) ? `${x.toFixed(0)} MB/s` : "n/a"),
  bytes: (x: number) =>
    x >= 1 << 20
      ? `${(x / (1 << 20)).toFixed(2)} MiB`
      : x >= 1024
        ? `${(x / 1024).toFixed(1)} KiB`
        : `${x} B`,
  pct: (x: number) =>
    Number.isFinite(x) ? `${x >= 0 ? "+" : ""}${(x * 100).toFixed(1)} %` : "n/a",
  rate: (x: number) => (Number.isFinite(x) ? `${x.toFixed(1)} req/s` : "n/a"),
};

/** Runs `fn` for `n` callers at once, each looping until `total` calls have been started. */
export async function withCallers(
  callers: number,
  total: number,
  fn: (i: number) => Promise<void>,
): Promise<void> {
  let next = 0;
  const loop = async () => {
    while (next < total) await fn(next++);
  };
  await Promise.all(Array.from({ length: callers }, loop));
}

/** Median absolute deviation from the median (unscaled), as the worker's bench/stats.py. */
export function mad(samples: readonly number[]): number {
  const m = median(samples);
  return median(samples.map((x) => Math.abs(x - m)));
}

/** Percentile-bootstrap 95 % interval of the median, from a seeded generator (the same samples
 * give the same interval), as the worker's bench/stats.py. */
export function medianCI(samples: readonly number[], seed = 0, resamples = 1000): [number, number] {
  if (samples.length < 2) return [samples[0] ?? NaN, samples[0] ?? NaN];
  let s = seed >>> 0;
  const next = () => (s = (s * 1664525 + 1013904223) >>> 0);
  const medians = Array.from({ length: resamples }, () =>
    median(Array.from({ length: samples.length }, () => samples[next() % samples.length])),
  );
  return [percentile(medians, 2.5), percentile(medians, 97.5)];
}

/** CPU time stolen by the hypervisor between two readings of /proc/stat (null off Linux). */
export function readCpuTimes(): number[] | null {
  try {
    const line = readFileSync("/proc/stat", "utf8").split("\n")[0];
    return line.trim().split(/\s+/).slice(1).map(Number);
  } catch {
    return null;
  }
}

export function stealPct(before: number[] | null, after: number[] | null): number | null {
  if (!before || !after) return null;
  const d = after.map((v, i) => v - (before[i] ?? 0));
  const total = d.reduce((a, b) => a + b, 0);
  return total > 0 ? (100 * (d[7] ?? 0)) / total : null;
}

/** The worker's verdict rule (bench/stability.py): stable when the interval of p50 is within
 * 10 % of p50, steal is at most 5 % and the 1-minute load average is at most the core count. */
export function verdict(
  samples: readonly number[],
  host: { loadavg1m: number; cpus: number; steal: number | null },
) {
  const p50 = median(samples);
  const ci = medianCI(samples);
  const ciPct = (100 * (ci[1] - ci[0])) / p50;
  const reasons: string[] = [];
  if (samples.length < 10) reasons.push(`only ${samples.length} samples`);
  else if (ciPct > 10) reasons.push(`CI of p50 wider than 10 % of p50 (${ciPct.toFixed(0)} %)`);
  if (host.steal !== null && host.steal > 5) reasons.push(`steal ${host.steal.toFixed(1)} %`);
  if (host.loadavg1m > host.cpus)
    reasons.push(`load above cores (${host.loadavg1m.toFixed(2)} on ${host.cpus} CPUs)`);
  return {
    p50,
    mad: mad(samples),
    ci,
    ciPct,
    stable: reasons.length === 0,
    reason: reasons.join("; "),
  };
}
