// The port of operators' passkeys: the credential record and what every backend of it promises
// (server/stores/passkeys/: sqlite.ts, postgres.ts, and contract.ts, the cases both pass).

/** "removed": kept (never signs again) so decisions it signed can still be verified. */
export type CredentialStatus = "active" | "pending" | "removed";

export interface StoredCredential {
  /** base64url, as WebAuthn names it. */
  id: string;
  operator: string;
  /** COSE-encoded public key. */
  public_key: Uint8Array;
  counter: number;
  transports: string[];
  aaguid: string;
  rp_id: string;
  status: CredentialStatus;
  /** "enrolment-code" for the first, else the id of the credential whose assertion approved it. */
  enrolled_by: string | null;
  created_at: string;
  last_used_at: string | null;
}

/**
 * Operators' passkeys, their enrolment codes and signature counters (shared across replicas: a
 * counter advanced through one refuses the replayed assertion on every other). Every method that
 * reads or writes returns a promise (SQLite's resolve at once); each promise that must hold
 * across replicas is one method: `addCredential` spends its enrolment code with the insert (a
 * code is used once), `advanceCounter` checks and moves the counter in one step (it never goes
 * back), `activate` turns a pending credential active once.
 */
export interface Passkeys {
  get(id: string): Promise<StoredCredential | undefined>;
  list(operator?: string): Promise<StoredCredential[]>;
  activeCount(operator?: string): Promise<number>;
  createEnrolmentCode(
    operator: string,
    ttlS: number,
  ): Promise<{ code: string; expires_at: string }>;
  peekEnrolmentCode(code: string): Promise<string>;
  addCredential(
    c: Omit<StoredCredential, "status" | "enrolled_by" | "created_at" | "last_used_at">,
    via: { code: string } | { session: string },
  ): Promise<StoredCredential>;
  activate(id: string, approver: string): Promise<StoredCredential>;
  advanceCounter(id: string, counter: number): Promise<void>;
  removeOperator(operator: string): Promise<number>;
  close(): void;
}
