// The approval queue in SQLite: human approvals, bound to principal + tool + argument digest,
// single-use and expiring. Persisted in SQLite (WAL) because the server and the `tpu-mcp
// approvals` CLI open the same file at once, and a restart must not lose a pending or granted
// approval. The record, the port (ApprovalQueue) and the usability rule are
// policies/approval_record.ts's; the behaviour both backends share is contract.ts's.

import {
  approvalUsableError,
  newApprovalId,
  type ApprovalAssurance,
  type ApprovalEvent,
  type ApprovalListener,
  type ApprovalListFilter,
  type ApprovalPage,
  type ApprovalQueue,
  type ApprovalRecord,
  type ApprovalStatus,
  type CreateApprovalRequest,
} from "../../../policies/approval_record.js";
import { PolicyError } from "../../../policies/errors.js";
import type { CostEstimate } from "../../../policies/estimate.js";
import { systemClock, type Clock } from "../../../policies/clock.js";
import { resolveDb, type SqliteDb } from "../../../policies/sqlite.js";

interface Row {
  id: string;
  principal: string;
  tool: string;
  args_digest: string;
  args_preview: string;
  estimate: string | null;
  assurance: ApprovalAssurance | null;
  status: "pending" | "approved" | "denied" | "used";
  ttl_ms: number;
  created_ms: number;
  expires_ms: number;
  decided_by: string | null;
  decided_ms: number | null;
  reason: string | null;
  used_ms: number | null;
  policy_version?: string | null;
  rule?: string | null;
}

const iso = (ms: number | null): string | null => (ms === null ? null : new Date(ms).toISOString());

export class SqliteApprovalQueue implements ApprovalQueue {
  private readonly db: SqliteDb;
  private readonly owned: boolean;
  private readonly clock: Clock;
  private readonly listeners = new Set<ApprovalListener>();

  private readonly keepDecidedMs: number | null;
  private lastPruneMs = -Infinity;

  /**
   * `keepDecidedS`: how long an approval is kept once it is over (decided and used, denied, or
   * expired), counted from its expiry; the server passes `approvals.keep_decided_s` and prunes.
   * Without it (the read-only CLI) nothing is deleted.
   */
  constructor(pathOrDb: string | SqliteDb, opts: { clock?: Clock; keepDecidedS?: number } = {}) {
    ({ db: this.db, owned: this.owned } = resolveDb(pathOrDb));
    this.clock = opts.clock ?? systemClock;
    this.keepDecidedMs =
      opts.keepDecidedS === undefined ? null : Math.round(opts.keepDecidedS * 1000);
    this.db.exec(`CREATE TABLE IF NOT EXISTS approvals (
      id TEXT PRIMARY KEY,
      principal TEXT NOT NULL,
      tool TEXT NOT NULL,
      args_digest TEXT NOT NULL,
      args_preview TEXT NOT NULL,
      estimate TEXT,
      status TEXT NOT NULL CHECK (status IN ('pending','approved','denied','used')),
      ttl_ms INTEGER NOT NULL,
      created_ms INTEGER NOT NULL,
      expires_ms INTEGER NOT NULL,
      decided_by TEXT,
      decided_ms INTEGER,
      reason TEXT,
      used_ms INTEGER
    )`);
    // Stores from before assurance: their approvals were all token-decided.
    const cols = this.db.prepare("PRAGMA table_info(approvals)").all() as { name: string }[];
    if (!cols.some((c) => c.name === "assurance") && !this.db.readonly)
      this.db.exec("ALTER TABLE approvals ADD COLUMN assurance TEXT");
    // Stores from before policy versions and kept rules: their approvals have neither (null).
    for (const col of ["policy_version", "rule"])
      if (!cols.some((c) => c.name === col) && !this.db.readonly)
        this.db.exec(`ALTER TABLE approvals ADD COLUMN ${col} TEXT`);
    try {
      // Lists read one page through these, never the whole table.
      this.db
        .exec(`CREATE INDEX IF NOT EXISTS approvals_by_call ON approvals (principal, tool, args_digest);
      CREATE INDEX IF NOT EXISTS approvals_by_time ON approvals (created_ms);
      CREATE INDEX IF NOT EXISTS approvals_open ON approvals (status, expires_ms);
      CREATE INDEX IF NOT EXISTS approvals_open_by_principal ON approvals (principal, status, expires_ms);
      CREATE INDEX IF NOT EXISTS approvals_by_expiry ON approvals (expires_ms);`);
    } catch (e) {
      // A read-only handle on a store from an older version: the queries work without them.
      if (!this.db.readonly) throw e;
    }
    // In the constructor's own turn: a failure is the constructor's, not an unhandled rejection.
    this.pruneNow();
  }

