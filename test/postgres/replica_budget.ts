// A replica process for the budget test: holds `need` s of `key`'s budget on the shared store,
// prints whether it did, and keeps renewing its lease until it is killed.
import { PgBudget } from "../../server/app/postgres/budget.js";
import { openPool } from "../../server/stores/pg/pool.js";

const [url, replica, leaseS, key, need] = process.argv.slice(2);
const pool = openPool(url!, { max: 2, application: `tpu-mcp-${replica}` });
const budget = await PgBudget.open(pool, {
  limitS: 10,
  windowS: 3600,
  replica: replica!,
  leaseS: Number(leaseS),
  renewMs: (Number(leaseS) * 1000) / 4,
});
const got = await budget.admit([{ key: key!, need: Number(need) }]);
process.stdout.write(`${got.ok ? "held" : "refused"}\n`);
setInterval(() => {}, 1000);
