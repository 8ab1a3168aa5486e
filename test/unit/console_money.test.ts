// The console's approval page shows an estimate's cost beside its device-seconds when the server
// prices device time (policy.pricing), and exactly what it showed before when it does not.
import { describe, expect, it } from "vitest";
import { estimateText } from "../../console/src/ui.js";

const estimate = { device_seconds: 2, memory_bytes: 2 ** 20, weight_bytes: 0, compile_s: 0 };

describe("the console's estimate text", () => {
  it("shows the cost with pricing set", () => {
    const cost = { currency: "EUR", amount: "0.025", amount_micros: 25_000, device_kind: "cpu" };
    expect(estimateText({ ...estimate, cost })).toBe(
      "2 device-s · ~0.025 EUR · 1.0 MiB memory · no compile",
    );
  });
  it("is unchanged without it", () => {
    expect(estimateText(estimate)).toBe("2 device-s · 1.0 MiB memory · no compile");
  });
});
