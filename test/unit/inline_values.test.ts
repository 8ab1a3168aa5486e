// Inline float outputs are written with the fewest digits that read back as the same value of
// the tensor's dtype: an agent pays about half the bytes for an embedding and loses nothing.
import { describe, expect, it } from "vitest";
import { encodeValues, inlineValues } from "../../tools/support/tensors.js";
import type { TensorDtype } from "../../runtime/types.js";

function tensor(dtype: TensorDtype, values: number[]) {
  return { dtype, shape: [values.length], data: encodeValues(dtype, values) };
}

/** Deterministic values of an embedding's range. */
function values(n: number): number[] {
  let s = 7;
  return Array.from(
    { length: n },
    () => ((s = (s * 1103515245 + 12345) % 2 ** 31) / 2 ** 31 - 0.5) / 4,
  );
}

describe("inlineValues", () => {
  it.each(["float32", "float16", "bfloat16"] as const)(
    "%s: every value reads back as the tensor's own value, in fewer bytes",
    (dtype) => {
      const t = tensor(dtype, values(384));
      const short = inlineValues(t);
      // Encoding the short values again gives the very same bytes.
      expect(encodeValues(dtype, short).equals(t.data)).toBe(true);
      const wide = JSON.stringify(Array.from({ length: 384 }, (_, i) => readBack(t, i)));
      expect(JSON.stringify(short).length).toBeLessThan(wide.length * 0.75);
    },
  );

  it("keeps integers, zeros and non-finite values as they are", () => {
    expect(inlineValues(tensor("float32", [0, 1, -2, 0.5]))).toEqual([0, 1, -2, 0.5]);
    expect(inlineValues(tensor("int32", [3, -4]))).toEqual([3, -4]);
    expect(inlineValues(tensor("float32", [Infinity]))).toEqual([Infinity]);
  });
});

/** The value as the tensor holds it, widened to a double (what the answer carried before). */
function readBack(t: { dtype: TensorDtype; data: Buffer }, i: number): number {
  if (t.dtype === "float32") return t.data.readFloatLE(i * 4);
  const h = t.data.readUInt16LE(i * 2);
  if (t.dtype === "bfloat16") return new Float32Array(new Uint32Array([h << 16]).buffer)[0];
  // float16: sign, 5-bit exponent, 10-bit mantissa
  const s = h & 0x8000 ? -1 : 1;
  const e = (h >> 10) & 0x1f;
  const m = h & 0x3ff;
  return e === 0 ? s * 2 ** -14 * (m / 1024) : s * (1 + m / 1024) * 2 ** (e - 15);
}
