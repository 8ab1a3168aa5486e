// A command run by a user who cannot reach the data dir: the deployment in which the server runs
// as its own user (docs/security.md, "Run the server as its own user"). Its tokens, approvals,
// passkeys and audit key are the server's, and only its user decides with them from a shell; the
// refusal says so, instead of a bare EACCES or an empty list that looks like "nothing here yet".
import { accessSync, constants, statSync } from "node:fs";

const DENIED = new Set(["EACCES", "EPERM"]);

/** Whether `e` is the operating system refusing access to a file. */
export function isAccessDenied(e: unknown): boolean {
  return DENIED.has((e as NodeJS.ErrnoException)?.code ?? "");
}

/** The message for a command refused at `dir` (the data dir) by the operating system. */
export function accessRefusal(dir: string, command: string): string {
  let owner = "another user";
  try {
    owner = `another user (uid ${statSync(dir).uid})`;
  } catch {
    // The folder's parent may be closed too: the owner stays unnamed.
  }
  return (
    `permission denied: the data dir ${dir} belongs to ${owner}; its tokens, approvals, passkeys and audit trail are the server's. ` +
    `Run the command as the server's user (e.g. sudo -u tpu-mcp tpu-mcp ${command} … --config FILE); ` +
    "approvals are decided in the operator console (docs/security.md, 'Run the server as its own user')."
  );
}

/**
 * Null when this process may enter and read `dir` (or it does not exist yet: the command makes
 * or reports it as before); else the refusal to print.
 */
export function checkDataDirAccess(dir: string, command: string): string | null {
  try {
    accessSync(dir, constants.R_OK | constants.X_OK);
    return null;
  } catch (e) {
    return isAccessDenied(e) ? accessRefusal(dir, command) : null;
  }
}
