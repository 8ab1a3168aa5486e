// Jobs on the shared store, with owners and leases. A job runs in the replica that started it
// (its owner), which renews the lease of all its running jobs in one UPDATE every third of the
// lease; only a lease that expired (its owner stopped renewing: killed, partitioned) marks a job
// interrupted, so one replica's restart never touches another's jobs. get and cancel work from
// any replica: a cancel is a flag on the row, which the owner reads on its next renewal and
// turns into the job's abort. Times are the database's clock (replicas' clocks may disagree).
import { randomBytes } from "node:crypto";
import { keepPartialCancel } from "../../../runtime/types.js";
import { toToolError } from "../../../tools/errors.js";
import type { JobRecord, Jobs, JobStatus, Runner } from "../../../tools/stores/jobs.js";
import { NOW_MS, type PgPool } from "../../stores/pg/pool.js";

/** A job as the tools see it, with the replica that runs it. */
export type PgJobRecord = JobRecord & { owner: string };

const COLUMNS =
  "job_id, tool, principal, status, owner, progress, total, message, result, error, created_ms, updated_ms";

function toRecord(r: Record<string, unknown>): PgJobRecord {
  return {
    job_id: r.job_id as string,
    tool: r.tool as string,
    principal: r.principal as string,
    status: r.status as JobStatus,
    owner: r.owner as string,
    progress: (r.progress as number | null) ?? null,
    total: (r.total as number | null) ?? null,
    message: (r.message as string | null) ?? null,
    result: (r.result as Record<string, unknown> | null) ?? null,
    error: (r.error as { code: string; message: string } | null) ?? null,
    created_at: new Date(Number(r.created_ms)).toISOString(),
    updated_at: new Date(Number(r.updated_ms)).toISOString(),
  };
}

const INTERRUPTED = {
  code: "worker_died",
  message:
    "the replica running this job stopped before it finished (its lease expired); it was not resumed, call the tool again",
};

export class PgJobs implements Jobs {
  private readonly live = new Map<string, { ctrl: AbortController; done: Promise<void> }>();
  private readonly timer: NodeJS.Timeout;
  private readonly leaseMs: number;
  private readonly onError?: (e: unknown) => void;

  /** The sweep of this replica's previous run's jobs (undefined: not yet done, or failed). */
  private swept?: Promise<void>;

  private constructor(
    private readonly pool: PgPool,
    private readonly replica: string,
    opts: { leaseS: number; onError?: (e: unknown) => void },
  ) {
    this.onError = opts.onError;
    this.leaseMs = Math.round(opts.leaseS * 1000);
    this.timer = setInterval(() => void this.tick().catch(() => {}), this.leaseMs / 3);
    this.timer.unref();
  }

  /**
   * Opens the replica's jobs. What a previous run of this same replica left `running` is over
   * (that process is gone): marked interrupted now. Every other replica's jobs are left to their
   * leases.
   */
  static async open(
    pool: PgPool,
    replica: string,
    opts: { leaseS: number; onError?: (e: unknown) => void },
  ): Promise<PgJobs> {
    const jobs = PgJobs.opening(pool, replica, opts);
    await jobs.ready();
    return jobs;
  }

  /**
   * The replica's jobs at once, for a builder that cannot wait: the sweep of its previous run's
   * jobs starts now, and every start waits for it (a job of this run is never swept). `ready()`
   * resolves once it is done.
   */
  static opening(
    pool: PgPool,
    replica: string,
    opts: { leaseS: number; onError?: (e: unknown) => void },
  ): PgJobs {
    const jobs = new PgJobs(pool, replica, opts);
    jobs.ready().catch(() => {}); // a failed sweep is tried again by the next start
    return jobs;
  }

  /** Marks this replica's previous run's `running` jobs interrupted, once (again after a failure). */
  ready(): Promise<void> {
    this.swept ??= this.pool
      .query(
        `UPDATE jobs SET status = 'interrupted', error = $2, updated_ms = ${NOW_MS}
         WHERE owner = $1 AND status = 'running'`,
        [this.replica, JSON.stringify(INTERRUPTED)],
      )
      .then(
        () => {},
        (e: unknown) => {
          this.swept = undefined;
          throw e;
        },
      );
    return this.swept;
  }

  async start(tool: string, principal: string, run: Runner): Promise<PgJobRecord> {
    await this.ready();
    const id = `job_${randomBytes(12).toString("hex")}`;
    await this.pool.query(
      `INSERT INTO jobs (job_id, tool, principal, status, owner, lease_until_ms, created_ms, updated_ms)
       VALUES ($1, $2, $3, 'running', $4, ${NOW_MS} + $5::bigint, ${NOW_MS}, ${NOW_MS})`,
      [id, tool, principal, this.replica, this.leaseMs],
    );
    const ctrl = new AbortController();
    const finish = (status: JobStatus, result: unknown, error: unknown) =>
      this.pool.query(
        `UPDATE jobs SET status = $2, result = $3, error = $4, updated_ms = ${NOW_MS}
         WHERE job_id = $1 AND status = 'running'`,
        [
          id,
          status,
          result === null ? null : JSON.stringify(result),
          error === null ? null : JSON.stringify(error),
        ],
      );
    const progress = (p: number, total?: number, message?: string) =>
      void this.pool
        .query(
          `UPDATE jobs SET progress = $2, total = $3, message = $4, updated_ms = ${NOW_MS}
           WHERE job_id = $1 AND status = 'running'`,
          [id, p, total ?? null, message ?? null],
        )
        .catch(() => {});
    const done = (async () => {
      try {
        const result = await run(ctrl.signal, progress);
        const status: JobStatus =
          result && (result as { cancelled?: unknown }).cancelled === true
            ? "cancelled"
            : "succeeded";
        await finish(status, result, null);
      } catch (e) {
        const status: JobStatus = ctrl.signal.aborted ? "cancelled" : "failed";
        // The same catalogue codes and redaction (no paths, no stack) as SQLite's jobs.
        const err =
          status === "cancelled"
            ? { code: "cancelled", message: "the job was cancelled" }
            : toToolError(e);
        if (status === "failed" && err.code === "internal") this.onError?.(e);
        await finish(status, null, { code: err.code, message: err.message }).catch(() => {});
      } finally {
        this.live.delete(id);
      }
    })();
    this.live.set(id, { ctrl, done });
    return (await this.row(id))!;
  }

