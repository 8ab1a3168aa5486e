// Operators' passkeys in Postgres, shared by every replica: a counter advanced through one refuses
// the replayed assertion on every other, and an enrolment code is used once wherever it is
// presented. The port is policies/passkeys/store.ts's; SqlitePasskeys (sqlite.ts beside it)
// keeps the same promises, and contract.ts holds the cases both pass. Each promise is one
// statement or one transaction:
// - the signature counter only moves forward: one conditional UPDATE (`WHERE counter < new`);
// - an enrolment code is used once: its UPDATE finds it unused and unexpired, in the
//   transaction that stores the credential, so a credential never exists without its code spent;
// - enrolments take one advisory lock, so "the first passkey anywhere is active" (the
//   bootstrap) and "one passkey per code" hold when two replicas enrol at once.
// Codes are stored as sha256 only: the database never holds a usable code.
import { createHash, randomBytes } from "node:crypto";
import { refused } from "../../../policies/passkeys/binding.js";
import type { Passkeys, StoredCredential } from "../../../policies/passkeys/store.js";
import { inTransaction, NOW_MS, type PgClient, type PgPool } from "../pg/pool.js";

/** Advisory lock of enrolments (one at a time, across replicas). */
const ENROL_LOCK = 7_803_000_001;

interface Row {
  id: string;
  operator: string;
  public_key: Buffer;
  counter: string;
  transports: string[];
  aaguid: string;
  rp_id: string;
  status: StoredCredential["status"];
  enrolled_by: string | null;
  created_ms: string;
  last_used_ms: string | null;
}

const iso = (ms: string | null) => (ms === null ? null : new Date(Number(ms)).toISOString());
const hashCode = (code: string) => createHash("sha256").update(code, "utf8").digest("hex");

function toCredential(r: Row): StoredCredential {
  return {
    id: r.id,
    operator: r.operator,
    public_key: new Uint8Array(r.public_key),
    counter: Number(r.counter),
    transports: r.transports,
    aaguid: r.aaguid,
    rp_id: r.rp_id,
    status: r.status,
    enrolled_by: r.enrolled_by,
    created_at: iso(r.created_ms)!,
    last_used_at: iso(r.last_used_ms),
  };
}

type Q = PgPool | PgClient;

export class PgPasskeys implements Passkeys {
  constructor(private readonly pool: PgPool) {}

  private async getOn(q: Q, id: string): Promise<StoredCredential | undefined> {
    const r = await q.query("SELECT * FROM passkey_credentials WHERE id = $1", [id]);
    return r.rows[0] ? toCredential(r.rows[0] as Row) : undefined;
  }

  get(id: string): Promise<StoredCredential | undefined> {
    return this.getOn(this.pool, id);
  }

  private async listOn(q: Q, operator?: string): Promise<StoredCredential[]> {
    const r =
      operator === undefined
        ? await q.query("SELECT * FROM passkey_credentials ORDER BY created_ms, id")
        : await q.query(
            "SELECT * FROM passkey_credentials WHERE operator = $1 ORDER BY created_ms, id",
            [operator],
          );
    return (r.rows as Row[]).map(toCredential);
  }

  list(operator?: string): Promise<StoredCredential[]> {
    return this.listOn(this.pool, operator);
  }

  private async activeOn(q: Q, operator?: string): Promise<number> {
    const r =
      operator === undefined
        ? await q.query("SELECT COUNT(*) AS n FROM passkey_credentials WHERE status = 'active'")
        : await q.query(
            "SELECT COUNT(*) AS n FROM passkey_credentials WHERE status = 'active' AND operator = $1",
            [operator],
          );
    return Number(r.rows[0].n);
  }

  /** Active credentials in all: with none, the first enrolment needs only a code. */
  activeCount(operator?: string): Promise<number> {
    return this.activeOn(this.pool, operator);
  }

  /** The operator's passkeys that are not removed (active or waiting). */
  private async liveOn(q: Q, operator: string): Promise<number> {
    const r = await q.query(
      "SELECT COUNT(*) AS n FROM passkey_credentials WHERE operator = $1 AND status <> 'removed'",
      [operator],
    );
    return Number(r.rows[0].n);
  }

  /**
   * A one-time code for `operator`'s first passkey (refused once the operator has any passkey);
   * a new code replaces the operator's unused one.
   */
  createEnrolmentCode(
    operator: string,
    ttlS: number,
  ): Promise<{ code: string; expires_at: string }> {
    const code = randomBytes(15).toString("base64url");
    return inTransaction(this.pool, async (c) => {
      await c.query("SELECT pg_advisory_xact_lock($1)", [ENROL_LOCK]);
      if ((await this.liveOn(c, operator)) > 0)
        throw refused(
          `${operator} already has a passkey; add another device from the console (signed in with that passkey) — a code from the command line cannot`,
          { operator },
        );
      await c.query("DELETE FROM passkey_enrolment_codes WHERE operator = $1 AND used_ms IS NULL", [
        operator,
      ]);
      const r = await c.query(
        `INSERT INTO passkey_enrolment_codes (code_sha256, operator, created_ms, expires_ms)
         VALUES ($1, $2, ${NOW_MS}, ${NOW_MS} + $3::bigint) RETURNING expires_ms`,
        [hashCode(code), operator, Math.round(ttlS * 1000)],
      );
      return { code, expires_at: iso(r.rows[0].expires_ms)! };
    });
  }