  private toRecord(r: Row, now = this.clock()): ApprovalRecord {
    // Expiry is computed, not stored: no sweeper is needed and the CLI sees the same truth.
    const expired = (r.status === "pending" || r.status === "approved") && now >= r.expires_ms;
    return {
      id: r.id,
      principal: r.principal,
      tool: r.tool,
      args_digest: r.args_digest,
      args_preview: JSON.parse(r.args_preview),
      estimate: r.estimate ? (JSON.parse(r.estimate) as CostEstimate) : null,
      // Anything else (a store from before assurance) was token-decided.
      assurance: r.assurance === "passkey" || r.assurance === "client_form" ? r.assurance : "token",
      status: expired ? "expired" : r.status,
      created_at: iso(r.created_ms)!,
      expires_at: iso(r.expires_ms)!,
      decided_by: r.decided_by,
      decided_at: iso(r.decided_ms),
      reason: r.reason,
      used_at: iso(r.used_ms),
      policy_version: r.policy_version ?? null,
      rule: r.rule ?? null,
    };
  }

  subscribe(fn: ApprovalListener): () => void {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }

  /** After the write committed; a listener's failure never undoes or fails the change. */
  private emit(type: ApprovalEvent["type"], record: ApprovalRecord): ApprovalRecord {
    for (const fn of this.listeners) {
      try {
        fn({ type, record });
      } catch {
        // listeners log their own failures
      }
    }
    return record;
  }

  /** Changes when any approval was created, decided or used (also by another process). */
  changeMark(): string {
    const r = this.db
      .prepare(
        // Sums, not maxima: two decisions in the same millisecond must still change the mark.
        "SELECT COUNT(*) AS n, SUM(created_ms) AS c, SUM(decided_ms) AS d, SUM(used_ms) AS u FROM approvals",
      )
      .get() as { n: number; c: number | null; d: number | null; u: number | null };
    return `${r.n}:${r.c}:${r.d}:${r.u}`;
  }

  private row(id: string): Row | undefined {
    return this.db.prepare("SELECT * FROM approvals WHERE id = ?").get(id) as Row | undefined;
  }

  // The methods answer inside the call (SQLite is synchronous) and resolve at once: a listener
  // is told, and a refusal decided, before the caller's next step, as the gate expects.
  async create(req: CreateApprovalRequest): Promise<ApprovalRecord> {
    if (!(req.ttl_s > 0)) throw new RangeError("ttl_s must be > 0");
    const id = newApprovalId();
    const ttl = Math.round(req.ttl_s * 1000);
    // The count and the insert under one write lock: concurrent requests cannot overshoot the cap.
    const tx = this.db.transaction((now: number) => {
      if (req.max_pending !== undefined) {
        const pending = this.db
          .prepare(
            "SELECT COUNT(*) AS n, MIN(expires_ms) AS first FROM approvals WHERE principal = ? AND status = 'pending' AND expires_ms > ?",
          )
          .get(req.principal, now) as { n: number; first: number | null };
        if (pending.n >= req.max_pending) {
          throw new PolicyError(
            "approval_limit",
            `${req.principal} already has ${pending.n} approval requests waiting for an operator (the limit is ${req.max_pending}); this request was refused and the waiting ones are kept. Wait until one is decided or expires (the next at ${iso(pending.first ?? now)}), then call again.`,
            {
              pending: pending.n,
              limit: req.max_pending,
              retry_after_ms: Math.max(0, (pending.first ?? now) - now),
            },
          );
        }
      }
      this.db
        .prepare(
          `INSERT INTO approvals (id, principal, tool, args_digest, args_preview, estimate, assurance, status, ttl_ms, created_ms, expires_ms, policy_version, rule)
         VALUES (?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?)`,
        )
        .run(
          id,
          req.principal,
          req.tool,
          req.args_digest,
          JSON.stringify(req.args_preview ?? null),
          req.estimate ? JSON.stringify(req.estimate) : null,
          req.assurance ?? "token",
          ttl,
          now,
          now + ttl,
          req.policy_version ?? null,
          req.rule ?? null,
        );
    });
    const now = this.clock();
    tx.immediate(now);
    if (now - this.lastPruneMs >= 60_000) this.pruneNow();
    return this.emit("created", this.getNow(id)!);
  }

