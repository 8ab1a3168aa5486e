// The console's passkey routes that run before any session (enrol/options, enrol, sign-in/options,
// sign-in), attacked by someone who holds nothing (issue 33): their refusals are failed
// authentications, counted by the one limiter and audited once per address and window, so a
// flood adds a bounded number of records instead of one each (the attack wrote 50,940 records
// for 50,000 requests); a wrong enrolment code is a guess like a wrong token. And a flood of
// sign-in options from the operator's own address does not evict the operator's pending sign-in.
import { request } from "node:http";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { HttpServerProc } from "../helpers/server.js";
import { auditRows, cleanupTemp, startLazyDemoServer } from "./helpers.js";

const FLOOD = 300;

/** One console API POST from the loopback address `from`; status and parsed answer. */
function post(url: string, from: string, api: string, body: unknown) {
  const u = new URL(url);
  return new Promise<{ status: number; json: any }>((resolve, reject) => {
    const req = request(
      {
        host: u.hostname,
        port: u.port,
        localAddress: from,
        path: `/console/api/${api}`,
        method: "POST",
        headers: { "content-type": "application/json" },
        agent: false,
      },
      (res) => {
        let raw = "";
        res.on("data", (d) => (raw += d));
        res.on("end", () => {
          let json: any = null;
          try {
            json = JSON.parse(raw);
          } catch {
            json = raw;
          }
          resolve({ status: res.statusCode ?? 0, json });
        });
      },
    );
    req.on("error", reject);
    req.end(JSON.stringify(body));
  });
}

/** A response shaped like a WebAuthn assertion (it verifies nothing: no enrolled key made it). */
const junkAssertion = {
  id: "bm90LWVucm9sbGVk",
  rawId: "bm90LWVucm9sbGVk",
  type: "public-key",
  clientExtensionResults: {},
  response: { authenticatorData: "AA", clientDataJSON: "AA", signature: "AA" },
};

describe("passkey routes before a session, attacked without a token", () => {
  let server: HttpServerProc;
  let dataDir: string;
  beforeAll(async () => {
    ({ server, dataDir } = await startLazyDemoServer());
  });
  afterAll(async () => {
    await server?.stop();
    cleanupTemp();
  });

  it("keeps a pending sign-in of the operator through 40 sign-in options from the same address", async () => {
    const from = "127.0.0.31";
    const mine = await post(server.url, from, "passkeys/sign-in/options", {});
    expect(mine.status).toBe(200);
    for (let i = 0; i < 40; i++)
      expect((await post(server.url, from, "passkeys/sign-in/options", {})).status).toBe(200);
    // The operator's challenge is still live: the answer is verified (and refused only because
    // no enrolled passkey made it), not "unknown".
    const answer = await post(server.url, from, "passkeys/sign-in", {
      nonce: mine.json.nonce,
      response: junkAssertion,
    });
    expect(answer.json?.error?.code, JSON.stringify(answer.json)).toBe("passkey_refused");
    expect(answer.json.error.message).not.toMatch(/unknown or already used/);
    // Still single-use.
    const again = await post(server.url, from, "passkeys/sign-in", {
      nonce: mine.json.nonce,
      response: junkAssertion,
    });
    expect(again.json?.error?.message).toMatch(/unknown or already used/);
  });

  it(`adds a bounded number of audit records for ${FLOOD} refused requests`, async () => {
    const from = "127.0.0.32";
    const before = auditRows(dataDir).length;
    const statuses = new Map<number, number>();
    for (let i = 0; i < FLOOD; i++) {
      const code = `wrong-code-${i}`;
      const [api, body] = [
        ["passkeys/enrol/options", { code }],
        ["passkeys/enrol", { code, nonce: `n${i}`, response: junkAssertion }],
        ["passkeys/sign-in", { nonce: `n${i}`, response: junkAssertion }],
      ][i % 3] as [string, unknown];
      const r = await post(server.url, from, api, body);
      statuses.set(r.status, (statuses.get(r.status) ?? 0) + 1);
    }
    // Every one refused: 403 while the free failures last, then 429 (the limiter's back-off).
    expect([...statuses.keys()].sort(), JSON.stringify([...statuses])).toEqual([403, 429]);
    expect(statuses.get(429)!).toBeGreaterThan(FLOOD / 2);
    // The limiter reports its window at close at the latest.
    await server.stop();
    const added = auditRows(dataDir).slice(before);
    expect(added.length, JSON.stringify(added.slice(0, 5))).toBeLessThanOrEqual(5);
    const report = added.find((r) => r.tool === "authenticate" && r.args?.address === from);
    expect(report, JSON.stringify(added)).toBeDefined();
    expect(report!.reason).toMatch(/failed authentication/);
    expect(report!.args.surfaces).toEqual(
      expect.arrayContaining([
        "/console/api/passkeys/enrol/options",
        "/console/api/passkeys/enrol",
        "/console/api/passkeys/sign-in",
      ]),
    );
    expect(added.some((r) => r.tool === "passkeys")).toBe(false);
  });
});
