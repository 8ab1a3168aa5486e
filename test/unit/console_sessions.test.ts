// The console's session store in memory (the default): what the console did with its own map
// before the port, so SQLite deployments behave as they always did. The Postgres store keeps the
// same contract across replicas (test/postgres/policy_stores.test.ts).
import { describe, expect, it } from "vitest";
import { csrfOf, MemoryConsoleSessions, sessionKey } from "../../server/app/console_sessions.js";
import type { Principal } from "../../policies/scopes.js";

const op: Principal = { id: "ops", scopes: ["approvals:grant"], via: "token" };
const IDLE = 30 * 60_000;

describe("MemoryConsoleSessions", () => {
  it("keys a session by its id's hash and serves it until idle or past its end", async () => {
    const s = new MemoryConsoleSessions();
    const now = 1_000_000;
    const a = await s.open({ principal: op, endsAt: now + 3_600_000, now }, 5);
    expect(a.record.key).toBe(sessionKey(a.id));
    expect(a.record.key).not.toBe(a.id);
    expect(await s.touch(a.id, now + IDLE, IDLE)).toMatchObject({ lastSeen: now + IDLE });
    expect(await s.touch(a.id, now + 2 * IDLE + 1, IDLE)).toBeUndefined();
    expect(await s.has(a.record.key)).toBe(false);
    const b = await s.open({ principal: op, endsAt: now + 10, now }, 5);
    expect(await s.sweep(now + 10, IDLE)).toEqual([b.record.key]);
    expect(await s.count()).toBe(0);
    expect(await s.touch("never-issued", now, IDLE)).toBeUndefined();
  });

  it("holds at most the cap per principal: one more signs out the least recently used", async () => {
    const s = new MemoryConsoleSessions();
    const now = 1_000_000;
    const one = await s.open({ principal: op, endsAt: now + 3_600_000, now }, 2);
    const two = await s.open({ principal: op, endsAt: now + 3_600_000, now: now + 1 }, 2);
    await s.touch(one.id, now + 2, IDLE);
    const three = await s.open({ principal: op, endsAt: now + 3_600_000, now: now + 3 }, 2);
    expect(three.signedOut).toEqual([two.record.key]);
    const other = await s.open(
      { principal: { ...op, id: "other" }, endsAt: now + 3_600_000, now },
      2,
    );
    expect(other.signedOut).toEqual([]);
    expect(await s.count()).toBe(3);
  });

  it("derives a CSRF token per session that is neither the id nor its key", () => {
    const id = "some-session-id";
    expect(csrfOf(id)).toBe(csrfOf(id));
    expect(csrfOf(id)).not.toBe(csrfOf("another-id"));
    expect(csrfOf(id)).not.toContain(id);
    expect(csrfOf(id)).not.toBe(sessionKey(id));
  });
});
