// Long work (loads, benchmarks) that outlives a client's request timeout. Jobs are persisted in
// SQLite so a restart never loses a result and never runs a job twice: a job that was running
// when the server stopped is marked `interrupted`, not resumed.
import { randomBytes } from "node:crypto";
import { z } from "zod";
import { resolveDb, type SqliteDb } from "../../policies/sqlite.js";
import { toToolError } from "../errors.js";
import { keepPartialCancel } from "../../runtime/types.js";

export type JobStatus = "running" | "succeeded" | "failed" | "cancelled" | "interrupted";

export interface JobRecord {
  job_id: string;
  tool: string;
  principal: string;
  status: JobStatus;
  progress: number | null;
  total: number | null;
  message: string | null;
  result: Record<string, unknown> | null;
  error: { code: string; message: string } | null;
  created_at: string;
  updated_at: string;
}

export type Runner = (
  signal: AbortSignal,
  progress: (p: number, total?: number, message?: string) => void,
) => Promise<Record<string, unknown>>;

/**
 * Long jobs and their results. Every read and write returns a promise. SQLite (SqliteJobs):
 * node-local, answered inside the call (a job runs in the process that started it, and a start
 * marks every `running` row interrupted, so the file must not be shared by two running servers).
 * The shared store (server/app/postgres/jobs.ts): a job has an owner and a lease, and get and
 * cancel work from any replica.
 */
export interface Jobs {
  start(tool: string, principal: string, run: Runner): Promise<JobRecord>;
  get(jobId: string, principal: string): Promise<JobRecord | undefined>;
  cancel(jobId: string, principal: string): Promise<JobRecord | undefined>;
  /** Every principal's jobs, newest first: for the operator console, never for a tool. */
  listAll(limit?: number): Promise<JobRecord[]>;
  /** One principal's jobs, newest first (tasks/list): never another's. */
  listOf(principal: string, limit?: number): Promise<JobRecord[]>;
  /** An operator's cancel (console, admin scope): any principal's running job. */
  cancelAny(jobId: string): Promise<JobRecord | undefined>;
  /** Resolves when this process's job leaves `running` (or at once). */
  settled(jobId: string): Promise<void>;
  /** The jobs running in this process. */
  running(): number;
  close(): void | Promise<void>;
}

interface Row {
  job_id: string;
  tool: string;
  principal: string;
  status: JobStatus;
  progress: number | null;
  total: number | null;
  message: string | null;
  result: string | null;
  error: string | null;
  created_at: string;
  updated_at: string;
}

export class SqliteJobs implements Jobs {
  private readonly db: SqliteDb;
  private readonly owned: boolean;
  private readonly live = new Map<string, { ctrl: AbortController; done: Promise<void> }>();
  private readonly now: () => Date;
  private readonly onError?: (e: unknown) => void;

  constructor(
    pathOrDb: string | SqliteDb,
    opts: { now?: () => Date; onError?: (e: unknown) => void } = {},
  ) {
    this.now = opts.now ?? (() => new Date());
    this.onError = opts.onError;
    ({ db: this.db, owned: this.owned } = resolveDb(pathOrDb));
    this.db.exec(`CREATE TABLE IF NOT EXISTS jobs (
      job_id TEXT PRIMARY KEY, tool TEXT NOT NULL, principal TEXT NOT NULL, status TEXT NOT NULL,
      progress REAL, total REAL, message TEXT, result TEXT, error TEXT,
      created_at TEXT NOT NULL, updated_at TEXT NOT NULL)`);
    // Whatever was running belonged to a process that is gone.
    this.db
      .prepare(
        `UPDATE jobs SET status = 'interrupted', updated_at = ?, error = ? WHERE status = 'running'`,
      )
      .run(
        this.now().toISOString(),
        JSON.stringify({
          code: "worker_died",
          message:
            "the server restarted before this job finished; it was not resumed, call the tool again",
        }),
      );
  }

  private row(jobId: string): Row | undefined {
    return this.db.prepare(`SELECT * FROM jobs WHERE job_id = ?`).get(jobId) as Row | undefined;
  }

  private toRecord(r: Row): JobRecord {
    return {
      ...r,
      result: r.result ? JSON.parse(r.result) : null,
      error: r.error ? JSON.parse(r.error) : null,
    };
  }

