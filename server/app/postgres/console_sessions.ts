// The console's sessions in Postgres, shared by every replica: a session opened through one works
// through any other, and a sign-out anywhere ends it everywhere. Only the sha256 of the cookie's
// id is stored (server/app/console_sessions.ts says why, and derives the CSRF token from the id).
// Opening takes the principal's advisory lock, so the per-principal cap holds when two replicas
// sign the same operator in at once.
import {
  newSessionId,
  sessionKey,
  type ConsoleSessionRecord,
  type ConsoleSessions,
  type OpenedSession,
} from "../console_sessions.js";
import type { Principal } from "../../../policies/scopes.js";
import { inTransaction, type PgPool } from "../../stores/pg/pool.js";

/** Advisory lock namespace of a principal's console sessions. */
const OPEN_LOCK = 7805;

interface Row {
  id_sha256: string;
  principal: Principal;
  created_ms: string;
  last_seen_ms: string;
  ends_ms: string;
  credential: string | null;
}

const toRecord = (r: Row): ConsoleSessionRecord => ({
  key: r.id_sha256,
  principal: r.principal,
  created: Number(r.created_ms),
  lastSeen: Number(r.last_seen_ms),
  endsAt: Number(r.ends_ms),
  ...(r.credential ? { credential: r.credential } : {}),
});

export class PgConsoleSessions implements ConsoleSessions {
  constructor(private readonly pool: PgPool) {}

  open(
    s: { principal: Principal; endsAt: number; credential?: string; now: number },
    cap: number,
  ): Promise<OpenedSession> {
    const id = newSessionId();
    return inTransaction(this.pool, async (c) => {
      await c.query("SELECT pg_advisory_xact_lock(hashtextextended($1, $2))", [
        s.principal.id,
        OPEN_LOCK,
      ]);
      // Room for one more: the least recently used beyond cap - 1 are signed out.
      const out = await c.query(
        `DELETE FROM console_sessions WHERE id_sha256 IN (
           SELECT id_sha256 FROM console_sessions WHERE principal_id = $1
           ORDER BY last_seen_ms DESC OFFSET $2)
         RETURNING id_sha256`,
        [s.principal.id, Math.max(0, cap - 1)],
      );
      const r = await c.query(
        `INSERT INTO console_sessions (id_sha256, principal_id, principal, created_ms,
           last_seen_ms, ends_ms, credential)
         VALUES ($1, $2, $3, $4, $4, $5, $6) RETURNING *`,
        [
          sessionKey(id),
          s.principal.id,
          JSON.stringify(s.principal),
          s.now,
          s.endsAt,
          s.credential ?? null,
        ],
      );
      return {
        id,
        record: toRecord(r.rows[0] as Row),
        signedOut: (out.rows as { id_sha256: string }[]).map((x) => x.id_sha256),
      };
    });
  }

  async touch(id: string, now: number, idleMs: number) {
    const key = sessionKey(id);
    const r = await this.pool.query(
      `UPDATE console_sessions SET last_seen_ms = GREATEST(last_seen_ms, $2)
       WHERE id_sha256 = $1 AND $2 - last_seen_ms <= $3 AND $2 < ends_ms RETURNING *`,
      [key, now, idleMs],
    );
    if (r.rows[0]) return toRecord(r.rows[0] as Row);
    await this.end(key);
    return undefined;
  }

  async has(key: string) {
    const r = await this.pool.query("SELECT 1 FROM console_sessions WHERE id_sha256 = $1", [key]);
    return r.rows.length > 0;
  }

  async end(key: string) {
    await this.pool.query("DELETE FROM console_sessions WHERE id_sha256 = $1", [key]);
  }

  async sweep(now: number, idleMs: number) {
    const r = await this.pool.query(
      `DELETE FROM console_sessions WHERE $1 - last_seen_ms > $2 OR $1 >= ends_ms
       RETURNING id_sha256`,
      [now, idleMs],
    );
    return (r.rows as { id_sha256: string }[]).map((x) => x.id_sha256);
  }

  async count() {
    const r = await this.pool.query("SELECT COUNT(*) AS n FROM console_sessions");
    return Number(r.rows[0].n);
  }

  /** Nothing of its own to close: the pool is the caller's. */
  close(): void {}
}
