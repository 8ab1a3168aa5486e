// Verification of the audit trail off the request path. A full pass parses, canonicalises and
// HMACs every record: at a million records that is seconds of event loop, so a server never runs
// one in a request. Instead this background task verifies only the records after the last
// checkpoint (seq and hash, MAC'd with the audit key), in chunks of a bounded number of records
// with a yield to the event loop between them, and moves the checkpoint on. Readers (the
// console's audit page) get its status at once and may ask for a catch-up. The full pass stays
// on demand: `tpu-mcp audit verify`.
import type { AuditTrail, AuditVerifyResult, VerifyCursor } from "./audit.js";
import type { PolicyLogger } from "./audit.js";

export interface AuditVerifyStatus extends AuditVerifyResult {
  /** Records 1..verified_seq are verified (checked is the same number). */
  verified_seq: number;
  /** When the checkpoint at verified_seq was reached (null: nothing verified yet). */
  verified_at: string | null;
  /** The trail's last record when this status was read. */
  head_seq: number;
  /** A pass is running (records after verified_seq are being verified). */
  in_progress: boolean;
}

export interface AuditVerifierOptions {
  logger?: PolicyLogger;
  /** Records verified per event-loop turn (default 500, about a millisecond). */
  chunkRows?: number;
  /** Store the checkpoint at least every this many records of a long pass (default 50,000). */
  checkpointEvery?: number;
  clock?: () => number;
}

const yieldToLoop = () => new Promise<void>((r) => setImmediate(r));

export class AuditVerifier {
  private readonly chunkRows: number;
  private readonly checkpointEvery: number;
  private readonly clock: () => number;
  private running: Promise<AuditVerifyStatus> | null = null;
  private again = false;
  private scheduled = false;
  private closed = false;
  private verifiedSeq = 0;
  private verifiedAt: string | null = null;
  private fault: AuditVerifyResult | null = null;
  private progress = 0;

  constructor(
    private readonly log: AuditTrail,
    private readonly opts: AuditVerifierOptions = {},
  ) {
    this.chunkRows = Math.max(1, opts.chunkRows ?? 500);
    this.checkpointEvery = Math.max(this.chunkRows, opts.checkpointEvery ?? 50_000);
    this.clock = opts.clock ?? Date.now;
    // Reading the checkpoint costs one row and one MAC: what the status shows before any pass.
    this.loaded = log.readCheckpoint().then(
      (cp) => {
        if (cp.forged) this.fault = { ok: false, checked: 0, ...this.forgedFault(cp.forged) };
        else if (cp.checkpoint) {
          this.verifiedSeq = cp.checkpoint.seq;
          this.verifiedAt = cp.checkpoint.verified_at;
        }
      },
      (e) => this.opts.logger?.error({ err: String(e) }, "audit checkpoint could not be read"),
    );
  }

  /** The checkpoint read at construction (every status waits for it). */
  private readonly loaded: Promise<void>;

  private forgedFault(f: { seq: number; reason: string }) {
    return { first_bad_seq: f.seq, reason: f.reason };
  }

  /** What is known now, without verifying anything (one indexed read for the head). */
  async status(): Promise<AuditVerifyStatus> {
    await this.loaded;
    // Once closed, the store may be closed too: the head is not read any more.
    const headSeq = this.closed ? this.verifiedSeq : (await this.log.head()).seq;
    // A pass that is only scheduled counts when it has records to verify.
    const inProgress = this.running !== null || (this.scheduled && this.verifiedSeq < headSeq);
    const seq = inProgress ? Math.max(this.verifiedSeq, this.progress) : this.verifiedSeq;
    if (this.fault)
      return {
        ...this.fault,
        verified_seq: this.verifiedSeq,
        verified_at: this.verifiedAt,
        head_seq: headSeq,
        in_progress: inProgress,
      };
    return {
      ok: true,
      checked: seq,
      reason:
        seq === 0
          ? inProgress
            ? "verification in progress"
            : "nothing verified yet"
          : `${seq} records chain correctly${seq < headSeq ? ` (records ${seq + 1}..${headSeq} not yet verified)` : ""}`,
      verified_seq: this.verifiedSeq,
      verified_at: this.verifiedAt,
      head_seq: headSeq,
      in_progress: inProgress,
    };
  }

  /** Starts a pass up to the current head unless one is running (then it runs once more after). */
  kick(): void {
    if (this.closed) return;
    if (this.running) {
      this.again = true;
      return;
    }
    if (this.scheduled) return;
    // On a later turn: whoever asked (a page request) answers first.
    this.scheduled = true;
    setImmediate(() => {
      this.scheduled = false;
      if (!this.closed) this.run().catch(() => {});
    });
  }

  /** One pass from the checkpoint to the head; resolves with the status at its end. */
  run(): Promise<AuditVerifyStatus> {
    if (this.running) return this.running;
    this.running = this.pass()
      .catch((e) => {
        this.opts.logger?.error({ err: String(e) }, "audit verification failed to run");
      })
      .then(async () => {
        this.running = null;
        let done: AuditVerifyStatus;
        try {
          done = await this.status();
        } finally {
          // Started after the status was read, so the status is this pass's end.
          if (this.again && !this.closed) {
            this.again = false;
            this.run().catch(() => {});
          }
        }
        return done;
      });
    return this.running;
  }

  close(): void {
    this.closed = true;
  }

  private async pass(): Promise<void> {
    await this.loaded;
    const log = this.log;
    const cp = await log.readCheckpoint();
    if (cp.forged) {
      this.fault = { ok: false, checked: 0, ...this.forgedFault(cp.forged) };
      this.opts.logger?.error({ audit_verify: this.fault }, "audit trail TAMPERED");
      return;
    }
    const cur: VerifyCursor = await log.cursorAt(cp.checkpoint ?? null);
    this.progress = cur.checked;
    let sinceSave = 0;
    for (;;) {
      if (this.closed) return;
      // Each step reads its records and, at the end of the trail, the head in one snapshot.
      const step = await log.verifyStep(cur, this.chunkRows);
      this.progress = cur.checked;
      sinceSave += step.read;
      if (step.bad) {
        this.fault = step.bad;
        this.opts.logger?.error({ audit_verify: step.bad }, "audit trail TAMPERED");
        return;
      }
      if (step.end || sinceSave >= this.checkpointEvery) {
        const saved = await log.writeCheckpoint(cur, new Date(this.clock()).toISOString());
        this.fault = null;
        this.verifiedSeq = saved?.seq ?? cur.checked;
        this.verifiedAt = saved?.verified_at ?? new Date(this.clock()).toISOString();
        sinceSave = 0;
      }
      if (step.end) return;
      await yieldToLoop();
    }
  }
}
