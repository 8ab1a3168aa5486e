// A replica process for the jobs test: opens its jobs on the shared store, starts one job that
// runs until cancelled, prints its id, and keeps renewing its lease until it is killed.
import { openPool } from "../../server/stores/pg/pool.js";
import { PgJobs } from "../../server/app/postgres/jobs.js";

const [url, replica, leaseS] = process.argv.slice(2);
const pool = openPool(url!, { max: 2, application: `tpu-mcp-${replica}` });
const jobs = await PgJobs.open(pool, replica!, { leaseS: Number(leaseS) });
const job = await jobs.start(
  "run_benchmark",
  "alice",
  (signal) =>
    new Promise((_, reject) => signal.addEventListener("abort", () => reject(signal.reason))),
);
process.stdout.write(`${job.job_id}\n`);
setInterval(() => {}, 1000);
