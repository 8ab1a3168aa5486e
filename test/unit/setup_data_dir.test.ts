// `npm start` and `npm test` run the set-up first; it used to leave `.data` 0755 (Python's default
// for the model files), and the server then warned on every start that others could read its
// data folder. The real set-up script, on this clone: the folder comes out 0700.
import { execFile } from "node:child_process";
import { chmodSync, statSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import { ROOT } from "../helpers/server.js";
import { scaled } from "../helpers/calibrate.js";

const run = promisify(execFile);

describe.skipIf(process.platform === "win32")("set-up", () => {
  it(
    "leaves the data folder private (0700), also one an earlier set-up left readable",
    { timeout: scaled(300_000) },
    async () => {
      const data = join(ROOT, ".data");
      chmodSync(data, 0o755);
      const r = await run(process.execPath, [join(ROOT, "scripts/setup.mjs")], {
        cwd: ROOT,
        timeout: scaled(300_000),
      });
      expect(r.stderr).toMatch(/ready/);
      expect((statSync(data).mode & 0o777).toString(8)).toBe("700");
    },
  );
});
