// The audit chain's secret: 32 random bytes in a file of its own (0600), outside the database, so
// that whoever can write the SQLite file still cannot recompute the chain. The key id (a prefix
// of its sha256) names the key in the trail without revealing it.

import { createHash, randomBytes } from "node:crypto";
import { chmodSync, mkdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { dirname } from "node:path";

export interface AuditKey {
  /** First 16 hex digits of sha256(key): names the key in records and head exports. */
  id: string;
  key: Buffer;
  created_at: string;
  path: string;
}

export class AuditKeyError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "AuditKeyError";
  }
}

export function auditKeyId(key: Buffer): string {
  return createHash("sha256").update(key).digest("hex").slice(0, 16);
}

/** A key that lives only in this process (tests, in-memory stores): nothing anchors the trail. */
export function ephemeralAuditKey(): AuditKey {
  const key = randomBytes(32);
  return { id: auditKeyId(key), key, created_at: new Date().toISOString(), path: "(memory)" };
}

/** Reads the key file; null when it does not exist. Refuses a file others may read or write. */
export function readAuditKey(path: string): AuditKey | null {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return null;
    throw new AuditKeyError(
      `cannot read the audit key ${path}: ${(e as NodeJS.ErrnoException).code ?? e}`,
    );
  }
  const mode = statSync(path).mode & 0o777;
  if (process.platform !== "win32" && (mode & 0o077) !== 0) {
    throw new AuditKeyError(
      `the audit key ${path} is accessible to other users (mode ${mode.toString(8)}); run: chmod 600 ${path}`,
    );
  }
  // Whoever may write its folder may replace the key (and, with the database, rewrite the trail
  // under a key of their own); a sticky folder (/tmp) lets no one replace another's file.
  const folder = statSync(dirname(path)).mode;
  if (process.platform !== "win32" && (folder & 0o022) !== 0 && (folder & 0o1000) === 0) {
    throw new AuditKeyError(
      `the audit key's folder ${dirname(path)} is writable by other users (mode ${(folder & 0o777).toString(8)}); run: chmod go-w ${dirname(path)}`,
    );
  }
  let parsed: { key?: unknown; created_at?: unknown };
  try {
    parsed = JSON.parse(text);
  } catch {
    throw new AuditKeyError(`the audit key ${path} is not valid JSON; restore it from a backup`);
  }
  if (typeof parsed.key !== "string" || !/^[0-9a-f]{64}$/.test(parsed.key)) {
    throw new AuditKeyError(`the audit key ${path} has no 64-hex-digit "key"; restore it`);
  }
  const key = Buffer.from(parsed.key, "hex");
  return {
    id: auditKeyId(key),
    key,
    created_at: typeof parsed.created_at === "string" ? parsed.created_at : "unknown",
    path,
  };
}

/**
 * The key at `path`, made (0600, exclusively: two processes starting at once agree on one key)
 * when there is none. `created` says whether this call made it.
 */
export function loadOrCreateAuditKey(path: string): { key: AuditKey; created: boolean } {
  const existing = readAuditKey(path);
  if (existing) return { key: existing, created: false };
  mkdirSync(dirname(path), { recursive: true, mode: 0o700 });
  const key = randomBytes(32);
  const created_at = new Date().toISOString();
  const body =
    JSON.stringify({
      version: 1,
      key_id: auditKeyId(key),
      created_at,
      key: key.toString("hex"),
      note: "HMAC key of the tpu-mcp audit chain. Keep it apart from the database; losing it makes the trail unverifiable.",
    }) + "\n";
  try {
    writeFileSync(path, body, { mode: 0o600, flag: "wx" });
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "EEXIST") {
      const other = readAuditKey(path);
      if (other) return { key: other, created: false };
    }
    throw new AuditKeyError(
      `cannot create the audit key ${path}: ${(e as NodeJS.ErrnoException).code ?? e}`,
    );
  }
  chmodSync(path, 0o600); // the umask may have narrowed nothing, but never widened
  return { key: { id: auditKeyId(key), key, created_at, path }, created: true };
}
