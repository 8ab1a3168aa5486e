// A replica process for the lapsed-calls test: admits one call (its calls_in_flight row, as the
// gate writes it), prints "running", and stamps it alive until it is killed.
import { HEARTBEAT_MS } from "../../policies/calls_in_flight.js";
import { PgCallsInFlight } from "../../server/app/postgres/calls.js";
import { openPool } from "../../server/stores/pg/pool.js";

const [url, replica, leaseS, principal] = process.argv.slice(2);
const pool = openPool(url!, { max: 2, application: `tpu-mcp-${replica}` });
const calls = new PgCallsInFlight(pool, replica!, HEARTBEAT_MS, Number(leaseS) * 1000);
const call = calls.begin({
  principal: principal!,
  tool: "run_benchmark",
  args_digest: "digest-of-the-args",
  args: { model: "tiny-mlp" },
  estimate: { device_seconds: 2, memory_bytes: 1e6, compile_s: 0, weight_bytes: 0, fits: true },
});
await call.write();
process.stdout.write("running\n");
setInterval(() => {}, 1000);
