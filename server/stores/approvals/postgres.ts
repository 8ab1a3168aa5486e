// The approval queue in Postgres, shared by every replica: an approval requested through one is
// listed, decided and consumed through any other. Each promise is one statement or one
// transaction, so it holds however many replicas race for it:
// - the per-principal cap on pending requests: the count and the insert under the principal's
//   advisory lock, in one transaction;
// - decided once and used once: a conditional UPDATE on the status (and the expiry), whose
//   RETURNING says which caller won;
// - expiry is computed from the database's clock, as SQLite's store computes it from its own:
//   no sweeper, and every replica sees the same truth.
// Every change sends a notification in its own transaction (notify.ts), so subscribers on every
// replica hear it: the console's live list and the 2025-era approval wait notice a decision made
// elsewhere. The record, the port and the usability rule are policies/approval_record.ts's, as
// for SqliteApprovalQueue (sqlite.ts beside it); contract.ts holds the cases both must pass.
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
import type { CostEstimate } from "../../../policies/estimate.js";
import { PolicyError } from "../../../policies/errors.js";
import { newOrigin, notifySql, PgListener } from "../pg/notify.js";
import { inTransaction, NOW_MS, type PgClient, type PgPool } from "../pg/pool.js";

/** The notification channel of approval changes. */
export const APPROVALS_CHANNEL = "tpu_mcp_approvals";

/** Advisory lock namespace of a principal's approval requests (distinct from the budget's 7801). */
const CAP_LOCK = 7802;

interface Row {
  id: string;
  principal: string;
  tool: string;
  args_digest: string;
  args_preview: unknown;
  estimate: CostEstimate | null;
  assurance: ApprovalAssurance;
  status: "pending" | "approved" | "denied" | "used" | "expired";
  ttl_ms: string;
  created_ms: string;
  expires_ms: string;
  approver: string | null;
  decided_ms: string | null;
  reason: string | null;
  used_ms: string | null;
  policy_version: string | null;
  rule: string | null;
  /** The database's clock when the row was read. */
  now_ms: string;
}

const iso = (ms: string | null): string | null =>
  ms === null ? null : new Date(Number(ms)).toISOString();

function toRecord(r: Row): ApprovalRecord {
  const expired =
    (r.status === "pending" || r.status === "approved") && Number(r.now_ms) >= Number(r.expires_ms);
  return {
    id: r.id,
    principal: r.principal,
    tool: r.tool,
    args_digest: r.args_digest,
    args_preview: r.args_preview,
    estimate: r.estimate,
    assurance: r.assurance,
    status: expired ? "expired" : r.status,
    created_at: iso(r.created_ms)!,
    expires_at: iso(r.expires_ms)!,
    decided_by: r.approver,
    decided_at: iso(r.decided_ms),
    reason: r.reason,
    used_at: iso(r.used_ms),
    policy_version: r.policy_version,
    rule: r.rule,
  };
}

/** The columns every read selects: the row and the database's clock. */
const COLS = `*, ${NOW_MS} AS now_ms`;

/** SQL for one status, as toRecord computes it. */
function statusWhere(status: ApprovalStatus): string {
  switch (status) {
    case "pending":
    case "approved":
      return `status = '${status}' AND expires_ms > ${NOW_MS}`;
    case "expired":
      return `status IN ('pending','approved') AND expires_ms <= ${NOW_MS}`;
    default:
      return `status = '${status}'`;
  }
}

export interface PgApprovalQueueOptions {
  /** How long an approval is kept once over, from its expiry (approvals.keep_decided_s); without it nothing is deleted. */
  keepDecidedS?: number;
  /** Where a subscriber's or the listener's failure is reported. */
  onError?: (e: unknown) => void;
}

export class PgApprovalQueue implements ApprovalQueue {
  private readonly listeners = new Set<ApprovalListener>();
  private readonly origin = newOrigin();
  private readonly listener: PgListener;
  private stopListening: (() => void) | undefined;
  private readonly keepDecidedMs: number | null;
  private lastPruneMs = -Infinity;
  private changes = 0;

  constructor(
    private readonly pool: PgPool,
    private readonly opts: PgApprovalQueueOptions = {},
  ) {
    this.keepDecidedMs =
      opts.keepDecidedS === undefined ? null : Math.round(opts.keepDecidedS * 1000);
    this.listener = new PgListener(pool, APPROVALS_CHANNEL, {
      onError: opts.onError,
      onListening: () => this.changes++,
    });
  }

