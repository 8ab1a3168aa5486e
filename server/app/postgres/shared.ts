// The state replicas must agree on, in Postgres: each promise is one transaction, so it holds
// however many replicas race for it.
//
// - Budget admission is budget.ts (PgBudget); rate limits rate.ts; jobs jobs.ts.
// - (Approvals, decided once and used once, are approvals.ts's PgApprovalQueue.)
// - A request state's nonce is consumed once: its INSERT conflicts on every replay.
// - The audit trail has ONE chain with one head row: an append takes the head under a row lock,
//   so records from every replica are in one total order, and `audit verify` and an export
//   check one head, as with SQLite. (Per-replica chains would spare that lock, but a verifier
//   would have to be told every replica's head, and a replica removed from the deployment could
//   drop its chain's tail unseen; the lock costs one round trip per append.)
import { createHmac } from "node:crypto";
import { inTransaction, NOW_MS, type PgPool } from "./pool.js";

export { PgBudget } from "./budget.js";

export class PgRequestStates {
  private lastPruneMs = -Infinity;

  /**
   * `keepS`: how long a consumed nonce is remembered. A state is refused as expired once past
   * its own expiry (the elicitation timeout, minutes), so a nonce older than that can never be
   * presented again; the default keeps a day.
   */
  constructor(
    private readonly pool: PgPool,
    private readonly replica: string,
    private readonly opts: { keepS?: number } = {},
  ) {}

  /** True the first time `nonce` is presented anywhere; false on every replay. */
  async consume(nonce: string): Promise<boolean> {
    const r = await this.pool.query(
      `INSERT INTO consumed_states (nonce, consumed_ms, replica) VALUES ($1, ${NOW_MS}, $2)
       ON CONFLICT (nonce) DO NOTHING`,
      [nonce, this.replica],
    );
    if (Date.now() - this.lastPruneMs >= 600_000) await this.prune();
    return r.rowCount === 1;
  }

  /** Forgets nonces consumed longer than `keepS` ago; how many. */
  async prune(): Promise<number> {
    this.lastPruneMs = Date.now();
    const r = await this.pool.query(
      `DELETE FROM consumed_states WHERE consumed_ms < ${NOW_MS} - $1::bigint`,
      [Math.round((this.opts.keepS ?? 86_400) * 1000)],
    );
    return r.rowCount ?? 0;
  }
}

export interface ChainVerify {
  ok: boolean;
  checked: number;
  /** The first record that does not chain, with why. */
  bad?: { seq: number; reason: string };
}

/** The audit trail as one HMAC chain with one head row, appended by every replica in turn. */
export class PgAuditChain {
  constructor(
    private readonly pool: PgPool,
    private readonly key: Buffer,
    private readonly replica: string,
  ) {}

  private link(prev: string, seq: number, record: string): string {
    return createHmac("sha256", this.key).update(`${seq}\n${prev}\n${record}`).digest("hex");
  }

  /** Appends under the head's row lock: the record's seq and link are the head's successors. */
  append(record: Record<string, unknown>): Promise<{ seq: number; hash: string }> {
    const text = JSON.stringify(record);
    return inTransaction(this.pool, async (c) => {
      const h = await c.query("SELECT seq, hash FROM audit_head WHERE id = 1 FOR UPDATE");
      const seq = Number(h.rows[0].seq) + 1;
      const prev = h.rows[0].hash as string;
      const hash = this.link(prev, seq, text);
      await c.query(
        "INSERT INTO audit_records (seq, record, prev_hash, hash, replica) VALUES ($1, $2, $3, $4, $5)",
        [seq, text, prev, hash, this.replica],
      );
      await c.query("UPDATE audit_head SET seq = $1, hash = $2 WHERE id = 1", [seq, hash]);
      return { seq, hash };
    });
  }

  /** Walks the whole chain in one snapshot: every link recomputed, the last one the head's. */
  verify(): Promise<ChainVerify> {
    return inTransaction(this.pool, async (c) => {
      await c.query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ");
      const head = (await c.query("SELECT seq, hash FROM audit_head WHERE id = 1")).rows[0];
      const rows = (
        await c.query("SELECT seq, record, prev_hash, hash FROM audit_records ORDER BY seq")
      ).rows as { seq: string; record: string; prev_hash: string; hash: string }[];
      let prev = "";
      let checked = 0;
      for (const r of rows) {
        const seq = Number(r.seq);
        if (seq !== checked + 1)
          return { ok: false, checked, bad: { seq, reason: "a record is missing before it" } };
        if (r.prev_hash !== prev)
          return {
            ok: false,
            checked,
            bad: { seq, reason: "its link to the previous record is wrong" },
          };
        if (this.link(prev, seq, r.record) !== r.hash)
          return {
            ok: false,
            checked,
            bad: { seq, reason: "its content does not match its hash (edited)" },
          };
        prev = r.hash;
        checked++;
      }
      if (Number(head.seq) !== checked || head.hash !== prev)
        return {
          ok: false,
          checked,
          bad: {
            seq: checked,
            reason: "the head does not name the last record (records were removed)",
          },
        };
      return { ok: true, checked };
    });
  }
}
