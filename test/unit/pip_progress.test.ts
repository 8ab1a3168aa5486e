// The set-up's percentage while pip runs (server/setup/pip_progress.ts): lines as pip prints them
// name the step; while pip is silent (unpacking torch) time still moves it, never past the span.
import { describe, expect, it } from "vitest";
import { PipProgress } from "../../server/setup/pip_progress.js";

/** pip 23's output for a torch install, as the set-up reads it (--progress-bar off). */
const PIP_LINES = [
  "Looking in indexes: https://download.pytorch.org/whl/cpu, https://pypi.org/simple",
  "Collecting torch==2.13.0+cpu (from -r requirements.txt (line 2))",
  "Downloading https://download.pytorch.org/whl/cpu/torch-2.13.0%2Bcpu-cp311-linux_x86_64.whl (188.3 MB)",
  "Collecting transformers==4.57.1 (from -r requirements.txt (line 3))",
  "Downloading transformers-4.57.1-py3-none-any.whl (11.0 MB)",
  "Installing collected packages: mpmath, typing-extensions, sympy, torch, transformers",
];

describe("pip's progress", () => {
  it("names the step from pip's lines and moves while pip is silent, within its span", () => {
    let t = 0;
    const p = new PipProgress(5, 55, () => t);
    const seen: number[] = [];
    for (const l of PIP_LINES.slice(0, 3)) seen.push(p.line(l).percent);
    expect(p.state().step).toBe("downloading torch (188.3 MB)");
    // A long silent download: the percentage still moves.
    const before = p.state().percent;
    t += 60_000;
    expect(p.state().percent).toBeGreaterThan(before);
    for (const l of PIP_LINES.slice(3)) seen.push(p.line(l).percent);
    expect(p.state().step).toBe(
      "installing 5 packages (mpmath, typing-extensions, sympy, …), 0 s so far",
    );
    // The install prints nothing for 100 s and more: every 5 s the percentage is further on.
    let last = p.state().percent;
    for (let i = 0; i < 40; i++) {
      t += 5_000;
      const now = p.state();
      expect(now.percent).toBeGreaterThan(last);
      expect(now.percent).toBeLessThan(55);
      last = now.percent;
    }
    expect(p.state().step).toMatch(/, 200 s so far$/);
    expect(last).toBeGreaterThan(45); // most of the span within the first minutes
    // Never backwards, from the first line to the last tick.
    expect([...seen, last]).toEqual([...seen, last].slice().sort((a, b) => a - b));
    expect(seen[0]).toBeGreaterThanOrEqual(5);
  });
});
