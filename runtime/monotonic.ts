// The one monotonic clock of call traces: CLOCK_MONOTONIC in µs on Linux, the clock the worker
// stamps with (time.monotonic_ns), so the server's and the worker's stamps share a timeline.

export function monotonicUs(): number {
  return Number(process.hrtime.bigint() / 1000n);
}
