// globalSetup for the Postgres suite: Debian's PostgreSQL server must be there. CI runs as root,
// so it is installed with apt-get when missing (as the browser suite installs chromium);
// elsewhere the error says what to run. The package's own cluster is not used: each test file
// starts its own in a temporary folder (test/helpers/postgres.ts).
import { spawnSync } from "node:child_process";
import { scaled } from "../helpers/calibrate.js";
import { postgresBin } from "../helpers/postgres.js";

function apt(args: string[]) {
  const r = spawnSync("apt-get", args, {
    stdio: ["ignore", "inherit", "inherit"],
    env: { ...process.env, DEBIAN_FRONTEND: "noninteractive" },
    timeout: scaled(900_000),
  });
  return r.status === 0;
}

export default function setup(): void {
  if (postgresBin()) return;
  if (process.getuid?.() !== 0)
    throw new Error(
      "the Postgres tests need Debian's PostgreSQL: run `sudo apt-get install -y postgresql`",
    );
  process.stderr.write("[postgres] installing postgresql with apt-get…\n");
  if (!apt(["install", "-y", "--no-install-recommends", "postgresql"])) {
    apt(["update"]);
    if (!apt(["install", "-y", "--no-install-recommends", "postgresql"]))
      throw new Error("apt-get install postgresql failed; install it by hand and rerun");
  }
  if (!postgresBin()) throw new Error("PostgreSQL is still missing after apt-get install");
}
