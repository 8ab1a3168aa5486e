// Operators' passkeys in policy.db: the credentials (public key, signature counter, status) and
// the one-time enrolment codes `tpu-mcp operators enrol NAME` prints. Shared by the server and
// the CLI beside it (WAL, busy timeout: policies/sqlite.ts), so a restart keeps every credential
// and counter. Codes are stored as sha256 only: the database never holds a usable code. The port
// (Passkeys) is policies/passkeys/store.ts's; contract.ts holds the cases both backends pass.

import { createHash, randomBytes } from "node:crypto";
import { systemClock, type Clock } from "../../../policies/clock.js";
import { resolveDb, type SqliteDb } from "../../../policies/sqlite.js";
import { refused } from "../../../policies/passkeys/binding.js";
import type {
  CredentialStatus,
  Passkeys,
  StoredCredential,
} from "../../../policies/passkeys/store.js";

interface Row {
  id: string;
  operator: string;
  public_key: Buffer;
  counter: number;
  transports: string;
  aaguid: string;
  rp_id: string;
  status: CredentialStatus;
  enrolled_by: string | null;
  created_ms: number;
  last_used_ms: number | null;
}

const iso = (ms: number | null) => (ms === null ? null : new Date(ms).toISOString());
const hashCode = (code: string) => createHash("sha256").update(code, "utf8").digest("hex");

export class SqlitePasskeys implements Passkeys {
  private readonly db: SqliteDb;
  private readonly owned: boolean;
  private readonly clock: Clock;

  constructor(pathOrDb: string | SqliteDb, opts: { clock?: Clock } = {}) {
    ({ db: this.db, owned: this.owned } = resolveDb(pathOrDb));
    this.clock = opts.clock ?? systemClock;
    if (this.db.readonly) return;
    this.db.exec(`CREATE TABLE IF NOT EXISTS passkey_credentials (
      id TEXT PRIMARY KEY,
      operator TEXT NOT NULL,
      public_key BLOB NOT NULL,
      counter INTEGER NOT NULL,
      transports TEXT NOT NULL,
      aaguid TEXT NOT NULL,
      rp_id TEXT NOT NULL,
      status TEXT NOT NULL CHECK (status IN ('active','pending','removed')),
      enrolled_by TEXT,
      created_ms INTEGER NOT NULL,
      last_used_ms INTEGER
    );
    CREATE INDEX IF NOT EXISTS passkey_credentials_by_operator ON passkey_credentials (operator);
    CREATE TABLE IF NOT EXISTS passkey_enrolment_codes (
      code_sha256 TEXT PRIMARY KEY,
      operator TEXT NOT NULL,
      created_ms INTEGER NOT NULL,
      expires_ms INTEGER NOT NULL,
      used_ms INTEGER
    );`);
  }

  private hasTables(): boolean {
    return (
      this.db
        .prepare("SELECT name FROM sqlite_master WHERE type='table' AND name='passkey_credentials'")
        .get() !== undefined
    );
  }

  private toCredential(r: Row): StoredCredential {
    return {
      id: r.id,
      operator: r.operator,
      public_key: new Uint8Array(r.public_key),
      counter: r.counter,
      transports: JSON.parse(r.transports),
      aaguid: r.aaguid,
      rp_id: r.rp_id,
      status: r.status,
      enrolled_by: r.enrolled_by,
      created_at: iso(r.created_ms)!,
      last_used_at: iso(r.last_used_ms),
    };
  }

  async get(id: string): Promise<StoredCredential | undefined> {
    return this.getNow(id);
  }

  private getNow(id: string): StoredCredential | undefined {
    if (!this.hasTables()) return undefined;
    const r = this.db.prepare("SELECT * FROM passkey_credentials WHERE id = ?").get(id) as
      Row | undefined;
    return r ? this.toCredential(r) : undefined;
  }

  async list(operator?: string): Promise<StoredCredential[]> {
    return this.listNow(operator);
  }

  private listNow(operator?: string): StoredCredential[] {
    if (!this.hasTables()) return [];
    const rows = (
      operator === undefined
        ? this.db.prepare("SELECT * FROM passkey_credentials ORDER BY created_ms")
        : this.db
            .prepare("SELECT * FROM passkey_credentials WHERE operator = ? ORDER BY created_ms")
            .bind(operator)
    ).all() as Row[];
    return rows.map((r) => this.toCredential(r));
  }

  /** Active credentials in all: with none, the first enrolment needs only a code. */
  async activeCount(operator?: string): Promise<number> {
    return this.activeNow(operator);
  }

  private activeNow(operator?: string): number {
    if (!this.hasTables()) return 0;
    const q =
      operator === undefined
        ? this.db.prepare("SELECT COUNT(*) AS n FROM passkey_credentials WHERE status = 'active'")
        : this.db
            .prepare(
              "SELECT COUNT(*) AS n FROM passkey_credentials WHERE status = 'active' AND operator = ?",
            )
            .bind(operator);
    return (q.get() as { n: number }).n;
  }

  /** The operator's passkeys that are not removed (active or waiting). */
  private live(operator: string): StoredCredential[] {
    return this.listNow(operator).filter((c) => c.status !== "removed");
  }

