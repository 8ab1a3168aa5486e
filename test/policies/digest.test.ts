import { describe, expect, it } from "vitest";
import { argsDigest, canonicalJson } from "../../policies/digest.js";
import { PolicyError } from "../../policies/errors.js";

describe("canonical JSON", () => {
  it("sorts keys recursively", () => {
    expect(canonicalJson({ b: 1, a: { d: [1, { z: 1, y: 2 }], c: "x" } })).toBe(
      '{"a":{"c":"x","d":[1,{"y":2,"z":1}]},"b":1}',
    );
  });

  it("drops undefined object fields and normalises numbers", () => {
    expect(canonicalJson({ a: undefined, b: -0, c: 1.0, d: 1e21, e: 0.1 })).toBe(
      '{"b":0,"c":1,"d":1e+21,"e":0.1}',
    );
    expect(canonicalJson([undefined, 1])).toBe("[null,1]");
  });

  it.each([NaN, Infinity, -Infinity])("rejects %s with invalid_argument and the path", (bad) => {
    try {
      canonicalJson({ x: [1, { y: bad }] });
      expect.unreachable();
    } catch (e) {
      expect(e).toBeInstanceOf(PolicyError);
      expect((e as PolicyError).code).toBe("invalid_argument");
      expect((e as PolicyError).details.path).toBe("$.x[1].y");
    }
  });

  it("rejects cycles but accepts shared (non-cyclic) references", () => {
    const shared = { a: 1 };
    expect(canonicalJson({ x: shared, y: shared })).toBe('{"x":{"a":1},"y":{"a":1}}');
    const cyc: Record<string, unknown> = {};
    cyc.self = cyc;
    expect(() => canonicalJson(cyc)).toThrow(/cycle/);
  });
});

describe("argsDigest", () => {
  const args = { model: "tiny-gpt2", device: "cpu", texts: ["a", "b"], max_new_tokens: 8 };

  it("is the same whatever the key order", () => {
    const reordered = { max_new_tokens: 8, texts: ["a", "b"], device: "cpu", model: "tiny-gpt2" };
    expect(argsDigest("run_inference", args)).toBe(argsDigest("run_inference", reordered));
    expect(argsDigest("run_inference", args)).toMatch(/^[0-9a-f]{64}$/);
  });

  it("ignores the control fields approval_id and wait", () => {
    expect(argsDigest("run_inference", { ...args, approval_id: "apr_x", wait: false })).toBe(
      argsDigest("run_inference", args),
    );
  });

  it("changes with the tool, any argument, nested values or array order", () => {
    const d = argsDigest("run_inference", args);
    expect(argsDigest("run_benchmark", args)).not.toBe(d);
    expect(argsDigest("run_inference", { ...args, max_new_tokens: 9 })).not.toBe(d);
    expect(argsDigest("run_inference", { ...args, texts: ["b", "a"] })).not.toBe(d);
    expect(argsDigest("run_inference", { ...args, confirm: true })).not.toBe(d);
  });

  describe("tensor data (number arrays of 16+ values, digested by their float64 bytes)", () => {
    const data = Array.from({ length: 784 }, (_, i) => (i % 7) / 7);
    const call = (d: unknown[]) => ({
      model: "mnist-cnn",
      tensors: [{ dtype: "float32", shape: [1, 1, 28, 28], data: d }],
    });

    it("digests the same values alike, -0 as 0, and any changed value differently", () => {
      const d = argsDigest("run_inference", call(data));
      expect(argsDigest("run_inference", call([...data]))).toBe(d);
      const zeros = Array(32).fill(0);
      const negZeros = Array(32).fill(-0);
      expect(argsDigest("run_inference", call(negZeros))).toBe(
        argsDigest("run_inference", call(zeros)),
      );
      const changed = [...data];
      changed[500] += 1e-12;
      expect(argsDigest("run_inference", call(changed))).not.toBe(d);
      expect(argsDigest("run_inference", call(data.slice(1)))).not.toBe(d);
      expect(argsDigest("run_inference", call([...data.slice(1), data[0]]))).not.toBe(d);
    });

    it("refuses a non-finite value inside a long array, naming where", () => {
      const bad = [...data];
      bad[300] = Number.NaN;
      expect(() => argsDigest("run_inference", call(bad))).toThrow(/tensors\[0\]\.data\[300\]/);
    });

    it("cannot be imitated by a string argument", () => {
      const packed = argsDigest("run_inference", { x: Array(20).fill(1) });
      // Whatever a caller writes in a string is JSON-escaped; the mark holds a raw control character.
      for (const s of ["\u0001f64:20:", "f64:20"])
        expect(argsDigest("run_inference", { x: s })).not.toBe(packed);
      // Mixed or short arrays keep their JSON form, and differ from each other.
      expect(argsDigest("run_inference", { x: [1, "1"] })).not.toBe(
        argsDigest("run_inference", { x: [1, 1] }),
      );
    });
  });
});