  /**
   * Hears other replicas from the first subscriber, change mark or listening() on (a CLI that
   * only decides never holds a LISTEN connection): each change counts, and is passed to the
   * subscribers as its record now reads.
   */
  private listen(): void {
    this.stopListening ??= this.listener.on((n) => {
      if (n.origin === this.origin) return;
      this.changes++;
      if (this.listeners.size === 0) return;
      void this.get(n.id).then(
        (record) => record && this.emit(n.type as ApprovalEvent["type"], record),
        (e) => this.opts.onError?.(e),
      );
    });
  }

  /**
   * Calls `fn` after every change, made here (at once) or by another replica (when its
   * notification arrives); returns the unsubscribe function.
   */
  subscribe(fn: ApprovalListener): () => void {
    this.listeners.add(fn);
    this.listen();
    return () => {
      this.listeners.delete(fn);
    };
  }

  /** Resolves once another replica's changes are heard (LISTEN in force). */
  listening(): Promise<void> {
    this.listen();
    return this.listener.ready();
  }

  private emit(type: ApprovalEvent["type"], record: ApprovalRecord): ApprovalRecord {
    for (const fn of this.listeners) {
      try {
        fn({ type, record });
      } catch (e) {
        this.opts.onError?.(e);
      }
    }
    return record;
  }

  /** Runs `write` and the change's notification in one transaction; emits here once committed. */
  private async change(
    type: ApprovalEvent["type"],
    write: (c: PgClient) => Promise<Row>,
  ): Promise<ApprovalRecord> {
    const row = await inTransaction(this.pool, async (c) => {
      const r = await write(c);
      await c.query(notifySql(APPROVALS_CHANNEL, this.origin, type, r.id));
      return r;
    });
    this.changes++;
    return this.emit(type, toRecord(row));
  }

  /**
   * Changes when any approval was created, decided or used, by any replica: a count of the
   * changes made here and heard from the others, and of the listener's (re)connections (what
   * was sent while it was away is unknown, so a reader looks again). In memory: no query. The
   * first call starts listening, and moves the mark once LISTEN is in force.
   */
  changeMark(): string {
    this.listen();
    return `${this.origin}:${this.changes}`;
  }

  /**
   * A new pending request. With `max_pending`, the principal's pending count and the insert are
   * one transaction under the principal's advisory lock: replicas racing cannot overshoot it.
   */
  async create(req: CreateApprovalRequest): Promise<ApprovalRecord> {
    if (!(req.ttl_s > 0)) throw new RangeError("ttl_s must be > 0");
    const id = newApprovalId();
    const ttl = Math.round(req.ttl_s * 1000);
    const rec = await this.change("created", async (c) => {
      if (req.max_pending !== undefined) {
        await c.query("SELECT pg_advisory_xact_lock(hashtextextended($1, $2))", [
          req.principal,
          CAP_LOCK,
        ]);
        const p = await c.query(
          `SELECT COUNT(*) AS n, MIN(expires_ms) AS first, ${NOW_MS} AS now FROM approvals
           WHERE principal = $1 AND ${statusWhere("pending")}`,
          [req.principal],
        );
        const n = Number(p.rows[0].n);
        const now = Number(p.rows[0].now);
        const first = p.rows[0].first === null ? now : Number(p.rows[0].first);
        if (n >= req.max_pending)
          throw new PolicyError(
            "approval_limit",
            `${req.principal} already has ${n} approval requests waiting for an operator (the limit is ${req.max_pending}); this request was refused and the waiting ones are kept. Wait until one is decided or expires (the next at ${new Date(first).toISOString()}), then call again.`,
            { pending: n, limit: req.max_pending, retry_after_ms: Math.max(0, first - now) },
          );
      }
      // One reading of the clock: the expiry is exactly one TTL after the creation.
      const r = await c.query(
        `WITH t AS (SELECT ${NOW_MS} AS now)
         INSERT INTO approvals (id, principal, tool, args_digest, args_preview, estimate, assurance,
           status, ttl_ms, created_ms, expires_ms, policy_version, rule)
         VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending', $8, (SELECT now FROM t),
           (SELECT now FROM t) + $8::bigint, $9, $10)
         RETURNING ${COLS}`,
        [
          id,
          req.principal,
          req.tool,
          req.args_digest,
          JSON.stringify(req.args_preview ?? null),
          req.estimate ? JSON.stringify(req.estimate) : null,
          req.assurance ?? "token",
          ttl,
          req.policy_version ?? null,
          req.rule ?? null,
        ],
      );
      return r.rows[0] as Row;
    });
    if (Date.now() - this.lastPruneMs >= 60_000) await this.prune();
    return rec;
  }

