// Who can reach the data dir, as the doctor reports it. The data dir holds what decides approvals
// (the generated operator token, the approvals store, the audit trail and its key), so its owner
// is the boundary: a process of that user — a coding agent with a shell run by the same person
// included — can read a token there and approve. Three situations, from the doctor's own user:
// others may write it (refused by the server), it is this user's (approvals are only as strong
// as this user's processes are trusted), or it is another user's (the deployment of
// docs/security.md, "Run the server as its own user").
import { statSync } from "node:fs";

export type DataDirSituation =
  | { kind: "missing"; dir: string }
  | { kind: "writable-by-others"; dir: string; mode: string; uid: number }
  | { kind: "own-user"; dir: string; mode: string; uid: number }
  | { kind: "other-user"; dir: string; mode: string; uid: number | null; root: boolean };

const octal = (mode: number) => (mode & 0o777).toString(8).padStart(3, "0");

/**
 * The situation of `dir` seen by the user `me` (process.getuid() where there is one; null on
 * Windows, where ACLs decide and the owner is not compared).
 */
export function dataDirSituation(dir: string, me: number | null): DataDirSituation {
  let st;
  try {
    st = statSync(dir);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    // A folder this user may not even look into belongs to someone else: the good case.
    if (code === "EACCES" || code === "EPERM")
      return { kind: "other-user", dir, mode: "?", uid: null, root: false };
    return { kind: "missing", dir };
  }
  const mode = octal(st.mode);
  if (st.mode & 0o022) return { kind: "writable-by-others", dir, mode, uid: st.uid };
  if (me === null || st.uid === me) return { kind: "own-user", dir, mode, uid: st.uid };
  return { kind: "other-user", dir, mode, uid: st.uid, root: me === 0 };
}

/** One line for the doctor: ok, a warning (said, not a failure), or a problem. */
export function describeDataDir(s: DataDirSituation): {
  level: "ok" | "warn" | "bad";
  text: string;
} {
  switch (s.kind) {
    case "missing":
      return {
        level: "ok",
        text: `data dir ${s.dir} does not exist yet (the server makes it 0700, owned by the user that runs it)`,
      };
    case "writable-by-others":
      return {
        level: "bad",
        text: `data dir ${s.dir} is writable by other users (mode ${s.mode}): any of them can replace approvals, the audit trail or a token, and the server refuses to start. Run: chmod 700 ${s.dir}`,
      };
    case "own-user":
      return {
        level: "warn",
        text:
          `data dir ${s.dir} is owned by you, the user running the doctor (mode ${s.mode}). ` +
          "The server runs as you: any process of yours, a coding agent with a shell included, can read the tokens there (operator-token approves), run `tpu-mcp approvals approve`, and write the database. " +
          "Approvals then hold only against agents without a shell or file access. To keep agents out, run the server as its own user (examples/deploy/tpu-mcp.service or the Containerfile; docs/security.md, 'Run the server as its own user').",
      };
    case "other-user":
      return {
        level: "ok",
        text:
          `data dir ${s.dir} belongs to another user (uid ${s.uid ?? "?"}, mode ${s.mode}): your processes, and an agent running as you, cannot read its tokens or write its database` +
          (s.root ? " (you are root: root still can)" : ""),
      };
  }
}
