// globalSetup for the Postgres suite: Debian's PostgreSQL server and HAProxy must be there. CI
// runs as root, so they are installed with apt-get when missing (as the browser suite installs
// chromium);
// elsewhere the error says what to run. The package's own cluster is not used: each test file
// starts its own in a temporary folder (test/helpers/postgres.ts).
import { spawnSync } from "node:child_process";
import { scaled } from "../helpers/calibrate.js";
import { postgresBin } from "../helpers/postgres.js";
import { haproxyBin } from "../helpers/replicas.js";

function apt(args: string[]) {
  const r = spawnSync("apt-get", args, {
    stdio: ["ignore", "inherit", "inherit"],
    env: { ...process.env, DEBIAN_FRONTEND: "noninteractive" },
    timeout: scaled(900_000),
  });
  return r.status === 0;
}

/** Installs a Debian package with apt-get as root (updating the lists once if it fails). */
function install(pkg: string, present: () => boolean): void {
  if (present()) return;
  if (process.getuid?.() !== 0)
    throw new Error(
      `the Postgres tests need Debian's ${pkg}: run \`sudo apt-get install -y ${pkg}\``,
    );
  process.stderr.write(`[postgres] installing ${pkg} with apt-get…\n`);
  if (!apt(["install", "-y", "--no-install-recommends", pkg])) {
    apt(["update"]);
    if (!apt(["install", "-y", "--no-install-recommends", pkg]))
      throw new Error(`apt-get install ${pkg} failed; install it by hand and rerun`);
  }
  if (!present()) throw new Error(`${pkg} is still missing after apt-get install`);
}

export default function setup(): void {
  install("postgresql", () => postgresBin() !== null);
  // The replicas' load balancer (test/postgres/replicas.test.ts).
  install("haproxy", () => haproxyBin() !== null);
}