  async get(id: string): Promise<ApprovalRecord | undefined> {
    const r = await this.pool.query(`SELECT ${COLS} FROM approvals WHERE id = $1`, [id]);
    return r.rows[0] ? toRecord(r.rows[0] as Row) : undefined;
  }

  async list(filter: ApprovalListFilter = {}): Promise<ApprovalRecord[]> {
    return (await this.page(filter)).items;
  }

  /**
   * One page: pending approvals first, all of them, soonest to expire first, then the rest,
   * newest first; counts and page from one snapshot (REPEATABLE READ).
   */
  page(filter: ApprovalListFilter = {}): Promise<ApprovalPage> {
    const limit = Math.max(0, Math.floor(filter.limit ?? 100));
    const offset = Math.max(0, Math.floor(filter.offset ?? 0));
    const PENDING = statusWhere("pending");
    const HISTORY = `NOT (${PENDING})`;
    const pendingOrder = "expires_ms ASC, id ASC";
    const historyOrder = "created_ms DESC, id DESC";
    return inTransaction(this.pool, async (c) => {
      await c.query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY");
      const count = async (where: string) =>
        Number((await c.query(`SELECT COUNT(*) AS n FROM approvals WHERE ${where}`)).rows[0].n);
      const rows = async (where: string, order: string, lim: number, off: number) =>
        lim <= 0
          ? []
          : ((
              await c.query(
                `SELECT ${COLS} FROM approvals WHERE ${where} ORDER BY ${order} LIMIT $1 OFFSET $2`,
                [lim, off],
              )
            ).rows as Row[]);
      const pending_total = await count(PENDING);
      const history_total = await count(HISTORY);
      let page: Row[];
      if (filter.status) {
        const order = filter.status === "pending" ? pendingOrder : historyOrder;
        page = await rows(statusWhere(filter.status), order, limit, offset);
      } else {
        const first = await rows(PENDING, pendingOrder, limit, offset);
        page = first.concat(
          await rows(
            HISTORY,
            historyOrder,
            limit - first.length,
            Math.max(0, offset - pending_total),
          ),
        );
      }
      return { items: page.map(toRecord), pending_total, history_total, offset, limit };
    });
  }

  /** Deletes approvals over for longer than keepDecidedS (counted from their expiry). */
  async prune(): Promise<number> {
    if (this.keepDecidedMs === null) return 0;
    this.lastPruneMs = Date.now();
    const r = await this.pool.query(
      `DELETE FROM approvals WHERE expires_ms < ${NOW_MS} - $1::bigint`,
      [this.keepDecidedMs],
    );
    return r.rowCount ?? 0;
  }

  /**
   * A pending or approved, unexpired approval for exactly this call (an approved one first);
   * with `policyVersion`, one requested under it or before versions were recorded.
   */
  async findOpen(
    principal: string,
    tool: string,
    digest: string,
    policyVersion?: string,
  ): Promise<ApprovalRecord | undefined> {
    const r = await this.pool.query(
      `SELECT ${COLS} FROM approvals WHERE principal = $1 AND tool = $2 AND args_digest = $3
         AND status IN ('pending','approved') AND expires_ms > ${NOW_MS}
         AND ($4::text IS NULL OR policy_version IS NULL OR policy_version = $4)
       ORDER BY (status = 'approved') DESC, created_ms DESC LIMIT 1`,
      [principal, tool, digest, policyVersion ?? null],
    );
    return r.rows[0] ? toRecord(r.rows[0] as Row) : undefined;
  }

  /**
   * The one decision: an UPDATE that finds the approval pending, unexpired and not the
   * approver's own. Whoever's UPDATE returns no row is told why (read after the fact).
   */
  private decide(
    id: string,
    approver: string,
    decision: "approved" | "denied",
    reason?: string,
  ): Promise<ApprovalRecord> {
    return this.change("decided", async (c) => {
      // An approval restarts the TTL: the agent gets the full window to come back and use it.
      const r = await c.query(
        `UPDATE approvals SET status = $2, approver = $3, reason = $4, decided_ms = ${NOW_MS},
           expires_ms = CASE WHEN $2 = 'approved' THEN ${NOW_MS} + ttl_ms ELSE expires_ms END
         WHERE id = $1 AND status = 'pending' AND expires_ms > ${NOW_MS} AND principal <> $3
         RETURNING ${COLS}`,
        [id, decision, approver, reason ?? null],
      );
      if (r.rows[0]) return r.rows[0] as Row;
      throw whyNotDecided(await this.getOn(c, id), id, approver);
    });
  }

