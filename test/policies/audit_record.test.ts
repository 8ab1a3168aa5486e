// The audit record's pure parts: what of a call's arguments is kept (redactArgs).
import { describe, expect, it } from "vitest";
import { redactArgs } from "../../policies/audit_record.js";

describe("redactArgs", () => {
  it("replaces texts and tensors with length and shape summaries", () => {
    const out = redactArgs(
      {
        model: "m",
        texts: ["hello", "secret text"],
        tensors: [{ dtype: "float32", shape: [2, 3], data: [1, 2, 3, 4, 5, 6] }],
        nested: { texts: "abc" },
      },
      ["texts", "tensors"],
    );
    expect(out).toEqual({
      model: "m",
      texts: { redacted: true, count: 2, total_chars: 16 },
      tensors: { redacted: true, count: 1, items: [{ dtype: "float32", shape: [2, 3] }] },
      nested: { texts: { redacted: true, chars: 3 } },
    });
    expect(JSON.stringify(out)).not.toContain("secret");
  });
});
