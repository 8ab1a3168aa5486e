// `npm test` in a clone other users cannot reach (a private home, a `mktemp -d` parent) failed on
// the suites that start the server as another OS user: that user could not read the clone's CLI.
// They now skip with the reason instead; where the clone is reachable (CI) they run.
import { chmodSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { osUsersUnavailable } from "../helpers/os_user.js";
import { ROOT } from "../helpers/server.js";

// Only where the OS-user suites could run at all (Linux, root, useradd): elsewhere they skip anyway.
const here = osUsersUnavailable(ROOT);
const canSwitch = here === null || /cannot (enter|read)/.test(here);

describe.skipIf(!canSwitch)("the OS-user suites in a clone other users cannot reach", () => {
  const parent = mkdtempSync(join(tmpdir(), "tpu-mcp-private-"));
  afterAll(() => rmSync(parent, { recursive: true, force: true }));

  it("skip with the folder that closes it, and run where the clone is reachable", () => {
    const clone = join(parent, "tpu-mcp");
    mkdirSync(join(clone, "bin"), { recursive: true });
    writeFileSync(join(clone, "bin", "tpu-mcp.js"), "", { mode: 0o644 });
    chmodSync(parent, 0o700);
    expect(osUsersUnavailable(clone)).toMatch(
      new RegExp(
        `inside ${parent.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}, which other users cannot enter \\(mode 700\\)`,
      ),
    );
    chmodSync(parent, 0o755);
    chmodSync(clone, 0o755);
    expect(osUsersUnavailable(clone)).toBeNull();
  });
});
