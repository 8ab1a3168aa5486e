// The shared audit trail as the operator's read commands open it (`tpu-mcp audit tail | head |
// verify | export` on storage.postgres, through server/app/storage.ts readAuditTrail): a small
// pool of its own, a schema that must be this code's (never migrated from here), the audit key
// the replicas chain with, read and never made, and the passkeys signed decisions are checked
// against. Nothing is written: no chain is started, no refusal window swept.
import type { Logger } from "pino";
import type { AuditTrail } from "../../../policies/audit.js";
import type { CredentialLookup } from "../../../policies/passkeys/verify_trail.js";
import { PgAuditTrail } from "../../stores/audit/postgres.js";
import { readSharedAuditKey } from "./keys.js";
import { PgPasskeys } from "../../stores/passkeys/postgres.js";
import { openPool, redactError } from "../../stores/pg/pool.js";
import { checkSchema } from "./schema.js";

export async function openPgAuditReader(
  url: string,
  opts: { keyFile?: string; logger?: Logger },
): Promise<{ audit: AuditTrail; passkeys: CredentialLookup; close(): Promise<void> }> {
  const pool = openPool(url, { max: 2, application: "tpu-mcp audit" });
  try {
    await checkSchema(pool);
    const key = await readSharedAuditKey(pool, opts.keyFile);
    // refusalWindowMs 0: a reader never sweeps the replicas' refusal windows.
    const audit = await PgAuditTrail.open(pool, {
      replica: "tpu-mcp audit",
      key,
      logger: opts.logger,
      refusalWindowMs: 0,
    });
    return {
      audit,
      passkeys: new PgPasskeys(pool),
      async close() {
        await audit.close();
        await pool.end();
      },
    };
  } catch (e) {
    await pool.end().catch(() => {});
    throw redactError(e, url);
  }
}
