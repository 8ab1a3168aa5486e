// Naming where a JSON text differs from the value it should hold (policies/json_diff.ts): keys
// written twice however they are spelt, strings that look like JSON, and the first differing
// field by path.
import { describe, expect, it } from "vitest";
import { duplicateKey, jsonDifference } from "../../policies/json_diff.js";

describe("duplicateKey", () => {
  it.each([
    ['{"a":1,"b":2}', null],
    ['{"a":1,"a":2}', "a"],
    ['{"a":1,"\\u0061":2}', "a"], // the same key, escaped
    ['{"x":{"a":1},"y":{"a":2}}', null], // one key in two objects
    ['{"x":[{"k":1,"k":2}]}', "x[0].k"],
    ['{"s":"{\\"a\\":1,\\"a\\":2}","t":"]}"}', null], // JSON inside a string is a string
    [' { "o" : { "p q" : 1 , "p q" : 2 } } ', 'o["p q"]'],
    ['{"\\u00e9":1,"é":2}', '["\\u00e9"]'], // printed as ASCII
    ["[1,2,[3,{}]]", null],
  ])("%s → %s", (text, dup) => {
    JSON.parse(text); // every case is valid JSON
    expect(duplicateKey(text)).toBe(dup);
  });
});

describe("jsonDifference", () => {
  it("names the first field that is unknown, missing or different", () => {
    const want = { a: 1, b: { c: "x", d: [1, 2] } };
    expect(jsonDifference({ a: 1, b: { c: "x", d: [1, 2] } }, want)).toBeNull();
    expect(jsonDifference({ a: 1, b: { c: "x", d: [1, 2], e: 0 } }, want)).toEqual({
      kind: "unknown",
      path: "b.e",
    });
    expect(jsonDifference({ a: 1, b: { d: [1, 2] } }, want)).toEqual({
      kind: "missing",
      path: "b.c",
    });
    expect(jsonDifference({ a: 1, b: { c: "x", d: [1, 3] } }, want)).toEqual({
      kind: "value",
      path: "b.d[1]",
      actual: 3,
      expected: 2,
    });
    expect(jsonDifference({ a: "1", b: want.b }, want)).toMatchObject({ kind: "value", path: "a" });
    expect(jsonDifference({ a: 1, b: [] }, want)).toMatchObject({ kind: "value", path: "b" });
  });
});
