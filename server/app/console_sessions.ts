// The console's signed-in sessions, behind one interface (SHARED: with a shared store a session
// opened through one replica works through any other). The cookie carries a random id; the
// store keeps only its sha256, so whoever reads the store (a backup, a replica's database user)
// cannot sign in with what it finds. The CSRF token is derived from the id (an HMAC keyed by it),
// never stored: every replica that sees the cookie computes the same token, and one who holds
// only the store's rows cannot.
//
// MemoryConsoleSessions is today's behaviour (this process's map: a restart signs everyone out);
// postgres/console_sessions.ts is the shared one.
import { createHash, createHmac, randomBytes } from "node:crypto";
import type { Principal } from "../../policies/scopes.js";

export interface ConsoleSessionRecord {
  /** sha256 of the cookie's id, hex: the store's key. */
  key: string;
  principal: Principal;
  created: number;
  lastSeen: number;
  /** No later than this: a JWT's own expiry, or the maximum age after sign-in. */
  endsAt: number;
  /** The passkey the session was opened with; absent for a token session. */
  credential?: string;
}

export interface OpenedSession {
  /** The cookie's value: the only copy of the secret. */
  id: string;
  record: ConsoleSessionRecord;
  /** Keys of this principal's sessions signed out to keep it within the cap. */
  signedOut: string[];
}

/** The console's sessions (SHARED across replicas where the store is). */
export interface ConsoleSessions {
  /**
   * A new session for `principal`; its least recently used ones are signed out first so it
   * holds at most `cap` (http.console_sessions_per_principal), in one step.
   */
  open(
    s: { principal: Principal; endsAt: number; credential?: string; now: number },
    cap: number,
  ): Promise<OpenedSession>;
  /**
   * The session of a cookie's id, its last use set to `now`; undefined (and removed) when it is
   * unknown, idle for longer than `idleMs` or past its end.
   */
  touch(id: string, now: number, idleMs: number): Promise<ConsoleSessionRecord | undefined>;
  /** Whether the session of `key` still exists (a stream asks, so a sign-out elsewhere ends it). */
  has(key: string): Promise<boolean>;
  end(key: string): Promise<void>;
  /** Removes idle and ended sessions; their keys. */
  sweep(now: number, idleMs: number): Promise<string[]>;
  count(): Promise<number>;
  close(): void | Promise<void>;
}

/** The store's key of a cookie's id. */
export const sessionKey = (id: string) => createHash("sha256").update(id, "utf8").digest("hex");

/** The session's CSRF token: derived from its id, so it needs no storage and no replica differs. */
export const csrfOf = (id: string) =>
  createHmac("sha256", id).update("tpu-mcp console csrf v1").digest("base64url");

export const newSessionId = () => randomBytes(32).toString("base64url");

/** Idle for longer than `idleMs`, or past its end. */
export const isOver = (s: ConsoleSessionRecord, now: number, idleMs: number) =>
  now - s.lastSeen > idleMs || now >= s.endsAt;

/** This process's sessions, in memory (the default: a restart signs everyone out, as always). */
export class MemoryConsoleSessions implements ConsoleSessions {
  private readonly sessions = new Map<string, ConsoleSessionRecord>();

  async open(
    s: { principal: Principal; endsAt: number; credential?: string; now: number },
    cap: number,
  ): Promise<OpenedSession> {
    const own = [...this.sessions.values()]
      .filter((x) => x.principal.id === s.principal.id)
      .sort((a, b) => a.lastSeen - b.lastSeen);
    const signedOut = own.slice(0, Math.max(0, own.length - cap + 1)).map((x) => x.key);
    for (const k of signedOut) this.sessions.delete(k);
    const id = newSessionId();
    const record: ConsoleSessionRecord = {
      key: sessionKey(id),
      principal: s.principal,
      created: s.now,
      lastSeen: s.now,
      endsAt: s.endsAt,
      ...(s.credential ? { credential: s.credential } : {}),
    };
    this.sessions.set(record.key, record);
    return { id, record, signedOut };
  }

  async touch(id: string, now: number, idleMs: number) {
    const key = sessionKey(id);
    const s = this.sessions.get(key);
    if (!s) return undefined;
    if (isOver(s, now, idleMs)) {
      this.sessions.delete(key);
      return undefined;
    }
    s.lastSeen = now;
    return s;
  }

  async has(key: string) {
    return this.sessions.has(key);
  }

  async end(key: string) {
    this.sessions.delete(key);
  }

  async sweep(now: number, idleMs: number) {
    const gone = [...this.sessions.values()].filter((s) => isOver(s, now, idleMs));
    for (const s of gone) this.sessions.delete(s.key);
    return gone.map((s) => s.key);
  }

  async count() {
    return this.sessions.size;
  }

  close() {
    this.sessions.clear();
  }
}
