// The streaming audit sink (`policy.audit.sink`): every record the trail appends, sent as it is
// appended to a file that rotates or to an HTTP endpoint (audit_sink_targets.ts), in the line
// format of `tpu-mcp audit export --format jsonl` — the record with its keyed chain fields and
// the keyless export chain (audit_export_proof.ts) — so that a receiver checks what it got with
// `tpu-mcp audit verify-export` against `tpu-mcp audit head`, without the key.
//
// It never blocks a call: `offer` only queues (bounded, `max_queue` records). A record that finds
// the queue full is dropped and counted; the next record that is sent after drops is preceded by
// one gap line, `{"type": "audit_gap", "first_seq", "last_seq", "dropped"}`, so the receiver sees
// exactly which records it lacks (`audit export --since FIRST_SEQ` fills them in). Records the
// trail got from another process (the CLI beside the server) are read back from the trail so the
// stream stays gap-free.

import { asciiJson, recordLine } from "./audit_export_line.js";
import { canonicalBody, exportLink } from "./audit_export_proof.js";
import type { PolicyLogger, StoredAuditRecord } from "./audit.js";

/** Where lines go: one batch at a time, in order; rejects when the batch was not taken. */
export interface SinkTarget {
  readonly describe: string;
  /** Writes the lines (each one JSON text, no newline); resolves once they are taken. */
  send(lines: string[]): Promise<void>;
  close(): Promise<void>;
}

export interface AuditSinkOptions {
  target: SinkTarget;
  logger: PolicyLogger;
  /** Records that may wait; one more is dropped (and counted). */
  maxQueue: number;
  /**
   * The export hash and seq of the trail's head when the sink starts (audit.exportHead(), read
   * when the sink is made: records offered meanwhile wait for it).
   */
  start: Promise<{ seq: number; export_hash: string }> | { seq: number; export_hash: string };
  /** Reads records the sink did not see appended (another process's), seq `from` to `to`. */
  readRange(from: number, to: number): Promise<StoredAuditRecord[]>;
  /** Lines per send. */
  batch?: number;
  /** A failed send is retried after this, doubling up to maxBackoffMs. */
  retryBaseMs?: number;
  maxBackoffMs?: number;
}

export interface AuditSinkStatus {
  target: string;
  sent: number;
  dropped: number;
  queued: number;
  /** The last seq the receiver has been sent. */
  sent_seq: number;
  /** Consecutive failed sends (the target is down); 0 when the last one worked. */
  failures: number;
  last_error: string | null;
}

type Item = { kind: "record"; line: string; seq: number } | { kind: "gap"; line: string };

export class AuditSink {
  private readonly queue: Item[] = [];
  /** The next seq the stream expects, and the export hash it continues from. */
  private nextSeq = 1;
  private exportPrev = "";
  private droppedFrom: number | null = null;
  private droppedTo = 0;
  private droppedCount = 0;
  private sent = 0;
  private dropped = 0;
  private sentSeq = 0;
  private failures = 0;
  private lastError: string | null = null;
  private pumping = false;
  private closed = false;
  private wake?: () => void;
  private timer?: NodeJS.Timeout;
  private idle?: Promise<void>;

  /** Offers are taken one after another, after the start's head (a backfill may wait on the store). */
  private taking: Promise<void>;

  constructor(private readonly opts: AuditSinkOptions) {
    this.taking = Promise.resolve(opts.start).then(
      (start) => {
        this.nextSeq = start.seq + 1;
        this.exportPrev = start.export_hash;
        this.sentSeq = start.seq;
      },
      (e) => {
        this.opts.logger.error({ err: String(e) }, "audit sink: could not read the trail's head");
        this.closed = true;
      },
    );
  }

  /** Records just committed, in seq order (the trail's append hook). Never throws, never waits. */
  offer(records: readonly StoredAuditRecord[]): void {
    if (this.closed) return;
    this.taking = this.taking
      .then(() => this.take(records))
      .catch((e) => this.opts.logger.error({ err: String(e) }, "audit sink: records not taken"));
  }

  private async take(records: readonly StoredAuditRecord[]): Promise<void> {
    if (this.closed) return;
    for (const r of records) {
      if (r.seq < this.nextSeq) continue; // already streamed (read back earlier)
      if (r.seq > this.nextSeq) await this.backfill(r.seq - 1);
      this.push(r);
    }
    this.pump();
  }

  status(): AuditSinkStatus {
    return {
      target: this.opts.target.describe,
      sent: this.sent,
      dropped: this.dropped,
      queued: this.queue.length,
      sent_seq: this.sentSeq,
      failures: this.failures,
      last_error: this.lastError,
    };
  }

