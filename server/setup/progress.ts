// The set-up's progress file (<home>/setup.json): written by `tpu-mcp setup` as it goes, read by
// a server that waits for it (background.ts) and shown by get_runtime_status. One JSON object,
// replaced atomically, so a reader never sees half of it.
import { mkdirSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { dirname } from "node:path";
import type { SetupProgress } from "../../tools/types.js";

export type { SetupProgress };

/** What the file holds: the progress plus what identifies the set-up that wrote it. */
export interface SetupRecord extends SetupProgress {
  /** The inputs it set up (requirement files, catalog, package version): done means done for these. */
  digest: string;
  pid: number;
  updated_at: string;
}

export function readSetupRecord(file: string): SetupRecord | null {
  try {
    const r = JSON.parse(readFileSync(file, "utf8")) as SetupRecord;
    return r && typeof r.state === "string" && typeof r.percent === "number" ? r : null;
  } catch {
    return null;
  }
}

export function writeSetupRecord(file: string, record: SetupRecord): void {
  mkdirSync(dirname(file), { recursive: true });
  const tmp = `${file}.${process.pid}.tmp`;
  writeFileSync(tmp, JSON.stringify(record) + "\n");
  renameSync(tmp, file);
}

/** Is a process with this pid alive (a set-up that died leaves "running" behind)? */
export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM";
  }
}
