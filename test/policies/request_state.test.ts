// The sealed requestState of the 2026-07-28 in-band approval: what the sealer accepts and why it
// refuses the rest (the binding to principal, call and approval is checked by the gate).
import { describe, expect, it } from "vitest";
import { RequestStateError, RequestStateSealer } from "../../policies/request_state.js";

const KEY = Buffer.alloc(32, 7);
const STATE = { p: "agent", t: "load_model", d: "abc", a: "apr_1" };

function refusal(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (e) {
    if (e instanceof RequestStateError) return e.why;
    throw e;
  }
  return undefined;
}

describe("RequestStateSealer", () => {
  it("opens what it sealed, with a fresh nonce each time", () => {
    const s = new RequestStateSealer(KEY, () => 1000);
    const a = s.seal(STATE, 60_000);
    const b = s.seal(STATE, 60_000);
    expect(a).not.toBe(b);
    expect(s.open(a)).toMatchObject({ ...STATE, e: 61_000 });
    expect(s.open(a).n).not.toBe(s.open(b).n);
  });

  it("refuses a state past its expiry (injected clock, no waiting)", () => {
    let now = 1000;
    const s = new RequestStateSealer(KEY, () => now);
    const w = s.seal(STATE, 5_000);
    now = 5_999;
    expect(s.open(w).a).toBe("apr_1");
    now = 6_000;
    expect(refusal(() => s.open(w))).toBe("expired");
  });

  it("refuses an altered payload, one sealed under another key, and junk", () => {
    const s = new RequestStateSealer(KEY, () => 0);
    const w = s.seal(STATE, 60_000);
    const [v, body, mac] = w.split(".");
    const payload = JSON.parse(Buffer.from(body, "base64url").toString("utf8"));
    const forged = Buffer.from(JSON.stringify({ ...payload, p: "other" })).toString("base64url");
    expect(refusal(() => s.open(`${v}.${forged}.${mac}`))).toBe("mac");
    const other = new RequestStateSealer(Buffer.alloc(32, 8), () => 0).seal(STATE, 60_000);
    expect(refusal(() => s.open(other))).toBe("mac");
    for (const junk of [undefined, 42, "", "x", "v1..", `${w}.extra`, `v2.${body}.${mac}`])
      expect(
        refusal(() => s.open(junk)),
        String(junk),
      ).toBe("malformed");
    expect(refusal(() => s.open("x".repeat(5000)))).toBe("malformed");
  });

  it("a restart with the same key still opens it; the key never shows in the state", () => {
    const w = new RequestStateSealer(KEY, () => 0).seal(STATE, 60_000);
    expect(new RequestStateSealer(KEY, () => 0).open(w).t).toBe("load_model");
    expect(w).not.toContain(KEY.toString("base64url"));
  });
});
