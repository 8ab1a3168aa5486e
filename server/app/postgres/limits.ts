// One replica's counters and server-side stores on the shared store, built from its pool and the
// config: what server/app/storage.ts hands out for `storage.postgres` (the budget, calls in
// flight, rate limits, reports, the control channel, jobs). Opening them drops what a previous
// run of this same replica held (budget holds, running jobs); every other replica's state is
// left to its leases.
import type { ServerConfig } from "../../config/config.js";
import { PgBudget } from "./budget.js";
import { PgCallsInFlight } from "./calls.js";
import { PgControlChannel } from "./control.js";
import { PgJobs } from "./jobs.js";
import type { PgPool } from "./pool.js";
import { PgRateLimit } from "./rate.js";
import { PgReports } from "./reports.js";

export interface PgLimits {
  /** SHARED: the budget lines, every replica's holds and overruns (BudgetLedger). */
  budget: PgBudget;
  /** SHARED store, settled per replica: the calls this replica admitted and has not charged. */
  calls: PgCallsInFlight;
  /** SHARED: calls per minute per principal. */
  rateLimiter: PgRateLimit;
  /** SHARED: failed authentications server-wide, `initialize` per principal and per address. */
  httpRates: {
    authFailures: PgRateLimit;
    initPerPrincipal: PgRateLimit;
    initPerAddress: PgRateLimit;
  };
  /** SHARED: benchmark reports and measured calls. */
  reports: PgReports;
  /** SHARED: the workers' desired state and what the servers observe. */
  channel: PgControlChannel;
  /** SHARED: jobs with owners and leases (get and cancel from any replica). */
  jobs: PgJobs;
  /** Stops this replica's renewals and writes what it queued; the pool stays open (its owner's). */
  close(): Promise<void>;
}

export async function openPgLimits(
  pool: PgPool,
  config: Pick<ServerConfig, "policy" | "http" | "storage">,
  opts: { replica: string; jobLeaseS?: number; onJobError?: (e: unknown) => void },
): Promise<PgLimits> {
  const { limits } = config.policy;
  const budget = await PgBudget.open(pool, {
    limitS: limits.budget.device_seconds_per_window,
    windowS: limits.budget.window_s,
    replica: opts.replica,
  });
  const jobs = await PgJobs.open(pool, opts.replica, {
    // How long a job's owner may stop renewing before the job is interrupted.
    leaseS:
      opts.jobLeaseS ?? ("postgres" in config.storage ? config.storage.postgres.job_lease_s : 30),
    onError: opts.onJobError,
  });
  const http = config.http;
  const calls = new PgCallsInFlight(pool, opts.replica);
  const reports = new PgReports(pool);
  return {
    budget,
    calls,
    rateLimiter: new PgRateLimit(pool, "principal", limits.rate_limit.per_principal_per_minute),
    httpRates: {
      authFailures: new PgRateLimit(pool, "auth_failures", http.auth_limit.failures_per_minute),
      initPerPrincipal: new PgRateLimit(
        pool,
        "initialize_per_principal",
        http.initialize_rate.per_principal_per_minute,
      ),
      initPerAddress: new PgRateLimit(
        pool,
        "initialize_per_address",
        http.initialize_rate.per_address_per_minute,
      ),
    },
    reports,
    channel: new PgControlChannel(pool),
    jobs,
    async close() {
      budget.close();
      calls.close();
      await jobs.close();
      await reports.close();
    },
  };
}
