// The audit trail's port: what every backend of it promises (server/stores/audit/: SQLite's
// sqlite.ts, Postgres's postgres.ts, and contract.ts, the cases both pass). A record is appended
// once and chained with HMAC-SHA256 under a key kept outside the database (audit_key.ts), so an
// edited, deleted, reordered or recomputed record is detectable by whoever holds the key. The
// record's canonical form is audit_record.ts's, the verification walk and checkpoint
// audit_chain.ts's, the reading side audit_query.ts's.

import type { AuditCheckpoint, AuditHead, AuditVerifyResult, VerifyCursor } from "./audit_chain.js";
import type { AuditSearch } from "./audit_query.js";
import type { AuditRecord, StoredAuditRecord } from "./audit_record.js";
import type { ExportOptions, ExportSummary } from "./audit_export.js";
import type { RefusalScope } from "./audit_refusals.js";

// What importers of the trail read, wherever it is defined.
export type { RefusalScope } from "./audit_refusals.js";
export type { AuditOutcome, AuditRecord, StoredAuditRecord } from "./audit_record.js";
export type { AuditCheckpoint, AuditHead, AuditVerifyResult, VerifyCursor } from "./audit_chain.js";

/**
 * A write made in the transaction of an audit append (the call's calls_in_flight row: committed
 * with its `allowed` record or not at all).
 */
export type Alongside = () => void | Promise<void>;

/**
 * The audit log. Every method that reads or writes returns a promise (a shared store answers
 * over the network); SQLite answers inside the call and resolves at once. Records appended by one
 * process are chained in call order, whatever the store (an asynchronous one queues its appends),
 * so the chain's order is the order the gate decided in.
 */
export interface AuditLog {
  append(record: AuditRecord): Promise<StoredAuditRecord>;
  /**
   * Group commit: resolves once the record is committed, in one transaction with the other
   * records appended in the same event-loop turn (concurrent calls share a commit). Optional;
   * the gate falls back to `append`. `alongside` runs inside that transaction, before the record
   * (the call's calls_in_flight row: committed with its `allowed` record or not at all).
   */
  appendDurable?(record: AuditRecord, alongside?: Alongside): Promise<StoredAuditRecord>;
  /**
   * A refusal: recorded at once, or counted into the aggregate of its window when it repeats one
   * (the rule is in audit_refusals.ts); null when counted. `per` names the window's key for a
   * refusal made outside the gate (failed authentication per address: "principal"). Optional;
   * the gate falls back to `append`.
   */
  appendRefusal?(
    record: AuditRecord,
    opts?: { per?: RefusalScope },
  ): Promise<StoredAuditRecord | null>;
  tail(n: number): Promise<StoredAuditRecord[]>;
  head(): Promise<AuditHead>;
  verify(opts?: { head?: AuditHead }): Promise<AuditVerifyResult>;
  close(): void | Promise<void>;
}

/** One step of an incremental verification: read in one snapshot (audit_verify.ts). */
export interface VerifyStep {
  /** The fault found, if any (the step ends the pass then). */
  bad: AuditVerifyResult | null;
  /** Records read and checked in this step. */
  read: number;
  /** The trail's end was reached (and the head checked). */
  end: boolean;
}

/**
 * The audit trail and its checkpoint as the server, the console and the CLI use them (shared
 * across replicas: one hash chain with one head, so every append takes the head in turn).
 */
export interface AuditTrail extends AuditLog {
  appendDurable(record: AuditRecord, alongside?: Alongside): Promise<StoredAuditRecord>;
  appendRefusal(
    record: AuditRecord,
    opts?: { per?: RefusalScope },
  ): Promise<StoredAuditRecord | null>;
  /** Refusals counted into an open window, not yet written (in memory). */
  pendingRefusals(): number;
  /** Writes every open refusal window's aggregate now. */
  flushRefusals(): Promise<void>;
  search(q: AuditSearch): Promise<{ records: StoredAuditRecord[]; scanned: number }>;
  /** The decisions signed with a passkey, oldest first (their evidence is re-checked). */
  signedDecisions(): AsyncIterable<StoredAuditRecord>;
  exportHead(): Promise<AuditHead & { export_hash: string }>;
  export(opts: Omit<ExportOptions, "keyId">, write: (line: string) => void): Promise<ExportSummary>;
  /** Where a verification resumes from a checkpoint (audit_verify.ts). */
  cursorAt(cp: AuditCheckpoint | null): Promise<VerifyCursor>;
  /**
   * One bounded step of a verification, atomic: up to `maxRows` records after `cur` (moved on)
   * and, when the trail ends inside the step, the head, all from one snapshot.
   */
  verifyStep(cur: VerifyCursor, maxRows: number): Promise<VerifyStep>;
  readCheckpoint(): Promise<{
    checkpoint?: AuditCheckpoint;
    forged?: { seq: number; reason: string };
  }>;
  writeCheckpoint(cur: VerifyCursor, verifiedAt: string): Promise<AuditCheckpoint | null>;
  /**
   * Tells `fn` of the records this process appends, right after each commit, in seq order (the
   * streaming sink, audit_sink.ts); returns the un-registration. In memory.
   */
  onAppended(fn: (records: readonly StoredAuditRecord[]) => void): () => void;
  /** Records `from`..`to` (seq, inclusive) as stored, oldest first, at most 10,000. */
  readRange(from: number, to: number): Promise<StoredAuditRecord[]>;
}

/** The part of a pino logger the policies use; a pino Logger satisfies it. */
export interface PolicyLogger {
  info(obj: object, msg?: string): void;
  warn(obj: object, msg?: string): void;
  error(obj: object, msg?: string): void;
}
