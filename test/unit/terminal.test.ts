// The one escape for everything the CLI prints (issue 23, item 2): caller-made text cannot drive
// the terminal or start a line of its own; escapes stay valid inside JSON.
import { describe, expect, it } from "vitest";
import { terminalField, terminalText } from "../../server/terminal.js";

const CONTROLS = [
  ..."\u0000\u0007\u0008\t\u000b\u000c\r\u001b\u007f\u0080\u0085\u009b\u009f",
  ..."\u061c\u200e\u200f\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069",
];

describe("terminal escapes", () => {
  it.each(CONTROLS.map((c) => [c.charCodeAt(0).toString(16)]))(
    "escapes U+%s as a visible \\uXXXX",
    (hex) => {
      const c = String.fromCharCode(parseInt(hex, 16));
      expect(terminalField(`a${c}b`)).toBe(`a\\u${hex.padStart(4, "0")}b`);
      expect(terminalText(`a${c}b`)).toBe(`a\\u${hex.padStart(4, "0")}b`);
    },
  );

  it("keeps the CLI's own line breaks in a block, never in a field", () => {
    expect(terminalText("one\ntwo")).toBe("one\ntwo");
    expect(terminalField("one\ntwo")).toBe("one\\u000atwo");
  });

  it("leaves printable text (accents, CJK, emoji) alone, and JSON stays JSON with the same value", () => {
    const s = "é 漢字 🙂 — ok";
    expect(terminalField(s)).toBe(s);
    const value = { reason: "x\u001b[2K\u202e\u2028\u0085y" };
    const out = terminalText(JSON.stringify(value));
    expect(out).not.toMatch(/[\u001b\u202e\u2028\u0085]/);
    expect(JSON.parse(out)).toEqual(value);
  });
});
