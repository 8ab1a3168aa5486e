// Small statistics and formatting helpers shared by the bench modules.

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
