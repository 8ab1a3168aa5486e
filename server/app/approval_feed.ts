// One stream of approval events for the console (SSE) and the webhooks. Changes made in this
// process arrive at once through the store's hook; changes made beside it (the `tpu-mcp
// approvals` CLI on the same SQLite file) and expiries are found by a cheap poll. Each
// (approval, status) pair is announced once, whichever path sees it first.
import type {
  ApprovalQueue,
  ApprovalRecord,
  ApprovalStatus,
} from "../../policies/approval_record.js";

export type FeedEventType = "created" | "decided" | "used" | "expired";
export interface FeedEvent {
  type: FeedEventType;
  record: ApprovalRecord;
}
export type FeedListener = (e: FeedEvent) => void;

const TYPE_FOR_STATUS: Record<ApprovalStatus, FeedEventType> = {
  pending: "created",
  approved: "decided",
  denied: "decided",
  used: "used",
  expired: "expired",
};

export class ApprovalFeed {
  private readonly seen = new Map<string, ApprovalStatus>();
  private readonly listeners = new Set<FeedListener>();
  private readonly unsubscribe: () => void;
  private timer: ReturnType<typeof setInterval> | undefined;
  private mark = "";
  private nextExpiry = Infinity;
  /** The read in progress (the first snapshot, or a poll): polls never overlap. */
  private polling: Promise<void> | null;

  constructor(
    private readonly store: ApprovalQueue,
    private readonly opts: { pollMs?: number; onError?: (e: unknown) => void } = {},
  ) {
    const first = this.snapshot(false).catch((e) => this.opts.onError?.(e));
    this.polling = first;
    void first.then(() => {
      if (this.polling === first) this.polling = null;
    });
    this.unsubscribe = store.subscribe((e) => this.observe(e.record));
  }

  /** Starts polling while anyone listens. Returns the unsubscribe function. */
  on(fn: FeedListener): () => void {
    this.listeners.add(fn);
    if (!this.timer) {
      this.timer = setInterval(() => void this.poll(), this.opts.pollMs ?? 1000);
      this.timer.unref();
    }
    return () => {
      this.listeners.delete(fn);
      if (this.listeners.size === 0 && this.timer) {
        clearInterval(this.timer);
        this.timer = undefined;
      }
    };
  }

  close(): void {
    this.unsubscribe();
    this.listeners.clear();
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
  }

  /** Re-reads the store when something changed or an open approval's expiry passed. */
  poll(): Promise<void> {
    // One read at a time: a poll asked during one runs after it (a change may have come since).
    if (this.polling) return this.polling.then(() => this.poll());
    const done = (async () => {
      try {
        const mark = this.store.changeMark();
        if (mark === this.mark && Date.now() < this.nextExpiry) return;
        await this.snapshot(true);
      } catch (e) {
        this.opts.onError?.(e);
      }
    })();
    this.polling = done;
    void done.then(() => {
      if (this.polling === done) this.polling = null;
    });
    return done;
  }

  private async snapshot(announce: boolean): Promise<void> {
    this.mark = this.store.changeMark();
    let next = Infinity;
    // Every pending one (they come first), then recent history; oldest first, so a burst is
    // announced in the order it happened.
    const recent = (await this.store.list({ limit: 500 })).sort(
      (a, b) => Date.parse(a.created_at) - Date.parse(b.created_at),
    );
    for (const r of recent) {
      if (announce) this.observe(r);
      else this.seen.set(r.id, r.status);
      if (r.status === "pending" || r.status === "approved")
        next = Math.min(next, Date.parse(r.expires_at));
    }
    this.nextExpiry = next;
  }

  private observe(r: ApprovalRecord): void {
    const before = this.seen.get(r.id);
    if (before === r.status) return;
    this.seen.set(r.id, r.status);
    // Steps missed between two polls are still announced, in order.
    const types: FeedEventType[] = [];
    if (before === undefined) types.push("created");
    if ((before === undefined || before === "pending") && r.decided_by) types.push("decided");
    const last = TYPE_FOR_STATUS[r.status];
    if (!types.includes(last)) types.push(last);
    if (r.status === "pending" || r.status === "approved")
      this.nextExpiry = Math.min(this.nextExpiry, Date.parse(r.expires_at));
    for (const type of types) {
      for (const fn of this.listeners) {
        try {
          fn({ type, record: r });
        } catch (e) {
          this.opts.onError?.(e);
        }
      }
    }
  }
}
