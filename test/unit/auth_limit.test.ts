// The limiter for failed authentication (server/auth_limit.ts) under a clock the test drives:
// reservations made on arrival bound concurrent evaluations, back-off doubles and is capped (so a
// correct credential waits at most the cap), success never resets the count, the server-wide
// budget holds across addresses, and the report stays bounded however many addresses guess.
import { afterEach, describe, expect, it } from "vitest";
import {
  AuthLimiter,
  addressKey,
  type Admission,
  type AuthLimitReport,
  type AuthTicket,
} from "../../server/auth_limit.js";

let now = 1_000_000;
const clock = () => now;
const made: AuthLimiter[] = [];
function limiter(over: Partial<ConstructorParameters<typeof AuthLimiter>[0]> = {}) {
  const l = new AuthLimiter({ free: 5, maxDelayMs: 8_000, perMinute: 1000, clock, ...over });
  made.push(l);
  return l;
}
afterEach(() => {
  for (const l of made.splice(0)) l.close();
});

async function take(l: AuthLimiter, addr = "10.0.0.1"): Promise<AuthTicket> {
  const a = await await l.admit(addr, "/mcp");
  if (!a.ok) throw new Error(`refused: ${a.why}`);
  return a.ticket;
}

describe("AuthLimiter", async () => {
  it("counts an evaluation in progress as a failure: of 50 at once, only the free ones are evaluated", async () => {
    const l = limiter();
    const answers: (Admission | null)[] = Array(50).fill(null);
    const all = Array.from({ length: 50 }, (_, i) =>
      l.admit("10.0.0.1", "/console").then((a) => (answers[i] = a)),
    );
    await new Promise((r) => setImmediate(r));
    const admitted = answers.filter((a) => a?.ok);
    // Five reserved; the others wait (not refused yet: a client's parallel requests queue).
    expect(admitted).toHaveLength(5);
    expect(answers.filter((a) => a === null)).toHaveLength(45);
    // The five fail: the back-off starts, and every waiter is refused, none evaluated.
    for (const a of admitted) if (a?.ok) a.ticket.settle(false);
    await Promise.all(all);
    expect(answers.filter((a) => a?.ok)).toHaveLength(5);
    expect(answers.filter((a) => a && !a.ok)).toHaveLength(45);
  });

  it("queues parallel requests of a client whose credentials are good, and refuses past 64 waiting", async () => {
    const l = limiter();
    const got: Admission[] = [];
    const all = Array.from({ length: 80 }, () =>
      l.admit("10.0.0.1", "/mcp").then((a) => {
        got.push(a);
        if (a.ok) a.ticket.settle(true);
      }),
    );
    await Promise.all(all);
    // 5 evaluated at once, 64 waited and were evaluated in turn, 11 found the queue full.
    expect(got.filter((a) => a.ok)).toHaveLength(69);
    expect(got.filter((a) => !a.ok)).toHaveLength(11);
  });

  it("backs off exponentially after the free failures, one evaluation at a time, capped", async () => {
    const l = limiter();
    for (let i = 0; i < 5; i++) (await take(l)).settle(false);
    const first = await l.admit("10.0.0.1", "/mcp");
    expect(first).toMatchObject({ ok: false, retryAfterS: 1 });
    const waits: number[] = [];
    for (let i = 0; i < 6; i++) {
      now += l.delayMs(5 + i);
      const t = await take(l);
      // While this one is evaluated, another from the same address is refused.
      expect((await l.admit("10.0.0.1", "/mcp")).ok).toBe(false);
      t.settle(false);
      const refused = await l.admit("10.0.0.1", "/mcp");
      waits.push(refused.ok ? 0 : refused.retryAfterS);
    }
    expect(waits).toEqual([2, 4, 8, 8, 8, 8]);
    // Another address is not affected.
    expect((await l.admit("10.0.0.2", "/mcp")).ok).toBe(true);
  });

  it("lets a correct credential in after at most the cap, and a success does not reset the count", async () => {
    const l = limiter();
    for (let i = 0; i < 20; i++) {
      const a = await l.admit("10.0.0.1", "/console");
      if (a.ok) a.ticket.settle(false);
      now += 100;
    }
    const refused = await l.admit("10.0.0.1", "/console");
    expect(refused.ok).toBe(false);
    if (!refused.ok) expect(refused.retryAfterS).toBeLessThanOrEqual(8);
    now += 8_000;
    (await take(l)).settle(true); // the operator
    // The operator's success bought the attacker nothing: after its next failure it waits again
    // (a reset would have given it five more free guesses).
    (await take(l)).settle(false);
    expect(await l.admit("10.0.0.1", "/console")).toMatchObject({ ok: false, retryAfterS: 4 });
  });

  it("forgets an address after a quiet quarter of an hour", async () => {
    const l = limiter();
    for (let i = 0; i < 5; i++) (await take(l)).settle(false);
    expect((await l.admit("10.0.0.1", "/mcp")).ok).toBe(false);
    now += 15 * 60_000 + 1;
    for (let i = 0; i < 5; i++) (await take(l)).settle(false);
  });

  it("holds a server-wide budget across addresses; successes refund it", async () => {
    const l = limiter({ perMinute: 20 });
    let failed = 0;
    for (let i = 0; i < 100; i++) {
      const a = await l.admit(`10.1.${i}.1`, "/mcp");
      if (a.ok) {
        a.ticket.settle(false);
        failed++;
      } else expect(a.why).toMatch(/this server/);
    }
    expect(failed).toBe(20);
    now += 3_000; // one token back
    const a = await l.admit("10.9.9.9", "/mcp");
    expect(a.ok).toBe(true);
    if (a.ok) a.ticket.settle(true);
    expect((await l.admit("10.9.9.8", "/mcp")).ok).toBe(true);
  });

  it("limits IPv6 by /64 and IPv4-mapped addresses as IPv4", async () => {
    expect(addressKey("2001:db8:1:2:aaaa::1")).toBe("2001:db8:1:2::/64");
    expect(addressKey("2001:db8:1:2::ffff")).toBe("2001:db8:1:2::/64");
    expect(addressKey("::1")).toBe("0:0:0:0::/64");
    expect(addressKey("::ffff:127.0.0.1")).toBe("127.0.0.1");
    const l = limiter();
    for (let i = 0; i < 5; i++) (await take(l, `2001:db8:1:2::${i + 1}`)).settle(false);
    expect((await l.admit("2001:db8:1:2:ffff::9", "/mcp")).ok).toBe(false);
  });

  it("reports once per address and window, at most maxReports lines plus one folded line", async () => {
    const lines: AuthLimitReport[][] = [];
    const l = limiter({ report: (r) => lines.push(r), maxReports: 3, perMinute: 100_000 });
    for (let a = 0; a < 40; a++)
      for (let i = 0; i < 30; i++) {
        const x = await l.admit(`10.2.${a}.1`, a % 2 ? "/mcp" : "/console");
        if (x.ok) x.ticket.settle(false);
      }
    l.flush();
    expect(lines).toHaveLength(1);
    expect(lines[0]).toHaveLength(4);
    const folded = lines[0][3];
    expect(folded).toMatchObject({ address: null, addresses: 37 });
    expect(lines[0].reduce((n, r) => n + r.failed + r.refused, 0)).toBe(40 * 30);
    expect(folded.surfaces).toEqual(["/console", "/mcp"]);
    l.flush(); // nothing new: nothing reported
    expect(lines).toHaveLength(1);
  });

  it("counts failures checked without a reservation (fail), into the same back-off and report", async () => {
    const reports: AuthLimitReport[][] = [];
    const l = limiter({ report: (r) => reports.push(r) });
    for (let i = 0; i < 4; i++)
      expect(l.fail("10.0.0.7", "/console/api/passkeys/enrol")).toBeNull();
    // The fifth failure starts the back-off: the caller answers 429 with this Retry-After.
    expect(l.fail("10.0.0.7", "/console/api/passkeys/sign-in")).toEqual({ retryAfterS: 1 });
    // An unknown credential from that address now waits like any other guess.
    expect((await l.admit("10.0.0.7", "/mcp")).ok).toBe(false);
    l.flush();
    expect(reports.at(-1)).toEqual([
      {
        address: "10.0.0.7",
        addresses: 1,
        failed: 5,
        refused: 1,
        withoutCredential: 0,
        surfaces: ["/console/api/passkeys/enrol", "/console/api/passkeys/sign-in", "/mcp"],
      },
    ]);
  });
  it("charges a failure to the server-wide budget only outside its address's back-off", async () => {
    const l = limiter({ perMinute: 20 });
    // The free failures are charged (5 of 20)...
    for (let i = 0; i < 5; i++) l.fail("10.0.0.8", "/console/api/passkeys/sign-in");
    // ...then 100 more that were evaluated concurrently and ended during the back-off are not.
    for (let i = 0; i < 100; i++) l.fail("10.0.0.8", "/console/api/passkeys/sign-in");
    // So the budget still admits unknown credentials from everyone else.
    for (let i = 0; i < 15; i++) {
      const a = await l.admit(`10.3.${i}.1`, "/mcp");
      expect(a.ok, `address ${i}: ${a.ok ? "" : a.why}`).toBe(true);
      if (a.ok) a.ticket.settle(false);
    }
    expect(await l.admit("10.3.99.1", "/mcp")).toMatchObject({ ok: false, why: /this server/ });
  });

  it("check() refuses an address in back-off before its evaluation, counted and not charged", async () => {
    const reports: AuthLimitReport[][] = [];
    const l = limiter({ perMinute: 6, report: (r) => reports.push(r) });
    expect(l.check("10.0.0.9", "/console/api/passkeys/enrol")).toBeNull();
    for (let i = 0; i < 5; i++) l.fail("10.0.0.9", "/console/api/passkeys/enrol");
    for (let i = 0; i < 1000; i++)
      expect(l.check("10.0.0.9", "/console/api/passkeys/sign-in")).toMatchObject({
        retryAfterS: 1,
        why: /from this address/,
      });
    // The five failures took 5 of the 6 in the budget; the refusals took none.
    const other = await l.admit("10.4.0.1", "/mcp");
    expect(other.ok).toBe(true);
    // The back-off over, the next one may be evaluated.
    now += l.delayMs(5);
    expect(l.check("10.0.0.9", "/console/api/passkeys/sign-in")).toBeNull();
    l.flush();
    expect(reports.at(-1)).toEqual([
      {
        address: "10.0.0.9",
        addresses: 1,
        failed: 5,
        refused: 1000,
        withoutCredential: 0,
        surfaces: ["/console/api/passkeys/enrol", "/console/api/passkeys/sign-in"],
      },
    ]);
    if (other.ok) other.ticket.settle(true);
  });

  it("counts requests without a credential into the window's report: the first logged at once, bounded", async () => {
    const reports: AuthLimitReport[][] = [];
    const l = limiter({ perMinute: 1, maxReports: 3, report: (r) => reports.push(r) });
    // One address's flood: only its first is for the caller to log; nothing is a failure.
    const atOnce = Array.from({ length: 500 }, (_, i) =>
      l.noCredential("10.5.0.1", i % 2 ? "/mcp" : "/console"),
    );
    expect(atOnce.filter(Boolean)).toHaveLength(1);
    expect(atOnce[0]).toBe(true);
    // Many addresses: at most maxReports logged at once in a window.
    const others = Array.from({ length: 50 }, (_, a) => l.noCredential(`10.6.${a}.1`, "/mcp"));
    expect(others.filter(Boolean)).toHaveLength(2);
    l.flush();
    const lines = reports.at(-1)!;
    expect(lines).toHaveLength(4); // maxReports addresses, then one folded line
    expect(lines[0]).toEqual({
      address: "10.5.0.1",
      addresses: 1,
      failed: 0,
      refused: 0,
      withoutCredential: 500,
      surfaces: ["/console", "/mcp"],
    });
    // The two logged at once with nothing after them are not reported again: 48 of 50 remain.
    expect(lines.slice(1).reduce((n, r) => n + r.addresses, 0)).toBe(48);
    expect(lines.slice(1).reduce((n, r) => n + r.withoutCredential, 0)).toBe(48);
    // Neither back-off nor the server-wide budget (1 a minute) was touched.
    expect(l.check("10.5.0.1", "/console/api/passkeys/sign-in")).toBeNull();
    const other = await l.admit("10.7.0.1", "/mcp");
    expect(other.ok).toBe(true);
    if (other.ok) other.ticket.settle(true);
    // A new window: the address's first is logged at once again, a quiet window reports nothing.
    expect(l.noCredential("10.5.0.1", "/mcp")).toBe(true);
    expect(l.noCredential("10.5.0.1", "/mcp")).toBe(false);
    l.flush();
    expect(reports.at(-1)).toEqual([expect.objectContaining({ withoutCredential: 2 })]);
    l.flush();
    expect(reports).toHaveLength(2);
  });
});