  async get(id: string): Promise<ApprovalRecord | undefined> {
    return this.getNow(id);
  }

  private getNow(id: string): ApprovalRecord | undefined {
    const r = this.row(id);
    return r ? this.toRecord(r) : undefined;
  }

  /** SQL for one status, as toRecord computes it (expiry is not stored). */
  private static statusWhere(status: ApprovalStatus): string {
    switch (status) {
      case "pending":
      case "approved":
        return `status = '${status}' AND expires_ms > @now`;
      case "expired":
        return "status IN ('pending','approved') AND expires_ms <= @now";
      default:
        return `status = '${status}'`;
    }
  }

  private count(where: string, now: number): number {
    return (
      this.db.prepare(`SELECT COUNT(*) AS n FROM approvals WHERE ${where}`).get({ now }) as {
        n: number;
      }
    ).n;
  }

  private rows(where: string, order: string, now: number, limit: number, offset: number): Row[] {
    if (limit <= 0) return [];
    return this.db
      .prepare(
        `SELECT * FROM approvals WHERE ${where} ORDER BY ${order} LIMIT @limit OFFSET @offset`,
      )
      .all({ now, limit, offset }) as Row[];
  }

  async list(filter: ApprovalListFilter = {}): Promise<ApprovalRecord[]> {
    return this.pageNow(filter).items;
  }

  /**
   * One page: pending approvals first, all of them, soonest to expire first (none can be pushed
   * out of sight by newer requests), then the rest, newest first. Indexed queries with
   * LIMIT/OFFSET: the table is never read whole.
   */
  async page(filter: ApprovalListFilter = {}): Promise<ApprovalPage> {
    return this.pageNow(filter);
  }

  private pageNow(filter: ApprovalListFilter): ApprovalPage {
    const limit = Math.max(0, Math.floor(filter.limit ?? 100));
    const offset = Math.max(0, Math.floor(filter.offset ?? 0));
    const now = this.clock();
    const PENDING = SqliteApprovalQueue.statusWhere("pending");
    const HISTORY = `NOT (${PENDING})`;
    const pendingOrder = "expires_ms ASC, rowid ASC";
    const historyOrder = "created_ms DESC, rowid DESC";
    // One read transaction: the counts and the page agree even while the server writes.
    const tx = this.db.transaction((): ApprovalPage => {
      const pending_total = this.count(PENDING, now);
      const history_total = this.count(HISTORY, now);
      let rows: Row[];
      if (filter.status) {
        const where = SqliteApprovalQueue.statusWhere(filter.status);
        const order = filter.status === "pending" ? pendingOrder : historyOrder;
        rows = this.rows(where, order, now, limit, offset);
      } else {
        const first = this.rows(PENDING, pendingOrder, now, limit, offset);
        const rest = limit - first.length;
        rows = first.concat(
          this.rows(HISTORY, historyOrder, now, rest, Math.max(0, offset - pending_total)),
        );
      }
      return {
        items: rows.map((r) => this.toRecord(r, now)),
        pending_total,
        history_total,
        offset,
        limit,
      };
    });
    return tx.deferred();
  }

  /**
   * Deletes approvals that have been over for longer than keepDecidedS (the audit trail keeps
   * their story). An approval is over by its expiry at the latest (a decision or a use comes
   * before it), so counting from expires_ms keeps every record at least that long after it ended.
   */
  async prune(): Promise<number> {
    return this.pruneNow();
  }

  private pruneNow(): number {
    if (this.keepDecidedMs === null) return 0;
    const now = this.clock();
    this.lastPruneMs = now;
    return this.db
      .prepare("DELETE FROM approvals WHERE expires_ms < ?")
      .run(now - this.keepDecidedMs).changes;
  }