  private async row(jobId: string): Promise<PgJobRecord | undefined> {
    const r = await this.pool.query(`SELECT ${COLUMNS} FROM jobs WHERE job_id = $1`, [jobId]);
    return r.rows[0] ? toRecord(r.rows[0]) : undefined;
  }

  /** From any replica; another principal's job is indistinguishable from a missing one. */
  async get(jobId: string, principal: string): Promise<PgJobRecord | undefined> {
    const r = await this.row(jobId);
    return r && r.principal === principal ? r : undefined;
  }

  /** From any replica: flags the job; its owner aborts it at its next renewal (at once if it is this one). */
  async cancel(jobId: string, principal: string): Promise<PgJobRecord | undefined> {
    const r = await this.pool.query(
      "UPDATE jobs SET cancel_requested = true WHERE job_id = $1 AND principal = $2 AND status = 'running'",
      [jobId, principal],
    );
    if (r.rowCount === 1)
      this.live.get(jobId)?.ctrl.abort(keepPartialCancel("cancelled by cancel_job"));
    return this.get(jobId, principal);
  }

  /** Every principal's jobs, newest first: for the operator console, never for a tool. */
  async listAll(limit = 100): Promise<PgJobRecord[]> {
    const r = await this.pool.query(
      `SELECT ${COLUMNS} FROM jobs ORDER BY created_ms DESC, job_id LIMIT $1`,
      [limit],
    );
    return r.rows.map(toRecord);
  }

  /** One principal's jobs, newest first (tasks/list), from any replica. */
  async listOf(principal: string, limit = 100): Promise<PgJobRecord[]> {
    const r = await this.pool.query(
      `SELECT ${COLUMNS} FROM jobs WHERE principal = $1 ORDER BY created_ms DESC, job_id LIMIT $2`,
      [principal, limit],
    );
    return r.rows.map(toRecord);
  }

  /** An operator's cancel (console, admin scope): any principal's running job, from any replica. */
  async cancelAny(jobId: string): Promise<PgJobRecord | undefined> {
    const r = await this.pool.query(
      "UPDATE jobs SET cancel_requested = true WHERE job_id = $1 AND status = 'running'",
      [jobId],
    );
    if (r.rowCount === 1)
      this.live.get(jobId)?.ctrl.abort(keepPartialCancel("cancelled by an operator"));
    return this.row(jobId);
  }

  /** This replica's running jobs. */
  running(): number {
    return this.live.size;
  }

  /** Resolves when this replica's job ends (at once for another replica's). */
  async settled(jobId: string): Promise<void> {
    await this.live.get(jobId)?.done;
  }

  /**
   * One renewal: this replica's running jobs get a fresh lease, those flagged cancelled are
   * aborted, and any replica's job whose lease expired is marked interrupted.
   */
  async tick(): Promise<void> {
    if (this.live.size > 0) {
      const r = await this.pool.query(
        `UPDATE jobs SET lease_until_ms = ${NOW_MS} + $2::bigint
         WHERE owner = $1 AND status = 'running' AND job_id = ANY($3) RETURNING job_id, cancel_requested`,
        [this.replica, this.leaseMs, [...this.live.keys()]],
      );
      for (const row of r.rows as { job_id: string; cancel_requested: boolean }[])
        if (row.cancel_requested)
          this.live.get(row.job_id)?.ctrl.abort(keepPartialCancel("cancelled by cancel_job"));
    }
    await this.reapExpired();
  }

  /** Marks interrupted every running job whose lease expired; returns their ids. */
  async reapExpired(): Promise<string[]> {
    const r = await this.pool.query(
      `UPDATE jobs SET status = 'interrupted', error = $1, updated_ms = ${NOW_MS}
       WHERE status = 'running' AND lease_until_ms < ${NOW_MS} RETURNING job_id`,
      [JSON.stringify(INTERRUPTED)],
    );
    return r.rows.map((x: { job_id: string }) => x.job_id);
  }

  /** Stops renewing; running jobs are aborted (their rows end cancelled). */
  async close(): Promise<void> {
    clearInterval(this.timer);
    for (const { ctrl } of this.live.values()) ctrl.abort(new Error("replica shutting down"));
    await Promise.all([...this.live.values()].map((j) => j.done));
  }
}