  private async getOn(c: PgClient, id: string): Promise<ApprovalRecord | undefined> {
    const r = await c.query(`SELECT ${COLS} FROM approvals WHERE id = $1`, [id]);
    return r.rows[0] ? toRecord(r.rows[0] as Row) : undefined;
  }

  approve(id: string, approver: string): Promise<ApprovalRecord> {
    return this.decide(id, approver, "approved");
  }

  deny(id: string, approver: string, reason?: string): Promise<ApprovalRecord> {
    return this.decide(id, approver, "denied", reason);
  }

  async check(
    id: string,
    principal: string,
    tool: string,
    digest: string,
  ): Promise<ApprovalRecord> {
    const rec = await this.get(id);
    const err = approvalUsableError(rec, id, principal, tool, digest);
    if (err) throw err;
    return rec!;
  }

  /** Uses an approved approval for exactly this call, once: one conditional UPDATE. */
  consume(id: string, principal: string, tool: string, digest: string): Promise<ApprovalRecord> {
    return this.change("used", async (c) => {
      const r = await c.query(
        `UPDATE approvals SET status = 'used', used_ms = ${NOW_MS}
         WHERE id = $1 AND status = 'approved' AND principal = $2 AND tool = $3
           AND args_digest = $4 AND expires_ms > ${NOW_MS}
         RETURNING ${COLS}`,
        [id, principal, tool, digest],
      );
      if (r.rows[0]) return r.rows[0] as Row;
      const rec = await this.getOn(c, id);
      throw (
        approvalUsableError(rec, id, principal, tool, digest) ??
        // Approved when read just now: another caller's UPDATE won between the two statements.
        new PolicyError(
          "approval_used",
          `Approval ${id} was already used; approvals are single-use. Call again without approval_id to request a new one.`,
          { approval_id: id },
        )
      );
    });
  }

  /**
   * Gives an approval back after the call that consumed it was interrupted: only one that is
   * `used`, bound to this principal, tool and digest, and not past its expiry.
   */
  async restoreUsed(
    id: string,
    principal: string,
    tool: string,
    digest: string,
  ): Promise<ApprovalRecord | undefined> {
    try {
      return await this.change("decided", async (c) => {
        const r = await c.query(
          `UPDATE approvals SET status = 'approved', used_ms = NULL
           WHERE id = $1 AND status = 'used' AND principal = $2 AND tool = $3 AND args_digest = $4
             AND expires_ms > ${NOW_MS}
           RETURNING ${COLS}`,
          [id, principal, tool, digest],
        );
        if (!r.rows[0]) throw NOT_RESTORED;
        return r.rows[0] as Row;
      });
    } catch (e) {
      if (e === NOT_RESTORED) return undefined;
      throw e;
    }
  }

  /** Stops hearing other replicas (the pool is the caller's to end). */
  async close(): Promise<void> {
    this.stopListening?.();
    this.listeners.clear();
    await this.listener.close();
  }
}

const NOT_RESTORED = new Error("not restored");

/** Why a decision's UPDATE found nothing to decide, in SqliteApprovalQueue's words. */
function whyNotDecided(rec: ApprovalRecord | undefined, id: string, approver: string): PolicyError {
  if (!rec)
    return new PolicyError(
      "approval_not_found",
      `No approval ${id} exists; list them with \`tpu-mcp approvals list\`.`,
      { approval_id: id },
    );
  if (rec.principal === approver)
    return new PolicyError(
      "approval_self_grant",
      `${approver} requested approval ${id} and cannot decide it; another identity with approvals:grant must.`,
      { approval_id: id },
    );
  if (rec.status === "expired")
    return new PolicyError(
      "approval_expired",
      `Approval ${id} expired at ${rec.expires_at}; the agent must request a new one.`,
      { approval_id: id },
    );
  return new PolicyError(
    "approval_already_decided",
    `Approval ${id} is already ${rec.status}; decisions are final.`,
    { approval_id: id, status: rec.status },
  );
}