  /**
   * A one-time code for `operator`'s first passkey. Refused once the operator has any passkey
   * (active or waiting): another device is added from a signed-in session and approved with an
   * existing passkey, never with a code from the command line.
   */
  async createEnrolmentCode(
    operator: string,
    ttlS: number,
  ): Promise<{ code: string; expires_at: string }> {
    if (this.live(operator).length > 0)
      throw refused(
        `${operator} already has a passkey; add another device from the console (signed in with that passkey) — a code from the command line cannot`,
        { operator },
      );
    const code = randomBytes(15).toString("base64url");
    const now = this.clock();
    const expires = now + Math.round(ttlS * 1000);
    const tx = this.db.transaction(() => {
      // One live code per operator: a new one replaces the last.
      this.db
        .prepare("DELETE FROM passkey_enrolment_codes WHERE operator = ? AND used_ms IS NULL")
        .run(operator);
      this.db
        .prepare(
          "INSERT INTO passkey_enrolment_codes (code_sha256, operator, created_ms, expires_ms) VALUES (?, ?, ?, ?)",
        )
        .run(hashCode(code), operator, now, expires);
    });
    tx.immediate();
    return { code, expires_at: iso(expires)! };
  }

  /** Which operator a code is for, without using it (the registration options need the name). */
  async peekEnrolmentCode(code: string): Promise<string> {
    return this.codeRow(code).operator;
  }

  private codeRow(code: string) {
    const r = this.db
      .prepare("SELECT * FROM passkey_enrolment_codes WHERE code_sha256 = ?")
      .get(hashCode(code)) as
      { operator: string; expires_ms: number; used_ms: number | null } | undefined;
    if (!r)
      throw refused(
        "this enrolment code is unknown; print one with `tpu-mcp operators enrol NAME`",
      );
    if (r.used_ms !== null)
      throw refused("this enrolment code was already used; codes are single-use");
    if (this.clock() >= r.expires_ms)
      throw refused(
        "this enrolment code expired; print a new one with `tpu-mcp operators enrol NAME`",
      );
    return r;
  }

  /**
   * Stores a newly registered credential. With a code: the code is used up in the same
   * transaction, and the credential is active only when no active passkey exists anywhere
   * (the bootstrap); otherwise it waits for an approval by an existing passkey.
   */
  async addCredential(
    c: Omit<StoredCredential, "status" | "enrolled_by" | "created_at" | "last_used_at">,
    via: { code: string } | { session: string },
  ): Promise<StoredCredential> {
    const tx = this.db.transaction(() => {
      const now = this.clock();
      if ("code" in via) {
        const r = this.codeRow(via.code);
        if (r.operator !== c.operator) throw refused("this enrolment code is for another operator");
        if (this.live(c.operator).length > 0)
          throw refused(`${c.operator} already has a passkey; the code is void`);
        this.db
          .prepare("UPDATE passkey_enrolment_codes SET used_ms = ? WHERE code_sha256 = ?")
          .run(now, hashCode(via.code));
      }
      if (this.getNow(c.id)) throw refused("this credential is already enrolled");
      const first = "code" in via && this.activeNow() === 0;
      this.db
        .prepare(
          `INSERT INTO passkey_credentials (id, operator, public_key, counter, transports, aaguid, rp_id, status, enrolled_by, created_ms)
           VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
        )
        .run(
          c.id,
          c.operator,
          Buffer.from(c.public_key),
          c.counter,
          JSON.stringify(c.transports),
          c.aaguid,
          c.rp_id,
          first ? "active" : "pending",
          first ? "enrolment-code" : null,
          now,
        );
    });
    tx.immediate();
    return this.getNow(c.id)!;
  }

  /** A waiting credential becomes active, approved by an assertion of `approver` (a credential id). */
  async activate(id: string, approver: string): Promise<StoredCredential> {
    const n = this.db
      .prepare(
        "UPDATE passkey_credentials SET status = 'active', enrolled_by = ? WHERE id = ? AND status = 'pending'",
      )
      .run(approver, id).changes;
    if (n !== 1) throw refused("no passkey enrolment waits under this id");
    return this.getNow(id)!;
  }

  /**
   * Records a verified assertion's counter. Refused when it did not move forward (a cloned
   * authenticator or a replay): authenticators that keep no counter send 0 every time, which
   * WebAuthn allows only while the stored counter is 0 too. Checked and written in one
   * transaction, so two assertions with the same counter cannot both pass.
   */
  async advanceCounter(id: string, counter: number): Promise<void> {
    const tx = this.db.transaction(() => {
      const r = this.db.prepare("SELECT counter FROM passkey_credentials WHERE id = ?").get(id) as
        { counter: number } | undefined;
      if (!r) throw refused("this passkey is not enrolled here");
      if ((counter > 0 || r.counter > 0) && counter <= r.counter)
        throw refused(
          `the passkey's signature counter went back (${counter} after ${r.counter}): a cloned or replayed authenticator; the assertion was refused`,
          { counter, stored: r.counter },
        );
      this.db
        .prepare("UPDATE passkey_credentials SET counter = ?, last_used_ms = ? WHERE id = ?")
        .run(counter, this.clock(), id);
    });
    tx.immediate();
  }

  /**
   * Recovery by whoever has a shell as the server's user (`tpu-mcp operators remove NAME`): the
   * passkeys never sign again, and their public keys stay so `tpu-mcp audit verify` can still
   * check the decisions they signed.
   */
  async removeOperator(operator: string): Promise<number> {
    if (!this.hasTables()) return 0;
    return this.db
      .prepare(
        "UPDATE passkey_credentials SET status = 'removed' WHERE operator = ? AND status != 'removed'",
      )
      .run(operator).changes;
  }

  close(): void {
    if (this.owned && this.db.open) this.db.close();
  }
}
