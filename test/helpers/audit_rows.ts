// The audit trail as a test reads it: every record of a data dir's policy.db, with its seq, in
// order (read-only; the server may be running).
import { join } from "node:path";
import Database from "better-sqlite3";

export function auditRows(dataDir: string): Array<Record<string, any>> {
  const db = new Database(join(dataDir, "policy.db"), { readonly: true, fileMustExist: true });
  try {
    return (db.prepare("SELECT seq, record FROM audit_log ORDER BY seq").all() as any[]).map(
      (r) => ({
        seq: r.seq,
        ...JSON.parse(r.record),
      }),
    );
  } finally {
    db.close();
  }
}