  async start(tool: string, principal: string, run: Runner): Promise<JobRecord> {
    const jobId = `job_${randomBytes(12).toString("hex")}`;
    const t = this.now().toISOString();
    this.db
      .prepare(
        `INSERT INTO jobs (job_id, tool, principal, status, created_at, updated_at) VALUES (?, ?, ?, 'running', ?, ?)`,
      )
      .run(jobId, tool, principal, t, t);
    const ctrl = new AbortController();
    const setProgress = this.db.prepare(
      `UPDATE jobs SET progress = ?, total = ?, message = ?, updated_at = ? WHERE job_id = ? AND status = 'running'`,
    );
    const finishStmt = this.db.prepare(
      `UPDATE jobs SET status = ?, result = ?, error = ?, updated_at = ? WHERE job_id = ? AND status = 'running'`,
    );
    // After close() the database is gone; the restart path marks the job interrupted instead.
    const finish = { run: (...a: unknown[]) => this.db.open && finishStmt.run(...a) };
    const done = (async () => {
      try {
        const result = await run(ctrl.signal, (p, total, message) => {
          if (this.db.open)
            setProgress.run(p, total ?? null, message ?? null, this.now().toISOString(), jobId);
        });
        const status: JobStatus =
          result && (result as any).cancelled === true ? "cancelled" : "succeeded";
        finish.run(status, JSON.stringify(result), null, this.now().toISOString(), jobId);
      } catch (e) {
        const status: JobStatus = ctrl.signal.aborted ? "cancelled" : "failed";
        // The same catalogue codes and redaction (no paths, no stack) as a tool's own answer.
        const err =
          status === "cancelled"
            ? { code: "cancelled", message: "the job was cancelled" }
            : toToolError(e);
        if (status === "failed" && err.code === "internal") this.onError?.(e);
        finish.run(
          status,
          null,
          JSON.stringify({ code: err.code, message: err.message }),
          this.now().toISOString(),
          jobId,
        );
      } finally {
        this.live.delete(jobId);
      }
    })();
    this.live.set(jobId, { ctrl, done });
    return this.toRecord(this.row(jobId)!);
  }

  async get(jobId: string, principal: string): Promise<JobRecord | undefined> {
    const r = this.row(jobId);
    // Another principal's job is indistinguishable from a missing one.
    return r && r.principal === principal ? this.toRecord(r) : undefined;
  }

  async cancel(jobId: string, principal: string): Promise<JobRecord | undefined> {
    const r = this.row(jobId);
    if (!r || r.principal !== principal) return undefined;
    this.live.get(jobId)?.ctrl.abort(keepPartialCancel("cancelled by cancel_job"));
    return this.toRecord(r);
  }

  /** Every principal's jobs, newest first: for the operator console, never for a tool. */
  async listAll(limit = 100): Promise<JobRecord[]> {
    const rows = this.db
      .prepare(`SELECT * FROM jobs ORDER BY created_at DESC, job_id LIMIT ?`)
      .all(limit) as Row[];
    return rows.map((r) => this.toRecord(r));
  }

  async listOf(principal: string, limit = 100): Promise<JobRecord[]> {
    const rows = this.db
      .prepare(`SELECT * FROM jobs WHERE principal = ? ORDER BY created_at DESC, job_id LIMIT ?`)
      .all(principal, limit) as Row[];
    return rows.map((r) => this.toRecord(r));
  }

  /** An operator's cancel (console, admin scope): any principal's running job. */
  async cancelAny(jobId: string): Promise<JobRecord | undefined> {
    const r = this.row(jobId);
    if (!r) return undefined;
    this.live.get(jobId)?.ctrl.abort(keepPartialCancel("cancelled by an operator"));
    return this.toRecord(r);
  }

  async settled(jobId: string): Promise<void> {
    await this.live.get(jobId)?.done;
  }

  running(): number {
    return this.live.size;
  }

  close(): void {
    for (const { ctrl } of this.live.values()) ctrl.abort(new Error("server shutting down"));
    if (this.owned && this.db.open) this.db.close();
  }
}

/** What a tool called with `wait: false` answers at once. */
export const JobRef = z.object({
  job_id: z.string(),
  status: z.string(),
  message: z.string(),
});