  async findOpen(
    principal: string,
    tool: string,
    digest: string,
    policyVersion?: string,
  ): Promise<ApprovalRecord | undefined> {
    const rows = (
      this.db
        .prepare(
          `SELECT * FROM approvals WHERE principal = ? AND tool = ? AND args_digest = ?
         AND status IN ('pending','approved') AND expires_ms > ? ORDER BY created_ms DESC`,
        )
        .all(principal, tool, digest, this.clock()) as Row[]
    ).filter(
      (x) =>
        policyVersion === undefined ||
        x.policy_version == null ||
        x.policy_version === policyVersion,
    );
    // Prefer one that is already approved.
    const r = rows.find((x) => x.status === "approved") ?? rows[0];
    return r ? this.toRecord(r) : undefined;
  }

  private decide(
    id: string,
    approver: string,
    decision: "approved" | "denied",
    reason?: string,
  ): ApprovalRecord {
    const tx = this.db.transaction(() => {
      const now = this.clock();
      const r = this.row(id);
      if (!r) {
        throw new PolicyError(
          "approval_not_found",
          `No approval ${id} exists; list them with \`tpu-mcp approvals list\`.`,
          {
            approval_id: id,
          },
        );
      }
      if (r.principal === approver) {
        throw new PolicyError(
          "approval_self_grant",
          `${approver} requested approval ${id} and cannot decide it; another identity with approvals:grant must.`,
          { approval_id: id },
        );
      }
      const rec = this.toRecord(r, now);
      if (rec.status === "expired") {
        throw new PolicyError(
          "approval_expired",
          `Approval ${id} expired at ${rec.expires_at}; the agent must request a new one.`,
          {
            approval_id: id,
          },
        );
      }
      if (rec.status !== "pending") {
        throw new PolicyError(
          "approval_already_decided",
          `Approval ${id} is already ${rec.status}; decisions are final.`,
          {
            approval_id: id,
            status: rec.status,
          },
        );
      }
      // An approval restarts the TTL: the agent gets the full window to come back and use it.
      const expires = decision === "approved" ? now + r.ttl_ms : r.expires_ms;
      this.db
        .prepare(
          "UPDATE approvals SET status = ?, decided_by = ?, decided_ms = ?, reason = ?, expires_ms = ? WHERE id = ?",
        )
        .run(decision, approver, now, reason ?? null, expires, id);
    });
    tx.immediate();
    return this.emit("decided", this.getNow(id)!);
  }

  async approve(id: string, approver: string): Promise<ApprovalRecord> {
    return this.decide(id, approver, "approved");
  }

  async deny(id: string, approver: string, reason?: string): Promise<ApprovalRecord> {
    return this.decide(id, approver, "denied", reason);
  }

  async check(
    id: string,
    principal: string,
    tool: string,
    digest: string,
  ): Promise<ApprovalRecord> {
    const rec = this.getNow(id);
    const err = approvalUsableError(rec, id, principal, tool, digest);
    if (err) throw err;
    return rec!;
  }

  async consume(
    id: string,
    principal: string,
    tool: string,
    digest: string,
  ): Promise<ApprovalRecord> {
    // IMMEDIATE takes the write lock before reading, so two processes cannot both use it.
    const tx = this.db.transaction(() => {
      const now = this.clock();
      const r = this.row(id);
      const rec = r ? this.toRecord(r, now) : undefined;
      const err = approvalUsableError(rec, id, principal, tool, digest);
      if (err) throw err;
      this.db
        .prepare(
          "UPDATE approvals SET status = 'used', used_ms = ? WHERE id = ? AND status = 'approved'",
        )
        .run(now, id);
    });
    tx.immediate();
    return this.emit("used", this.getNow(id)!);
  }

  /**
   * Gives an approval back after the call that consumed it was interrupted (reconcile.ts): only
   * one that is `used`, still bound to this principal, tool and digest, and not past its expiry,
   * which stays as it was. Undefined when none qualifies (the approval stays as it is).
   */
  async restoreUsed(
    id: string,
    principal: string,
    tool: string,
    digest: string,
  ): Promise<ApprovalRecord | undefined> {
    const changed = this.db
      .prepare(
        `UPDATE approvals SET status = 'approved', used_ms = NULL WHERE id = ? AND status = 'used'
         AND principal = ? AND tool = ? AND args_digest = ? AND expires_ms > ?`,
      )
      .run(id, principal, tool, digest, this.clock()).changes;
    return changed === 1 ? this.getNow(id) : undefined;
  }

  close(): void {
    if (this.owned && this.db.open) this.db.close();
  }
}
