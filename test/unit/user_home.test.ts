// checkUserHome seen by a user other than root (the tests run as root, so `me` is passed): what a
// real install looks like is accepted — a machine-wide folder of root's that the server only
// reads (examples/deploy/Containerfile), a venv whose python links to the system's — and a link
// to a file someone else can write is refused. The refusals through the CLI are in
// test/hardening/per_user_folder.test.ts.
import {
  chmodSync,
  chownSync,
  mkdirSync,
  mkdtempSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { layoutOf } from "../../server/config/install_layout.js";
import { checkUserHome } from "../../server/setup/user_home.js";

const USER = 10001; // the container image's server user
const scratch = mkdtempSync(join(tmpdir(), "tpu-mcp-userhome-"));
chmodSync(scratch, 0o755);
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

let n = 0;
/** A package layout whose home is a fresh folder with venv/bin, as `owner` made it. */
function home(owner: number): { layout: ReturnType<typeof layoutOf>; dir: string } {
  const dir = join(scratch, `home${++n}`);
  mkdirSync(join(dir, "venv", "bin"), { recursive: true, mode: 0o755 });
  for (const d of [dir, join(dir, "venv"), join(dir, "venv", "bin")]) {
    chmodSync(d, 0o755);
    chownSync(d, owner, owner);
  }
  return { layout: layoutOf("package", "/nonexistent", { home: dir }), dir };
}

describe.skipIf(process.getuid?.() !== 0)("checkUserHome for a user other than root", () => {
  it("accepts root's read-only machine-wide folder (the container image)", () => {
    const { layout, dir } = home(0);
    writeFileSync(join(dir, "venv", "bin", "python"), "", { mode: 0o755 });
    writeFileSync(join(dir, "setup.json"), "{}", { mode: 0o644 });
    expect(checkUserHome(layout, USER)).toBeNull();
  });

  it("accepts the user's own folder whose python links to the system's", () => {
    const { layout, dir } = home(USER);
    symlinkSync("/bin/sh", join(dir, "venv", "bin", "python"));
    expect(checkUserHome(layout, USER)).toBeNull();
  });

  it("refuses a python that links to a file others can write", () => {
    const { layout, dir } = home(USER);
    const target = join(scratch, `planted${n}`);
    writeFileSync(target, "", { mode: 0o777 });
    chmodSync(target, 0o777);
    symlinkSync(target, join(dir, "venv", "bin", "python"));
    expect(checkUserHome(layout, USER)?.message).toMatch(/venv\/bin\/python links to .* mode 777/);
  });

  it("refuses a folder of a third user", () => {
    const { layout } = home(65534);
    expect(checkUserHome(layout, USER)?.why).toMatch(/owned by uid 65534, not by this user/);
  });
});