  /** Which operator a code is for, without using it (the registration options need the name). */
  async peekEnrolmentCode(code: string): Promise<string> {
    const r = await this.pool.query(
      `SELECT operator, used_ms, expires_ms <= ${NOW_MS} AS expired
       FROM passkey_enrolment_codes WHERE code_sha256 = $1`,
      [hashCode(code)],
    );
    const row = r.rows[0] as
      { operator: string; used_ms: string | null; expired: boolean } | undefined;
    throwIfUnusable(row);
    return row!.operator;
  }

  /**
   * Stores a newly registered credential. With a code: the code is spent by a conditional
   * UPDATE in the same transaction (a second use finds it used), and the credential is active
   * only when no active passkey exists anywhere (the bootstrap); otherwise it waits for an
   * approval by an existing passkey.
   */
  addCredential(
    cred: Omit<StoredCredential, "status" | "enrolled_by" | "created_at" | "last_used_at">,
    via: { code: string } | { session: string },
  ): Promise<StoredCredential> {
    return inTransaction(this.pool, async (c) => {
      await c.query("SELECT pg_advisory_xact_lock($1)", [ENROL_LOCK]);
      if ("code" in via) {
        const spent = await c.query(
          `UPDATE passkey_enrolment_codes SET used_ms = ${NOW_MS}
           WHERE code_sha256 = $1 AND used_ms IS NULL AND expires_ms > ${NOW_MS}
           RETURNING operator`,
          [hashCode(via.code)],
        );
        if (!spent.rows[0]) {
          const r = await c.query(
            `SELECT operator, used_ms, expires_ms <= ${NOW_MS} AS expired
             FROM passkey_enrolment_codes WHERE code_sha256 = $1`,
            [hashCode(via.code)],
          );
          throwIfUnusable(r.rows[0]);
          throw refused("this enrolment code was already used; codes are single-use");
        }
        if (spent.rows[0].operator !== cred.operator)
          throw refused("this enrolment code is for another operator");
        if ((await this.liveOn(c, cred.operator)) > 0)
          throw refused(`${cred.operator} already has a passkey; the code is void`);
      }
      if (await this.getOn(c, cred.id)) throw refused("this credential is already enrolled");
      const first = "code" in via && (await this.activeOn(c)) === 0;
      const r = await c.query(
        `INSERT INTO passkey_credentials (id, operator, public_key, counter, transports, aaguid,
           rp_id, status, enrolled_by, created_ms)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, ${NOW_MS}) RETURNING *`,
        [
          cred.id,
          cred.operator,
          Buffer.from(cred.public_key),
          cred.counter,
          JSON.stringify(cred.transports),
          cred.aaguid,
          cred.rp_id,
          first ? "active" : "pending",
          first ? "enrolment-code" : null,
        ],
      );
      return toCredential(r.rows[0] as Row);
    });
  }

  /** A waiting credential becomes active, approved by an assertion of `approver` (a credential id). */
  async activate(id: string, approver: string): Promise<StoredCredential> {
    const r = await this.pool.query(
      `UPDATE passkey_credentials SET status = 'active', enrolled_by = $2
       WHERE id = $1 AND status = 'pending' RETURNING *`,
      [id, approver],
    );
    if (!r.rows[0]) throw refused("no passkey enrolment waits under this id");
    return toCredential(r.rows[0] as Row);
  }

  /**
   * Records a verified assertion's counter, only forward: one conditional UPDATE, so two
   * replicas presented the same assertion cannot both pass. Authenticators that keep no counter
   * send 0 every time, which WebAuthn allows only while the stored counter is 0 too.
   */
  async advanceCounter(id: string, counter: number): Promise<void> {
    const r = await this.pool.query(
      `UPDATE passkey_credentials SET counter = $2, last_used_ms = ${NOW_MS}
       WHERE id = $1 AND (counter < $2 OR ($2 = 0 AND counter = 0))`,
      [id, counter],
    );
    if (r.rowCount === 1) return;
    const cur = await this.get(id);
    if (!cur) throw refused("this passkey is not enrolled here");
    throw refused(
      `the passkey's signature counter went back (${counter} after ${cur.counter}): a cloned or replayed authenticator; the assertion was refused`,
      { counter, stored: cur.counter },
    );
  }

  /** The operator's passkeys never sign again; their public keys stay for `audit verify`. */
  async removeOperator(operator: string): Promise<number> {
    const r = await this.pool.query(
      "UPDATE passkey_credentials SET status = 'removed' WHERE operator = $1 AND status <> 'removed'",
      [operator],
    );
    return r.rowCount ?? 0;
  }

  /** Nothing of its own to close: the pool is the caller's. */
  close(): void {}
}

/** A code's row as read: refused unless it exists, is unused and unexpired. */
function throwIfUnusable(
  r: { operator: string; used_ms: string | null; expired: boolean } | undefined,
): void {
  if (!r)
    throw refused("this enrolment code is unknown; print one with `tpu-mcp operators enrol NAME`");
  if (r.used_ms !== null)
    throw refused("this enrolment code was already used; codes are single-use");
  if (r.expired)
    throw refused(
      "this enrolment code expired; print a new one with `tpu-mcp operators enrol NAME`",
    );
}
