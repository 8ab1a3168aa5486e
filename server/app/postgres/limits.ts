// One replica's counters and server-side stores on the shared store, built from its pool and the
// config: what server/app/storage.ts hands out for `storage.postgres`. openPgServerStores builds
// the stores only a running server opens (the HTTP surface's rates, reports, the control channel,
// jobs, console sessions, stored outputs); openPgLimits the gate's counters (the budget, calls
// in flight, the per-principal rate limit). Opening them drops what a previous run of this same
// replica held (budget holds, running jobs); every other replica's state is left to its leases.
import type { ServerConfig } from "../../config/config.js";
import { PgBudget } from "./budget.js";
import { PgCallsInFlight } from "./calls.js";
import { PgConsoleSessions } from "./console_sessions.js";
import { PgControlChannel } from "./control.js";
import { PgJobs } from "./jobs.js";
import { PgOutputs } from "./outputs.js";
import type { PgPool } from "../../stores/pg/pool.js";
import { PgRateLimit } from "./rate.js";
import { PgReports } from "./reports.js";

/** The stores a running replica serves on besides the policy stores, all SHARED. */
export interface PgServerStores {
  /** Failed authentications server-wide, `initialize` per principal and per address. */
  httpRates: {
    authFailures: PgRateLimit;
    initPerPrincipal: PgRateLimit;
    initPerAddress: PgRateLimit;
  };
  /** Benchmark reports and measured calls. */
  reports: PgReports;
  /** The workers' desired state and what the servers observe. */
  channel: PgControlChannel;
  /** Jobs with owners and leases (get and cancel from any replica). */
  jobs: PgJobs;
  /** The console's sessions, served and signed out by any replica. */
  consoleSessions: PgConsoleSessions;
  /** Stored outputs (tpu://outputs/…), read back through any replica, one bound in bytes. */
  outputs: PgOutputs;
  /** Stops this replica's renewals and writes what it queued; the pool stays open (its owner's). */
  close(): Promise<void>;
}

export interface PgServerStoreOptions {
  /** This replica's id: the owner of the jobs it starts. */
  replica: string;
  /** A job's lease (s); default: the config's storage.postgres.job_lease_s. */
  jobLeaseS?: number;
  /** Where a job's unexpected failure is reported. */
  onJobError?: (e: unknown) => void;
}

/**
 * The server stores of one replica, at once: the sweep of its previous run's jobs runs in the
 * background (`jobs.ready()`), and no job of this run starts before it is done.
 */
export function openPgServerStores(
  pool: PgPool,
  config: Pick<ServerConfig, "http" | "storage" | "inference">,
  opts: PgServerStoreOptions,
): PgServerStores {
  const jobs = PgJobs.opening(pool, opts.replica, {
    // How long a job's owner may stop renewing before the job is interrupted.
    leaseS:
      opts.jobLeaseS ?? ("postgres" in config.storage ? config.storage.postgres.job_lease_s : 30),
    onError: opts.onJobError,
  });
  const http = config.http;
  const reports = new PgReports(pool);
  const consoleSessions = new PgConsoleSessions(pool);
  return {
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
    consoleSessions,
    outputs: new PgOutputs(pool, {
      maxBytes: config.inference.outputs_max_bytes,
      replica: opts.replica,
    }),
    async close() {
      consoleSessions.close();
      await jobs.close();
      await reports.close();
    },
  };
}

/**
 * The gate's counters of one replica (the policy stores' part of limits): the budget, calls in
 * flight, the per-principal rate limit. Apart from openPgServerStores, so a replica opens each
 * once (a second PgJobs of the same replica would sweep this run's own jobs).
 */
export interface PgLimits {
  /** SHARED: the budget lines, every replica's holds and overruns (BudgetLedger). */
  budget: PgBudget;
  /** SHARED store, settled per replica: the calls this replica admitted and has not charged. */
  calls: PgCallsInFlight;
  /** SHARED: calls per minute per principal. */
  rateLimiter: PgRateLimit;
  /** Stops this replica's renewals; the pool stays open (its owner's). */
  close(): void;
}

/** The gate's counters of one replica, its previous run's budget holds dropped. */
export async function openPgLimits(
  pool: PgPool,
  config: Pick<ServerConfig, "policy">,
  opts: { replica: string },
): Promise<PgLimits> {
  const { limits } = config.policy;
  const budget = await PgBudget.open(pool, {
    limitS: limits.budget.device_seconds_per_window,
    windowS: limits.budget.window_s,
    replica: opts.replica,
  });
  const calls = new PgCallsInFlight(pool, opts.replica);
  return {
    budget,
    calls,
    rateLimiter: new PgRateLimit(pool, "principal", limits.rate_limit.per_principal_per_minute),
    close() {
      budget.close();
      calls.close();
    },
  };
}
