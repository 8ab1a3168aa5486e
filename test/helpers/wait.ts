// Polls until a check answers a value: the one wait the suites share, its deadline given by the
// caller (already scaled with the machine, test/helpers/calibrate.ts) and its poll interval.
export async function waitFor<T>(
  what: string,
  fn: () => T | undefined | Promise<T | undefined>,
  deadlineMs: number,
  everyMs = 100,
): Promise<T> {
  const until = Date.now() + deadlineMs;
  for (;;) {
    const v = await fn();
    if (v !== undefined) return v;
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}
