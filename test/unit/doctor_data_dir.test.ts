// `tpu-mcp doctor` says who can reach the data dir (issue 21, item 5): writable by other users
// (a problem), owned by the user running the doctor (an agent running as that user can approve:
// said, with what to do), or another user's (the deployment that keeps agents out).
import { chmodSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { dataDirSituation, describeDataDir } from "../../server/doctor/data_dir.js";

const root = mkdtempSync(join(tmpdir(), "tpu-mcp-doctor-dir-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));
const posix = process.platform !== "win32";
const me = process.getuid?.() ?? null;

function dirWithMode(name: string, mode: number): string {
  const dir = join(root, name);
  const made = mkdtempSync(dir);
  chmodSync(made, mode);
  return made;
}

describe.skipIf(!posix)("the doctor's data dir situation", () => {
  it("reports a data dir other users may write as a problem, with the fix", () => {
    for (const mode of [0o777, 0o770, 0o702]) {
      const dir = dirWithMode("shared-", mode);
      const s = dataDirSituation(dir, me);
      expect(s.kind, mode.toString(8)).toBe("writable-by-others");
      const d = describeDataDir(s);
      expect(d.level).toBe("bad");
      expect(d.text).toContain(`chmod 700 ${dir}`);
    }
  });

  it("warns that a data dir of the doctor's own user lets an agent of that user approve", () => {
    const dir = dirWithMode("own-", 0o700);
    const s = dataDirSituation(dir, me);
    expect(s.kind).toBe("own-user");
    const d = describeDataDir(s);
    expect(d.level).toBe("warn");
    expect(d.text).toMatch(/owned by you/);
    expect(d.text).toMatch(/agent .* can read the tokens/);
    expect(d.text).toMatch(/run the server as its own user/);
    expect(d.text).toContain("examples/deploy/tpu-mcp.service");
  });

  it("is content when the data dir belongs to another user", () => {
    const dir = dirWithMode("other-", 0o700);
    // Seen by a user other than its owner (the test's own user owns it).
    const other = (me ?? 0) + 4242;
    const s = dataDirSituation(dir, other);
    expect(s).toMatchObject({ kind: "other-user", uid: me, root: false });
    const d = describeDataDir(s);
    expect(d.level).toBe("ok");
    expect(d.text).toMatch(/belongs to another user/);
    // Root can read any folder: the doctor says so rather than promising too much.
    const asRoot = dataDirSituation(dir, 0);
    if (me !== 0) expect(describeDataDir(asRoot).text).toMatch(/you are root/);
  });

  it("says a missing data dir is made private by the server", () => {
    const s = dataDirSituation(join(root, "not-yet"), me);
    expect(s.kind).toBe("missing");
    expect(describeDataDir(s)).toMatchObject({ level: "ok", text: expect.stringMatching(/0700/) });
  });
});