  /** Resolves once everything queued has been sent (or `ms` passed); for tests and close. */
  async flush(ms = 10_000): Promise<void> {
    const end = Date.now() + ms;
    await this.taking;
    while ((this.queue.length || this.pumping) && Date.now() < end)
      await new Promise((r) => setTimeout(r, 20));
  }

  /** Stops taking records, tries to send what is queued (a few seconds at most), closes. */
  async close(): Promise<void> {
    this.closed = true;
    await this.flush(3000);
    this.queue.length = 0;
    if (this.timer) clearTimeout(this.timer);
    this.wake?.();
    await this.idle;
    await this.opts.target.close();
  }

  /** Another process appended these: read them back, so the stream has no hole. */
  private async backfill(to: number): Promise<void> {
    let rows: StoredAuditRecord[] = [];
    try {
      rows = await this.opts.readRange(this.nextSeq, to);
    } catch (e) {
      this.opts.logger.warn({ err: String(e) }, "audit sink: could not read records back");
    }
    for (const r of rows) if (r.seq === this.nextSeq) this.push(r);
    // Whatever could not be read is a gap like a drop.
    if (this.nextSeq <= to) {
      for (let s = this.nextSeq; s <= to; s++) this.drop(s);
    }
  }

  private push(r: StoredAuditRecord): void {
    const { seq, prev_hash, hash, ...record } = r;
    const exportHash = exportLink(
      this.exportPrev,
      prev_hash,
      hash,
      canonicalBody({ ...record, seq }),
    );
    const line = asciiJson(
      recordLine(
        { seq, record, prev_hash, hash, export_prev: this.exportPrev, export_hash: exportHash },
        "jsonl",
      ),
    );
    this.exportPrev = exportHash;
    this.nextSeq = seq + 1;
    if (this.queue.length >= this.opts.maxQueue) return this.drop(seq);
    if (this.droppedFrom !== null) this.emitGap();
    this.queue.push({ kind: "record", line, seq });
  }

  private drop(seq: number): void {
    if (this.droppedFrom === null) {
      this.droppedFrom = seq;
      this.opts.logger.warn(
        { target: this.opts.target.describe, from_seq: seq, queued: this.queue.length },
        "audit sink: queue full, dropping records (a gap line will name them; `tpu-mcp audit export --since SEQ` has them)",
      );
    }
    this.droppedTo = seq;
    this.droppedCount++;
    this.dropped++;
    this.nextSeq = Math.max(this.nextSeq, seq + 1);
  }

  /** The gap line: what the receiver lacks, sent in its place in the stream. */
  private emitGap(): void {
    const gap = {
      type: "audit_gap",
      first_seq: this.droppedFrom,
      last_seq: this.droppedTo,
      dropped: this.droppedCount,
      reason: "the sink's queue was full (the receiver was slow or down)",
    };
    this.opts.logger.warn(
      { target: this.opts.target.describe, ...gap },
      `audit sink dropped records ${gap.first_seq}..${gap.last_seq}`,
    );
    this.queue.push({ kind: "gap", line: asciiJson(gap) });
    this.droppedFrom = null;
    this.droppedCount = 0;
  }

  private pump(): void {
    if (this.pumping || this.queue.length === 0) return;
    this.pumping = true;
    this.idle = this.run().finally(() => {
      this.pumping = false;
      if (this.queue.length && !this.closed) this.pump();
    });
  }

  private async run(): Promise<void> {
    const batch = this.opts.batch ?? 500;
    const base = this.opts.retryBaseMs ?? 500;
    const max = this.opts.maxBackoffMs ?? 30_000;
    while (this.queue.length) {
      const items = this.queue.slice(0, batch);
      try {
        await this.opts.target.send(items.map((i) => i.line));
      } catch (e) {
        this.failures++;
        this.lastError = String((e as Error)?.message ?? e);
        if (this.failures === 1 || this.failures % 10 === 0)
          this.opts.logger.warn(
            { target: this.opts.target.describe, error: this.lastError, failures: this.failures },
            "audit sink: send failed; retrying with backoff",
          );
        if (this.closed) return;
        const wait = Math.min(max, base * 2 ** Math.min(20, this.failures - 1));
        await new Promise<void>((r) => {
          this.wake = r;
          this.timer = setTimeout(r, wait);
          this.timer.unref?.();
        });
        continue;
      }
      this.queue.splice(0, items.length);
      this.failures = 0;
      this.lastError = null;
      // The receiver is taking records again: tell it now what it lacks, not at the next record.
      if (this.droppedFrom !== null && this.queue.length < this.opts.maxQueue) this.emitGap();
      for (const i of items)
        if (i.kind === "record") {
          this.sent++;
          this.sentSeq = i.seq;
        }
    }
  }
}
