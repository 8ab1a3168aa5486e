// The console's and the MCP App's report helpers (pure functions; the drawing is covered by the
// browser suite).
import { describe, expect, it } from "vitest";
import { compactJson, seriesOf } from "../../console/src/report_data.js";

describe("seriesOf", () => {
  it("groups successful configurations by dtype × mode × seq_len, sorted by batch", () => {
    const cfg = (batch: number, dtype: string, p50: number, extra: object = {}) => ({
      batch,
      dtype,
      mode: "eager",
      latency_ms: { p50, p90: p50 * 2, p99: p50 * 3 },
      throughput_items_per_s: batch * 10,
      ...extra,
    });
    const s = seriesOf({
      configs: [
        cfg(4, "float32", 4),
        cfg(1, "float32", 1),
        cfg(2, "bfloat16", 2, { seq_len: 16 }),
        cfg(8, "float32", 8, { error: { code: "out_of_memory", message: "x" } }),
        { batch: 16, dtype: "float32", mode: "eager", latency_ms: null },
      ],
    });
    expect([...s.keys()]).toEqual(["float32 eager", "bfloat16 eager seq 16"]);
    expect(s.get("float32 eager")!.map((p) => [p.batch, p.p50, p.p99, p.tput])).toEqual([
      [1, 1, 3, 10],
      [4, 4, 12, 40],
    ]);
    expect(seriesOf({}).size).toBe(0);
  });
});

describe("compactJson", () => {
  it("keeps arrays of plain values on one line and stays valid JSON", () => {
    const v = {
      model: "m",
      batch_sizes: [1, 2, 4],
      modes: ["eager", "compile"],
      texts: { redacted: true, count: 3 },
      nested: [[1, 2], [3]],
      empty: [],
    };
    const text = compactJson(v);
    expect(text).toContain('"batch_sizes": [1, 2, 4]');
    expect(text).toContain('"modes": ["eager", "compile"]');
    expect(JSON.parse(text)).toEqual(v);
  });
});
